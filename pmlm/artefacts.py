"""The files pmlm hands from one step to the next, each with one writer and one reader.

* encoder: ``model.safetensors`` + ``model.json`` (written by ``pmlm pretrain``): the weights and
  their description (``model`` and ``objective`` settings, step, final scores, precision, versions);
* head: ``head.safetensors`` + ``head.json`` (written by ``pmlm finetune``): the trained weights
  (the head, plus the encoder under full fine-tuning) and the run's config, task, encoder and precision;
* shard manifest: ``manifest.json`` beside the Parquet shards (written by ``pmlm tokenize``).

Each JSON carries a ``format`` field (``pmlm-encoder/3``, ``pmlm-head/1``, ``pmlm-shards/2``); a
reader refuses any other value, or none, with a one-line error. Only tensors (safetensors) and JSON are read, so
loading never runs code from a file.

A head records its encoder's path relative to the head's own folder, so a results folder can be
moved whole.
"""

from __future__ import annotations

import json
import math
import os
import struct
from pathlib import Path

from pmlm.choices import Precision
from pmlm.errors import InputError
from pmlm.files import atomic_output, canonical_sha256, file_digest

ENCODER_FORMAT = "pmlm-encoder/3"
HEAD_FORMAT = "pmlm-head/1"
SHARDS_FORMAT = "pmlm-shards/2"
MANIFEST = "manifest.json"


def sidecar_path(weights: str | os.PathLike) -> Path:
    """``x.safetensors`` -> ``x.json``."""
    return Path(weights).with_suffix(".json")


def recorded_precision(info: dict, weights: str | os.PathLike) -> Precision:
    """The precision, ``fp32`` or ``bf16``, that an encoder's or a head's sidecar ``info`` says its run trained at
    (key ``precision``); a sidecar without one (runs from before it was recorded, imported released, ESM-2 and
    ``transformers`` models) counts as fp32. ``weights`` names the artefact in errors."""
    value = info.get("precision", Precision.FP32.value)
    if value not in (Precision.FP32, Precision.BF16):
        raise InputError(sidecar_path(weights), f"precision {value!r} is neither {Precision.FP32} nor {Precision.BF16}")
    return Precision(value)


# -- weights + sidecar, the layout shared by encoders and heads ----------------------------------------


def save_weights(path: str | os.PathLike, state: dict, info: dict) -> tuple[Path, Path]:
    """``path`` (safetensors of ``state``, name -> tensor) and its ``.json`` sidecar holding ``info`` as given,
    each written atomically."""
    # torch and safetensors load with the weights only: `pmlm tokenize` writes manifests in the data
    # stage's environment, which has neither
    from safetensors.torch import save_file

    path = Path(path)
    sidecar = sidecar_path(path)
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in state.items()}
    with atomic_output(path) as tmp:
        save_file(tensors, tmp, metadata={"format": "pt"})
    with atomic_output(sidecar) as tmp:
        Path(tmp).write_text(json.dumps(info, indent=2) + "\n")
    return path, sidecar


def read_weights(path: str | os.PathLike) -> dict:
    """CPU tensors of a safetensors file; a damaged file is a one-line error naming it."""
    from safetensors import SafetensorError  # with the weights only, as in save_weights
    from safetensors.torch import load_file

    try:
        return load_file(str(path), device="cpu")
    except (SafetensorError, OSError, ValueError) as exc:
        raise InputError(path, f"unreadable weights: {exc}") from None


def _read_sidecar(weights: str | os.PathLike, expected_format: str, written_by: str) -> dict:
    sidecar = sidecar_path(weights)
    try:
        info = json.loads(sidecar.read_text())
    except FileNotFoundError:
        raise InputError(
            sidecar, f"missing: these weights need their .json sidecar (written by {written_by})"
        ) from None
    except json.JSONDecodeError as exc:
        raise InputError(sidecar, f"not valid JSON: {exc.msg}", line=exc.lineno) from None
    except OSError as exc:
        raise InputError(sidecar, f"cannot read: {exc.strerror}") from None
    if not isinstance(info, dict):
        raise InputError(sidecar, f"expected a JSON object (written by {written_by})")
    _check_format(sidecar, info, expected_format)
    return info


def _check_format(path: Path, info: dict, expected: str) -> None:
    found = info.get("format")
    if found != expected:
        what = f"format {found!r} is" if found is not None else "no format field: it is"
        raise InputError(path, f"{what} not the {expected!r} this pmlm reads (written by another pmlm version?)")


# -- the pre-trained encoder ---------------------------------------------------------------------------


def write_encoder(path: str | os.PathLike, state: dict, info: dict) -> tuple[Path, Path]:
    """``info``: ``model`` (ModelConfig dict), ``objective`` (ObjectiveConfig dict) and provenance."""
    return save_weights(path, state, {"format": ENCODER_FORMAT, **info})


