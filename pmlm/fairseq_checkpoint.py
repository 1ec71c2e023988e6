"""``pmlm import``: a checkpoint of the released PMLM code (microsoft/Mu-Protein ``pmlm/``, run on fairseq 0.10.2)
as a pmlm encoder artefact (``model.safetensors`` + ``model.json``), without fairseq and without running pickled code.

What such a file holds (tests/data/released/README.md cites the lines): fairseq 0.10.2's ``save_state`` writes
``{"args": argparse.Namespace, "model": state dict, "optimizer_history": [...], "extra_state": {...}}`` (plus
``last_optimizer_state`` unless ``--no-save-optimizer-state``), after ``utils.move_to_cpu``, which turns every
dict into a plain dict and fp16 tensors into fp32. Its pickle therefore names only ``argparse.Namespace`` and
torch's tensor machinery (``_rebuild_tensor_v2``, storages, the ``OrderedDict`` of backward hooks); that is the
allow-list (``ALLOWED_GLOBALS``, with torch's own defaults of ``weights_only``). Anything else, e.g. a
``__reduce__`` that would call ``os.system``, is refused with its name and nothing is executed.

The architecture comes from ``args``: the released models (``prot_pmlm`` and ``prot_mlm``) build fairseq's
``TransformerSentenceEncoder`` from exactly the keys read in ``released_model`` (pmlm.py l.234-251, mlm.py
l.226-243), with no embedding scale, post-LN layers and no final LayerNorm, ``encoder_normalize_before`` as a
LayerNorm on the embeddings, and sinusoidal positions numbered from ``padding_idx + 1`` (``model.positions:
fairseq``). The 27-symbol dictionary is mapped onto ``pmlm.alphabet`` ids row by row for the embedding, the token
head (its 20 residue rows: our softmax is over residues, the released one over all 27 symbols) and the pair head
(released label ``t_j * 27 + t_i`` for the features of (i, j), ours ``27 * id_i + id_j``).

Tensors are read from a memory map of the zip archive and written one at a time
(``artefacts.write_encoder_tensors``), so the peak memory stays near the file's size.
"""

from __future__ import annotations

import argparse
import pickle
import re
import zipfile
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import torch

from pmlm import alphabet
from pmlm.artefacts import write_encoder_tensors
from pmlm.errors import ConfigError, InputError
from pmlm.files import file_digest
from pmlm.model.config import ModelConfig, PairVocab
from pmlm.model.objectives import ObjectiveConfig
from pmlm.pretrained import ENCODER_FILE, build_model
from pmlm.version import versions
from pmlm.vocabulary import MLM, PMLM

CHECKPOINT_STARTS = (b"PK\x03\x04", b"\x80")  # a zip archive's magic, a pickle's PROTO opcode
# what the pickle may name beyond torch's weights_only defaults (tensors, storages, OrderedDict, dtypes)
ALLOWED_GLOBALS = [argparse.Namespace]

# the released dictionary: fairseq's four specials, pmlm/src/protein/dict.txt in its order, then the task's <mask>
FAIRSEQ_SYMBOLS = ("<s>", "<pad>", "</s>", "<unk>", *"ARNDCQEGHILKMFPSTWYVX-", "<mask>")
_FAIRSEQ_NAME = {
    alphabet.CLS: "<s>",
    alphabet.PAD: "<pad>",
    alphabet.EOS: "</s>",
    alphabet.UNK: "<unk>",
    alphabet.MASK: "<mask>",
}  # residue letters, X and the gap are the same symbol in both
# pair-class slot k of ours (token id k < 26, the gap at 26) -> its row in the released dictionary
FAIRSEQ_ROW = [
    FAIRSEQ_SYMBOLS.index(_FAIRSEQ_NAME.get(name, name))
    for name in (*alphabet.TOKENS[: alphabet.FULL_PAIR_SIDE - 1], alphabet.GAP)
]

