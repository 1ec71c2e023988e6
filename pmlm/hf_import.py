"""``pmlm import FOLDER`` / ``pmlm import OWNER/NAME``: a ``transformers`` model folder (or a hub id, where the
machine has network) as a pmlm encoder artefact in ``-o DIR``. Two kinds are read, by config.json:

* an ESM model (``model_type: esm``: ESM-2, also ESM-1b / ESM-1v; not ESMFold): ``DIR`` becomes the model's own
  ``transformers`` folder (``save_pretrained``: config.json, model.safetensors in fp32, the tokenizer) plus
  ``model.json`` (``model.architecture: esm``, the MLM objective it was trained with, the source's name and
  sha256); pmlm.hf_esm runs it;
* a folder written by ``pmlm export`` (its config.json carries a ``pmlm`` section): its tensors mapped back onto our
  names (pmlm.hf_export.encoder_state), so ``DIR`` holds the exported encoder tensor for tensor.

Anything else is refused in one line, before anything is written (docs/huggingface.md, "Import").

``import_source`` is ``pmlm import``'s one entry, for these and for released checkpoints (pmlm.fairseq_checkpoint):
``DIR`` is a folder of its own (pmlm.outputs), checked before anything is read and written through a staging folder,
and a file that is no checkpoint is refused saying what it is (a FASTA file, ...), never with torch's advice.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict
from pathlib import Path

from pmlm.artefacts import ENCODER_FORMAT, read_weights, write_encoder
from pmlm.errors import InputError
from pmlm.fairseq_checkpoint import import_checkpoint, is_checkpoint_file
from pmlm.files import file_digest
from pmlm.hf_export import PROVENANCE_SECTION, HfLayout, described_model, encoder_state
from pmlm.model.objectives import ObjectiveConfig
from pmlm.outputs import folder_target, writing_folder
from pmlm.pretrained import ENCODER_FILE, ESM, encoder_configs, encoder_from_state
from pmlm.version import versions
from pmlm.vocabulary import MLM

IMPORT_COMMAND = "pmlm import"  # the writer of the folders it writes (pmlm.outputs)
CONFIG_FILE = "config.json"
# what each first bytes of a file that is no checkpoint make it, for the refusal
FILE_KINDS = ((b">", "a FASTA file"), (b"\x1f\x8b", "a gzip file"), (b"{", "a JSON file"))
ESM_MODEL_TYPE = "esm"  # config.json's model_type of transformers' ESM models
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
# the weights a transformers folder may hold, in the order from_pretrained prefers them
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)


def is_transformers_source(source: str) -> bool:
    """Whether ``pmlm import`` reads ``source`` as a transformers model: a folder, or a hub id that is no file."""
    path = Path(source)
    return path.is_dir() or (not path.exists() and HUB_ID.fullmatch(source) is not None)


def import_source(
    source: str,
    out_dir: str | Path,
    expect_objective: str | None = None,
    revision: str | None = None,
    *,
    overwrite: bool = False,
) -> Path:
    """``pmlm import SOURCE -o DIR``: a transformers folder or hub id (``import_transformers``) or a released
    checkpoint (pmlm.fairseq_checkpoint) as the encoder folder ``out_dir``, a folder target of ``pmlm import``
    (pmlm.outputs: checked before anything is read, the files appearing when all are written; ``overwrite`` as
    ``--overwrite``). A file that is neither is refused saying what it is. Returns the weights' path."""
    folder_target(out_dir, command=IMPORT_COMMAND, overwrite=overwrite)
    transformers_source = is_transformers_source(source)
    if not transformers_source:
        _check_checkpoint_file(Path(source))
    with writing_folder(out_dir, command=IMPORT_COMMAND, overwrite=overwrite) as staged:
        if transformers_source:
            import_transformers(source, staged, expect_objective, revision)
        else:
            import_checkpoint(Path(source), staged, expect_objective)
    return Path(out_dir) / ENCODER_FILE


def _check_checkpoint_file(path: Path) -> None:
    if not path.is_file():
        raise InputError(path, "no such checkpoint file")
    if is_checkpoint_file(path):
        return
    with open(path, "rb") as fh:
        head = fh.read(64)
    kind = next((k for magic, k in FILE_KINDS if head.startswith(magic)), None)
    kind = kind or ("an empty file" if not head else "a text file" if head.isascii() else "a binary file")
    raise InputError(
        path,
        f"{kind}, not a fairseq checkpoint (.pt) nor a transformers model folder; pmlm import reads a released "
        "checkpoint (e.g. pmlm_650m.pt), a transformers ESM folder or hub id, or a folder written by pmlm export",
    )


def read_config(folder: Path) -> dict:
    """``folder/config.json``; a missing or unreadable one says the folder is not a model."""
    path = folder / CONFIG_FILE
    if not path.is_file():
        raise InputError(folder, "not a transformers model folder (no config.json)")
    try:
        config = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(path, f"not valid JSON ({exc})") from None
    if not isinstance(config, dict):
        raise InputError(path, "not a transformers config (expected a JSON object)")
    return config