def write_encoder_tensors(path: str | os.PathLike, tensors: dict, info: dict) -> tuple[Path, Path]:
    """``write_encoder`` for float32 weights made one at a time: ``tensors`` maps each name to (shape, a function
    returning the tensor). The safetensors layout (8-byte header length, JSON header, the tensors' bytes in order)
    is written as the tensors are made, so the whole state is never in memory at once (``pmlm import``)."""
    path = Path(path)
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, (shape, _) in tensors.items():
        size = 4 * math.prod(shape)
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
    with atomic_output(path) as tmp, open(tmp, "wb") as fh:
        fh.write(struct.pack("<Q", len(text)) + text)
        for name, (shape, make) in tensors.items():
            tensor = make().detach().to("cpu").contiguous()
            if tensor.dtype.itemsize != 4 or not tensor.is_floating_point() or tuple(tensor.shape) != tuple(shape):
                raise ValueError(f"{name}: made {tensor.dtype} {tuple(tensor.shape)}, declared float32 {tuple(shape)}")
            fh.write(tensor.numpy().data)
    sidecar = sidecar_path(path)
    with atomic_output(sidecar) as tmp:
        Path(tmp).write_text(json.dumps({"format": ENCODER_FORMAT, **info}, indent=2) + "\n")
    return path, sidecar


def read_encoder_info(weights: str | os.PathLike) -> dict:
    """The encoder's sidecar, checked to describe a model (``model`` and ``objective`` sections)."""
    info = _read_sidecar(weights, ENCODER_FORMAT, "pmlm pretrain")
    for key in ("model", "objective"):
        if not isinstance(info.get(key), dict):
            raise InputError(sidecar_path(weights), f"incomplete model description (no {key!r} section)")
    return info


# -- the fine-tuned head -------------------------------------------------------------------------------


def write_head(path: str | os.PathLike, state: dict, info: dict, encoder_path: str | os.PathLike) -> tuple[Path, Path]:
    """``info``: ``config`` (FinetuneConfig dict), ``encoder`` (sha256, objective) and provenance;
    the encoder's path is recorded relative to the head's folder."""
    relative = os.path.relpath(Path(encoder_path).absolute(), Path(path).absolute().parent)
    encoder = {"path": relative, **{k: v for k, v in info.get("encoder", {}).items() if k != "path"}}
    return save_weights(path, state, {"format": HEAD_FORMAT, **info, "encoder": encoder})


def read_head_info(head_path: str | os.PathLike) -> dict:
    """The head's sidecar, checked to carry the fine-tuning config and the encoder it was trained on."""
    if not Path(head_path).is_file():
        raise InputError(head_path, "no such head file")
    info = _read_sidecar(head_path, HEAD_FORMAT, "pmlm finetune")
    for key in ("config", "encoder"):
        if key not in info:
            raise InputError(sidecar_path(head_path), f"missing key {key!r} (not written by pmlm finetune)")
    return info


def read_head(head_path: str | os.PathLike) -> tuple[dict, dict]:
    """(sidecar info, CPU weights) of a fine-tuned head."""
    return read_head_info(head_path), read_weights(head_path)


def head_encoder_path(head_path: str | os.PathLike, info: dict, override: str | os.PathLike | None = None) -> Path:
    """The encoder a head was fine-tuned on (``override`` if given), checked by its recorded sha256."""
    # the recorded path is relative to the head's folder (an absolute path stays itself)
    encoder = Path(override) if override is not None else Path(head_path).parent / info["encoder"]["path"]
    if not encoder.is_file():
        raise InputError(encoder, "encoder weights not found (pass --encoder)")
    digest = file_digest(encoder)
    expected = info["encoder"].get("sha256")
    if digest != expected:
        raise InputError(
            sidecar_path(head_path),
            f"the head was fine-tuned on an encoder with sha256 "
            f"{str(expected)[:12]}..., but {encoder} has {digest[:12]}...",
        )
    return encoder


# -- the shard manifest --------------------------------------------------------------------------------


def write_manifest(shards_dir: str | os.PathLike, manifest: dict) -> Path:
    """``manifest.json`` in ``shards_dir``; ``manifest`` carries ``format`` = SHARDS_FORMAT."""
    if manifest.get("format") != SHARDS_FORMAT:
        raise ValueError(f"a shard manifest must carry format {SHARDS_FORMAT!r}")
    path = Path(shards_dir) / MANIFEST
    path.write_text(json.dumps(manifest, indent=2) + "\n")
    return path


def read_manifest(shards_dir: str | os.PathLike) -> dict:
    """The manifest of a shard folder, format-checked, with a ``splits`` mapping."""
    path = Path(shards_dir) / MANIFEST
    if not path.is_file():
        raise InputError(path, "manifest not found; write the shards with `pmlm tokenize` first")
    try:
        manifest = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise InputError(path, f"not valid JSON: {exc.msg}", line=exc.lineno) from None
    except OSError as exc:
        raise InputError(path, f"cannot read shard manifest ({exc.strerror})") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("splits"), dict):
        raise InputError(path, "not a shard manifest (no 'splits' mapping)")
    _check_format(path, manifest, SHARDS_FORMAT)
    return manifest


def manifest_digest(shards_dir: str | os.PathLike) -> str:
    """sha256 of what a shard folder holds: its manifest (which lists every shard's sha256) without ``inputs``,
    the paths of the FASTA files it was made from. The same shards anywhere, however reached, have one digest."""
    manifest = {k: v for k, v in read_manifest(shards_dir).items() if k != "inputs"}
    return canonical_sha256(manifest)