# the released code's registered architectures (models/pmlm.py l.402-512, models/mlm.py l.360-450)
PMLM_SIZES = ("", "_base", "_small", "_tiny", "_large", "_xl", "_xlw", "_1b", "_1bw", "_xbase", "_finetune")
PMLM_ARCHS = tuple(f"prot_pmlm{size}" for size in PMLM_SIZES)
MLM_ARCHS = tuple(f"prot_mlm{size}" for size in ("", "_base", "_small", "_large", "_xl", "_1b", "_xbase", "_finetune"))
# --pretrain-task of the prot_pmlm task (tasks/pmlm.py l.83) -> our objective; "pmlm" trains the pair head alone
# without the diagonal, which leaves the token head untrained and has no objective of ours
PRETRAIN_TASKS = {"pcomb": PMLM, "mlm": MLM}
ACTIVATIONS = ("relu", "gelu")

# tensors the import leaves out, and why (recorded in model.json)
DROPPED = {
    "encoder.sentence_encoder.embed_positions._float_tensor": "a device/dtype marker of the sinusoidal table",
    "encoder.sentence_encoder.segment_embeddings.weight": "segment embeddings; the released tasks pass no "
    "segment labels, so they are never added",
    "encoder.masked_lm_pooler.weight": "the pooler of the first token, unused by the pre-training losses",
    "encoder.masked_lm_pooler.bias": "the pooler of the first token, unused by the pre-training losses",
    "encoder.sentence_projection_layer.weight": "the sentence-level head of --sent-loss, no counterpart here",
}
PAIR_HEAD_KEYS = (
    "encoder.plm_head_transform_weight.weight",
    "encoder.plm_head_transform_weight.bias",
    "encoder.p_layer_norm.weight",
    "encoder.p_layer_norm.bias",
    "encoder.pair_out.weight",
    "encoder.pair_out.bias",
)
LAYER_KEYS = {  # fairseq's TransformerSentenceEncoderLayer -> our EncoderLayer (q, k, v are joined into qkv)
    "self_attn.out_proj": "attn.proj",
    "self_attn_layer_norm": "attn_norm",
    "fc1": "ffn_in",
    "fc2": "ffn_out",
    "final_layer_norm": "ffn_norm",
}


def load_checkpoint(path: Path) -> dict:
    """The unpickled checkpoint: tensors memory-mapped from a zip archive, only allow-listed globals built."""
    mmap = zipfile.is_zipfile(path)  # torch >= 1.6 archives; a legacy (pre-1.6) file is read whole
    if not is_checkpoint_file(path):  # torch's answer to other files is advice to unpickle them unchecked
        raise InputError(path, "not a torch checkpoint (neither a zip archive nor a pickle)")
    try:
        with torch.serialization.safe_globals(ALLOWED_GLOBALS):
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as exc:
        found = re.search(r"GLOBAL ([\w.]+)", str(exc))  # torch names the first global it would not build
        if found:
            raise InputError(
                path,
                f"refused: the pickle names {found.group(1)}, which is not on the allow-list "
                "of a fairseq checkpoint (argparse.Namespace, torch tensors); nothing was "
                "run",
            ) from None
        # never torch's message, which advises weights_only=False: that would run the file's code
        raise InputError(path, "not a fairseq checkpoint: its pickle holds more than tensors and settings") from None
    except (RuntimeError, EOFError, OSError, ValueError, KeyError, IndexError, zipfile.BadZipFile) as exc:
        raise InputError(path, f"truncated or not a torch checkpoint ({_first_line(exc)})") from None
    if not isinstance(state, dict):
        raise InputError(path, f"not a fairseq checkpoint: the pickle holds a {type(state).__name__}, not a dict")
    return state


def is_checkpoint_file(path: str | Path) -> bool:
    """Whether ``path`` starts as a torch checkpoint does: a zip archive (torch >= 1.6; a cut one too) or a pickle."""
    with open(path, "rb") as fh:
        return fh.read(len(CHECKPOINT_STARTS[0])).startswith(CHECKPOINT_STARTS)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


def _arg(args: argparse.Namespace, key: str, path: Path, kind: type | tuple[type, ...]):
    if not hasattr(args, key):
        raise InputError(path, f"args.{key} is missing; the released models need it to describe the network")
    value = getattr(args, key)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise InputError(path, f"args.{key} = {value!r} is not a {getattr(kind, '__name__', kind)}")
    return value