def import_transformers(
    source: str, out_dir: str | Path, expect_objective: str | None = None, revision: str | None = None
) -> Path:
    """Write the encoder artefact of ``source`` (a folder, or a hub id) into ``out_dir``; the weights' path."""
    folder = Path(source)
    if not folder.is_dir():
        if not HUB_ID.fullmatch(source):
            raise InputError(source, "no such folder, and not a hub id (OWNER/NAME)")
        return import_esm(source, out_dir, expect_objective, revision)
    config = read_config(folder)
    if config.get("model_type") == ESM_MODEL_TYPE:
        return import_esm(source, out_dir, expect_objective, revision)
    if PROVENANCE_SECTION in config:
        return import_exported(folder, config, out_dir, expect_objective)
    raise InputError(
        folder / CONFIG_FILE,
        f"unsupported architecture: model_type {config.get('model_type')!r} "
        f"({', '.join(config.get('architectures') or []) or 'no architectures'}); pmlm imports ESM models "
        "(model_type esm) and folders written by pmlm export",
    )


def _check_objective(found: str, expected: str | None, where) -> None:
    if expected is not None and found != expected:
        raise InputError(where, f"a model trained with objective {found}, not {expected} as expected")


def import_esm(source: str, out_dir: str | Path, expect_objective: str | None, revision: str | None) -> Path:
    """An ESM model (a local folder, or a hub id fetched by transformers) as an encoder artefact."""
    # transformers is needed for ESM models only (the optional `hf` extra); the rest of pmlm runs without it
    from transformers import AutoTokenizer

    from pmlm.hf_esm import encoder_model, folder_vocabulary, load_masked_lm

    _check_objective(MLM, expect_objective, source)
    folder = Path(source)
    local = folder.is_dir()
    if local:
        weights = [folder / name for name in WEIGHT_FILES if (folder / name).is_file()]
        if not weights:
            raise InputError(folder, f"no weights ({' or '.join(WEIGHT_FILES[::2])})")
        vocabulary = folder_vocabulary(folder)
        options = {"local_files_only": True}
        origin = {"folder": str(folder.resolve()), "weights": weights[0].name, "sha256": file_digest(weights[0])}
    else:
        options = {"revision": revision}
        try:
            tokenizer = AutoTokenizer.from_pretrained(source, revision=revision)
        except (OSError, ValueError) as exc:  # no such repository, no network, no tokenizer
            first = (str(exc).strip() or type(exc).__name__).splitlines()[0]
            raise InputError(source, f"no such file or folder; as a hub id: {first}") from None
        vocabulary = [t for t, _ in sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])]
        origin = {"hub_id": source, "revision": revision}
    masked_lm = load_masked_lm(source, source, **options)
    config = masked_lm.config
    if config.is_folding_model:
        raise InputError(source, "unsupported architecture: an ESMFold model (pmlm imports ESM language models)")
    model = encoder_model(masked_lm, vocabulary, source)
    if not local:
        origin["commit"] = getattr(config, "_commit_hash", None)
    objective = ObjectiveConfig(name=MLM)
    info = {
        "format": ENCODER_FORMAT,
        "model": {"architecture": ESM, **model.cfg.to_dict()},
        "objective": asdict(objective),
        "step": None,
        "final_scores": {"step": None, "split": None, "objective": MLM},
        "source": {
            "kind": "transformers",
            **origin,
            "model_type": ESM_MODEL_TYPE,
            "architectures": list(config.architectures or []),
            "position_embedding_type": config.position_embedding_type,
            "token_dropout": bool(config.token_dropout),
            "transformers_version": getattr(config, "transformers_version", None),
        },
        "versions": versions(),
    }
    out = Path(out_dir)  # import_source's staging folder, or any folder a caller gives
    out.mkdir(parents=True, exist_ok=True)
    masked_lm.save_pretrained(out)
    (out / "vocab.txt").write_text("".join(f"{token}\n" for token in vocabulary))
    AutoTokenizer.from_pretrained(out).save_pretrained(out)
    (out / "model.json").write_text(json.dumps(info, indent=2) + "\n")
    return out / ENCODER_FILE


def import_exported(folder: Path, config: dict, out_dir: str | Path, expect_objective: str | None) -> Path:
    """A folder written by ``pmlm export`` back as the encoder it was exported from."""
    where = folder / CONFIG_FILE
    section = config[PROVENANCE_SECTION]
    described = described_model(section, where)
    model_cfg, objective = encoder_configs(described, where)
    _check_objective(objective.name, expect_objective, where)
    weights = folder / ENCODER_FILE
    if not weights.is_file():
        raise InputError(weights, "missing: the exported weights")
    state = encoder_state(read_weights(weights), model_cfg, HfLayout(section["layout"]), weights)
    encoder_from_state(model_cfg, objective, state, weights, CONFIG_FILE)  # every tensor present with its shape
    info = {
        **described,
        "final_scores": section.get("final_scores") or {"step": described["step"], "split": None},
        "source": section.get("source"),
        "exported": {
            "folder": str(folder.resolve()),
            "layout": section["layout"],
            "encoder_sha256": section.get("encoder_sha256"),
        },
        "versions": versions(),
    }
    path = Path(out_dir) / ENCODER_FILE
    write_encoder(path, state, {k: v for k, v in info.items() if v is not None or k == "step"})
    return path