def released_model(state: dict, path: Path) -> tuple[ModelConfig, ObjectiveConfig, dict]:
    """(model config, objective, what the file says of itself) from a checkpoint's ``args``; a key we cannot
    represent is an error naming it, never a silently different model."""
    args = state.get("args")
    if not isinstance(args, argparse.Namespace):
        if "cfg" in state:
            raise InputError(
                path,
                "a later fairseq's checkpoint ('cfg', no 'args'); the released code writes "
                "fairseq 0.10.2's layout with an 'args' Namespace",
            )
        raise InputError(
            path,
            "not a fairseq checkpoint: no 'args' Namespace (top-level keys: "
            f"{', '.join(map(str, list(state)[:8])) or 'none'})",
        )
    arch = _arg(args, "arch", path, str)
    if arch in PMLM_ARCHS:
        family = "prot_pmlm"
        task = getattr(args, "pretrain_task", "pcomb")  # the task's default (tasks/pmlm.py l.83)
        if task not in PRETRAIN_TASKS:
            raise InputError(
                path,
                f"args.pretrain_task = {task!r}: the pair loss alone without the diagonal leaves "
                f"the token head untrained and has no pmlm objective (supported: "
                f"{', '.join(PRETRAIN_TASKS)})",
            )
        objective = PRETRAIN_TASKS[task]
    elif arch in MLM_ARCHS:
        family, task, objective = "prot_mlm", None, MLM
    else:
        raise InputError(
            path,
            f"args.arch = {arch!r} is not an architecture of the released PMLM code "
            f"(prot_pmlm_* or prot_mlm_*, e.g. prot_pmlm_1b); nothing else can be imported",
        )
    for key in ("encoder_learned_pos", "no_token_positional_embeddings"):
        if _arg(args, key, path, bool):
            raise InputError(path, f"args.{key} is set: only fixed sinusoidal positions are representable")
    activation = _arg(args, "activation_fn", path, str)
    if activation not in ACTIVATIONS:
        raise InputError(path, f"args.activation_fn = {activation!r}: representable are {', '.join(ACTIVATIONS)}")
    max_positions = getattr(args, "max_positions", None) or _arg(args, "tokens_per_sample", path, int)
    if not isinstance(max_positions, int) or isinstance(max_positions, bool):
        raise InputError(path, f"args.max_positions = {max_positions!r} is not an int")
    try:
        model_cfg = ModelConfig(
            num_layers=_arg(args, "encoder_layers", path, int),
            hidden=_arg(args, "encoder_embed_dim", path, int),
            ffn=_arg(args, "encoder_ffn_embed_dim", path, int),
            heads=_arg(args, "encoder_attention_heads", path, int),
            max_len=max_positions,
            norm="post",
            embedding_norm=_arg(args, "encoder_normalize_before", path, bool),
            activation=activation,
            dropout=float(_arg(args, "dropout", path, (int, float))),
            attention_dropout=float(_arg(args, "attention_dropout", path, (int, float))),
            activation_dropout=float(_arg(args, "act_dropout", path, (int, float))),
            pair_vocab=PairVocab.FULL,
            positions="fairseq",
        )
        mask_prob = float(getattr(args, "mask_prob", 0.15))
        random_prob = float(getattr(args, "random_token_prob", 0.1))
        kept_prob = float(getattr(args, "leave_unmasked_prob", 0.1))
        objective_cfg = ObjectiveConfig(
            name=objective,
            mask_prob=mask_prob,
            random_token_prob=random_prob,
            mask_token_prob=1.0 - random_prob - kept_prob,
        )
    except ConfigError as exc:  # a value we cannot represent
        raise InputError(path, f"args describe no representable model: {exc}") from None
    history = state.get("optimizer_history") or [{}]
    updates = history[-1].get("num_updates") if isinstance(history[-1], dict) else None
    described = {
        "arch": arch,
        "model": family,
        "task": getattr(args, "task", None),
        "criterion": getattr(args, "criterion", None),
        "pretrain_task": task,
        "share_encoder_input_output_embed": _arg(args, "share_encoder_input_output_embed", path, bool),
        "num_updates": updates,
    }
    return model_cfg, objective_cfg, described


def tensor_plan(
    weights: dict, cfg: ModelConfig, objective: ObjectiveConfig, shared_embedding: bool, path: Path
) -> tuple[dict[str, tuple[tuple[int, ...], Callable[[], torch.Tensor]]], dict[str, str]]:
    """Our parameter name -> (shape, producer) from the released state dict, and the released tensors left out
    (name -> why). Every released tensor is either used or listed; any other is an error naming it."""
    used: set[str] = set()

    def get(key: str) -> torch.Tensor:
        if key not in weights:
            raise InputError(path, f"tensor {key} is missing from the checkpoint's model")
        value = weights[key]
        if not isinstance(value, torch.Tensor) or not value.is_floating_point():
            raise InputError(path, f"{key} is not a floating-point tensor")
        used.add(key)
        return value

    def f32(t: torch.Tensor) -> torch.Tensor:
        return t.to(torch.float32)

    pre = "encoder.sentence_encoder."
    embed = get(pre + "embed_tokens.weight")
    if embed.shape[0] != len(FAIRSEQ_SYMBOLS):
        raise InputError(
            path,
            f"{pre}embed_tokens.weight has {embed.shape[0]} rows; the released dictionary has "
            f"{len(FAIRSEQ_SYMBOLS)} ({' '.join(FAIRSEQ_SYMBOLS)})",
        )
    token_rows = FAIRSEQ_ROW[: alphabet.FULL_PAIR_SIDE - 1]  # our token ids 0..25 (the gap is no token of ours)

    def embedding() -> torch.Tensor:
        table = torch.zeros(alphabet.VOCAB_SIZE, cfg.hidden)  # rows past <mask> pad the vocabulary, never used
        table[: len(token_rows)] = f32(embed[token_rows])
        return table

    plan: dict[str, tuple[tuple[int, ...], Callable[[], torch.Tensor]]] = {
        "encoder.embed.weight": ((alphabet.VOCAB_SIZE, cfg.hidden), embedding)
    }

    def copy(ours: str, theirs: str) -> None:
        tensor = get(theirs)
        plan[ours] = (tuple(tensor.shape), lambda: f32(tensor))

    if cfg.embedding_norm:
        for p in ("weight", "bias"):
            copy(f"encoder.embed_norm.{p}", f"{pre}emb_layer_norm.{p}")
    for i in range(cfg.num_layers):
        theirs, ours = f"{pre}layers.{i}.", f"encoder.layers.{i}."
        for p in ("weight", "bias"):
            parts = [get(f"{theirs}self_attn.{x}_proj.{p}") for x in "qkv"]
            plan[f"{ours}attn.qkv.{p}"] = (
                (3 * parts[0].shape[0], *parts[0].shape[1:]),
                lambda parts=parts: f32(torch.cat(parts)),
            )
            for a, b in LAYER_KEYS.items():
                copy(f"{ours}{b}.{p}", f"{theirs}{a}.{p}")
    # every objective PRETRAIN_TASKS admits trains the token head
    copy("token_head.dense.weight", "encoder.lm_head_transform_weight.weight")
    copy("token_head.dense.bias", "encoder.lm_head_transform_weight.bias")
    copy("token_head.norm.weight", "encoder.layer_norm.weight")
    copy("token_head.norm.bias", "encoder.layer_norm.bias")
    out = embed if shared_embedding else get("encoder.embed_out.weight")
    bias = get("encoder.lm_output_learned_bias")
    residues = FAIRSEQ_ROW[alphabet.FIRST_RESIDUE_ID : alphabet.FIRST_RESIDUE_ID + alphabet.NUM_RESIDUES]
    plan["token_head.out.weight"] = ((alphabet.NUM_RESIDUES, cfg.hidden), lambda: f32(out[residues]))
    plan["token_head.out.bias"] = ((alphabet.NUM_RESIDUES,), lambda: f32(bias[residues]))
    if objective.kind.pair_head:
        copy("pair_head.dense.weight", "encoder.plm_head_transform_weight.weight")
        copy("pair_head.dense.bias", "encoder.plm_head_transform_weight.bias")
        copy("pair_head.norm.weight", "encoder.p_layer_norm.weight")
        copy("pair_head.norm.bias", "encoder.p_layer_norm.bias")
        side = alphabet.FULL_PAIR_SIDE
        # our class side * a + b (a = token of i, b = token of j) is the released class side * t_j + t_i
        rows = [side * FAIRSEQ_ROW[b] + FAIRSEQ_ROW[a] for a in range(side) for b in range(side)]
        pair_w, pair_b = get("encoder.pair_out.weight"), get("encoder.pair_out.bias")
        if pair_w.shape[0] != side * side:
            raise InputError(
                path,
                f"encoder.pair_out.weight has {pair_w.shape[0]} rows, not the released "
                f"dictionary squared ({side * side})",
            )
        plan["pair_head.out.weight"] = ((side * side, 2 * cfg.hidden), lambda: f32(pair_w[rows]))
        plan["pair_head.out.bias"] = ((side * side,), lambda: f32(pair_b[rows]))

    dropped = {k: why for k, why in DROPPED.items() if k in weights}
    if not objective.kind.pair_head:
        dropped.update(
            {
                k: "the pair head of a run trained with --pretrain-task mlm (untrained)"
                for k in PAIR_HEAD_KEYS
                if k in weights
            }
        )
    unknown = sorted(set(weights) - used - set(dropped))
    if unknown:
        raise InputError(
            path,
            f"tensor {unknown[0]} has no counterpart in a released prot_pmlm / prot_mlm model "
            f"({len(unknown)} such tensors)",
        )
    return plan, dropped


def import_checkpoint(ckpt: str | Path, out_dir: str | Path, expect_objective: str | None = None) -> Path:
    """Write ``out_dir/model.safetensors`` + ``model.json`` from a released checkpoint; returns the weights path.
    ``expect_objective``: the objective the caller takes the checkpoint to have (an error if it has another)."""
    ckpt = Path(ckpt)
    if not ckpt.is_file():
        raise InputError(ckpt, "no such checkpoint file")
    state = load_checkpoint(ckpt)
    model_cfg, objective, described = released_model(state, ckpt)
    if expect_objective is not None and objective.name != expect_objective:
        raise InputError(
            ckpt,
            f"a {described['arch']} model trained with objective {objective.name}, not {expect_objective} as expected",
        )
    weights = state.get("model")
    if not isinstance(weights, dict):
        raise InputError(ckpt, "the checkpoint has no 'model' state dict")
    plan, dropped = tensor_plan(weights, model_cfg, objective, described["share_encoder_input_output_embed"], ckpt)
    # the names and shapes our model has, checked before anything is written
    with torch.device("meta"):
        expected = {k: tuple(v.shape) for k, v in build_model(model_cfg, objective).state_dict().items()}
    planned = {k: shape for k, (shape, _) in plan.items()}
    for key in sorted(set(expected) | set(planned)):
        if expected.get(key) != planned.get(key):
            raise InputError(
                ckpt,
                f"{key}: the checkpoint gives shape {planned.get(key)}, the model in args needs {expected.get(key)}",
            )
    source = {
        "file": ckpt.name,
        "sha256": file_digest(ckpt),
        "size": ckpt.stat().st_size,
        "fairseq_dictionary": list(FAIRSEQ_SYMBOLS),
        **described,
        "dropped": dropped,
    }
    info = {
        "model": model_cfg.to_dict(),
        "objective": asdict(objective),
        "step": described["num_updates"],
        "final_scores": {"step": described["num_updates"], "split": None, "objective": objective.name},
        "source": source,
        "versions": versions(),
    }
    weights_path = Path(out_dir) / ENCODER_FILE
    write_encoder_tensors(weights_path, plan, info)
    return weights_path
