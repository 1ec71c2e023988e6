"""``pmlm export``: a pmlm encoder as a folder ``transformers`` loads offline, and the way back (``pmlm import DIR``).

Two layouts, chosen from the encoder's layers (``HfLayout.of``): ``roberta``, a stock ``RobertaForMaskedLM`` where
it computes exactly what ours does (the released MLM family), and ``pmlm``, our own class
(pmlm/hf_remote/modeling_pmlm.py, copied into the folder, loaded with ``trust_remote_code=True``) for every other
encoder. What each holds, why the stock one is exact, the tokenizer and ``config.json``'s ``pmlm`` section:
docs/huggingface.md, "Export".

``encoder_state`` maps such a folder's tensors back onto our names, and refuses tensors that the export derives
(position table, token types, the decoder's non-residue rows) when they differ from what it would write: such a
folder was changed after export (e.g. fine-tuned), and is no longer our encoder.
"""

from __future__ import annotations

import json
import os
import shutil
import string
from pathlib import Path

import torch
from safetensors.torch import save_file

from pmlm import alphabet
from pmlm.adapters import merge
from pmlm.choices import Choice
from pmlm.errors import InputError
from pmlm.files import file_digest
from pmlm.model.config import ModelConfig
from pmlm.model.encoder import position_table
from pmlm.outputs import folder_target, writing_folder
from pmlm.pretrained import ENCODER_FILE, adapter_record, is_esm, load_encoder
from pmlm.version import __version__


class HfLayout(Choice):
    """The ``transformers`` layout of an exported folder (config.json's ``pmlm.layout``)."""

    ROBERTA = "roberta"
    PMLM = "pmlm"  # pmlm's tensor names, and a class of its own shipped in the folder (pmlm/hf_remote)
    ESM = "esm"  # an ESM encoder's own folder, a LoRA run merged in

    @property
    def own_names(self) -> bool:
        return self is HfLayout.PMLM

    @classmethod
    def of(cls, cfg: ModelConfig) -> HfLayout:
        """``roberta`` where RoBERTa computes what the encoder does (module docstring), else ``pmlm``."""
        stock = not cfg.norm.final and cfg.embedding_norm and cfg.activation == "gelu" and cfg.token_head
        stock = stock and cfg.activation_dropout == 0.0 and not (cfg.pair_head or cfg.triple_head)
        return cls.ROBERTA if stock else cls.PMLM


EXPORT_COMMAND = "pmlm export"  # the writer of the folders it writes (pmlm.outputs)
# the config.json section that carries model.json's provenance and settings (read back by pmlm import)
PROVENANCE_SECTION = "pmlm"
LAYOUT_CLASSES = {
    HfLayout.ROBERTA: "RobertaForMaskedLM",
    HfLayout.PMLM: "PmlmForMaskedLM, trust_remote_code=True",
    HfLayout.ESM: "EsmForMaskedLM",
}
REMOTE_MODULE = "modeling_pmlm.py"
REMOTE_SOURCE = Path(__file__).with_name("hf_remote") / REMOTE_MODULE
ROBERTA_POSITION_OFFSET = alphabet.PAD_ID + 1  # RoBERTa's position of the token at index 0
TOKENIZER_JSON = "tokenizer.json"
RESIDUE_IDS = slice(alphabet.FIRST_RESIDUE_ID, alphabet.FIRST_RESIDUE_ID + alphabet.NUM_RESIDUES)
# our layer's parameters -> RoBERTa's (q, k, v are handled apart: thirds of attn.qkv)
ROBERTA_LAYER = {
    "attn.proj": "attention.output.dense",
    "attn_norm": "attention.output.LayerNorm",
    "ffn_in": "intermediate.dense",
    "ffn_out": "output.dense",
    "ffn_norm": "output.LayerNorm",
}
ROBERTA_HEAD = {"token_head.dense": "lm_head.dense", "token_head.norm": "lm_head.layer_norm"}
ROBERTA_EMBEDDINGS = "roberta.embeddings."


def roberta_positions(cfg: ModelConfig) -> torch.Tensor:
    """RoBERTa's position table holding ours: (max_len + 2, C), row t + 2 = our row t, rows 0 and 1 zero."""
    table = torch.zeros(cfg.max_len + ROBERTA_POSITION_OFFSET, cfg.hidden)
    table[ROBERTA_POSITION_OFFSET:] = position_table(cfg)
    return table


def vocabulary_rows(rows: torch.Tensor, fill: float) -> torch.Tensor:
    """(20, ...) residue rows -> (VOCAB_SIZE, ...) rows over token ids, ``fill`` at tokens that are not residues."""
    out = torch.full((alphabet.VOCAB_SIZE, *rows.shape[1:]), fill, dtype=rows.dtype)
    out[RESIDUE_IDS] = rows
    return out


def roberta_tensors(state: dict, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Our encoder's tensors under ``RobertaForMaskedLM``'s names."""
    C = cfg.hidden
    out = {
        f"{ROBERTA_EMBEDDINGS}word_embeddings.weight": state["encoder.embed.weight"],
        f"{ROBERTA_EMBEDDINGS}position_embeddings.weight": roberta_positions(cfg),
        f"{ROBERTA_EMBEDDINGS}token_type_embeddings.weight": torch.zeros(1, C),
        f"{ROBERTA_EMBEDDINGS}LayerNorm.weight": state["encoder.embed_norm.weight"],
        f"{ROBERTA_EMBEDDINGS}LayerNorm.bias": state["encoder.embed_norm.bias"],
    }
    for i in range(cfg.num_layers):
        ours, theirs = f"encoder.layers.{i}.", f"roberta.encoder.layer.{i}."
        for p in ("weight", "bias"):
            for name, block in zip(("query", "key", "value"), state[f"{ours}attn.qkv.{p}"].split(C)):
                out[f"{theirs}attention.self.{name}.{p}"] = block
            for a, b in ROBERTA_LAYER.items():
                out[f"{theirs}{b}.{p}"] = state[f"{ours}{a}.{p}"]
    for p in ("weight", "bias"):
        for a, b in ROBERTA_HEAD.items():
            out[f"{b}.{p}"] = state[f"{a}.{p}"]
    out["lm_head.decoder.weight"] = vocabulary_rows(state["token_head.out.weight"], 0.0)
    out["lm_head.bias"] = vocabulary_rows(state["token_head.out.bias"], float("-inf"))
    out["lm_head.decoder.bias"] = out["lm_head.bias"]
    return {k: v.detach().to(torch.float32).contiguous().clone() for k, v in out.items()}


def roberta_config(cfg: ModelConfig) -> dict:
    return {
        "architectures": ["RobertaForMaskedLM"],
        "model_type": "roberta",
        "vocab_size": alphabet.VOCAB_SIZE,
        "hidden_size": cfg.hidden,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.heads,
        "intermediate_size": cfg.ffn,
        "hidden_act": "gelu",
        "hidden_dropout_prob": cfg.dropout,
        "attention_probs_dropout_prob": cfg.attention_dropout,
        "max_position_embeddings": cfg.max_len + ROBERTA_POSITION_OFFSET,
        "type_vocab_size": 1,
        "layer_norm_eps": 1e-5,
        "initializer_range": 0.02,
        "pad_token_id": alphabet.PAD_ID,
        "bos_token_id": alphabet.CLS_ID,
        "eos_token_id": alphabet.EOS_ID,
        "tie_word_embeddings": False,
        "is_decoder": False,
        "add_cross_attention": False,
        "dtype": "float32",
    }


def pmlm_tensors(state: dict, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Our tensors under our names, plus the position table (the remote class stores it)."""
    out = {**state, "encoder.positions": position_table(cfg)}
    return {k: v.detach().to(torch.float32).contiguous().clone() for k, v in out.items()}


def pmlm_config(cfg: ModelConfig) -> dict:
    module = REMOTE_MODULE.removesuffix(".py")
    return {
        "architectures": ["PmlmForMaskedLM"],
        "model_type": "pmlm",
        "auto_map": {
            "AutoConfig": f"{module}.PmlmConfig",
            "AutoModel": f"{module}.PmlmForMaskedLM",
            "AutoModelForMaskedLM": f"{module}.PmlmForMaskedLM",
        },
        "vocab_size": alphabet.VOCAB_SIZE,
        "hidden_size": cfg.hidden,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.heads,
        "intermediate_size": cfg.ffn,
        "max_position_embeddings": cfg.max_len,
        "norm": cfg.norm,
        "embedding_norm": cfg.embedding_norm,
        "hidden_act": cfg.activation,
        "hidden_dropout_prob": cfg.dropout,
        "attention_probs_dropout_prob": cfg.attention_dropout,
        "activation_dropout": cfg.activation_dropout,
        "layer_norm_eps": 1e-5,
        "pad_token_id": alphabet.PAD_ID,
        "bos_token_id": alphabet.CLS_ID,
        "eos_token_id": alphabet.EOS_ID,
        "first_residue_id": alphabet.FIRST_RESIDUE_ID,
        "num_residues": alphabet.NUM_RESIDUES,
        "token_head": cfg.token_head,
        "pair_head": cfg.pair_head,
        "pair_classes": cfg.pair_classes,
        "pair_unary": cfg.pair_unary,
        "product_base": cfg.product_base,
        "triple_head": cfg.triple_head,
        "triple_rank": cfg.triple_rank,
        "triple_width": cfg.triple_hidden,
        "tie_word_embeddings": False,
        "dtype": "float32",
    }


def _special(token: str) -> dict:
    return {"SpecialToken": {"id": token, "type_id": 0}}


def tokenizer_json() -> dict:
    """``tokenizer.json`` of a fast tokenizer over our vocabulary that gives one token per residue letter (the
    ``tokenizers`` format, written here so that ``pmlm export`` needs neither ``tokenizers`` nor ``transformers``).

    Each character is one token: whitespace is dropped, lowercase letters are read as uppercase and the letters
    outside the alphabet (B, J, O, U, Z) as X, as ``pmlm embed --unknown x`` reads them (X is the unknown residue
    the model was trained with; ``<unk>`` it never saw); any other character (``*``, ``-``, a digit) is one
    ``<unk>``. Specials written in the text (``<mask>``) are tokens before any of that. ``<cls>`` and ``<eos>``
    enclose each sequence."""
    unknown_letters = "".join(
        c for c in string.ascii_uppercase if c not in alphabet.RESIDUES + alphabet.UNKNOWN_RESIDUE
    )
    normalizers = [{"type": "Replace", "pattern": {"Regex": r"\s"}, "content": ""}]
    normalizers += [{"type": "Replace", "pattern": {"String": c.lower()}, "content": c} for c in string.ascii_uppercase]
    normalizers.append(
        {"type": "Replace", "pattern": {"Regex": f"[{unknown_letters}]"}, "content": alphabet.UNKNOWN_RESIDUE}
    )
    specials = [t for t in alphabet.TOKENS if t.startswith("<")]
    added = [
        {
            "id": alphabet.TOKEN_TO_ID[t],
            "content": t,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for t in specials
    ]
    ends = {t: {"id": t, "ids": [alphabet.TOKEN_TO_ID[t]], "tokens": [t]} for t in (alphabet.CLS, alphabet.EOS)}
    sequence = [{"Sequence": {"id": "A", "type_id": 0}}]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "Sequence", "normalizers": normalizers},
        "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "."}, "behavior": "Isolated", "invert": False},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [_special(alphabet.CLS), *sequence, _special(alphabet.EOS)],
            "pair": [
                _special(alphabet.CLS),
                *sequence,
                _special(alphabet.EOS),
                {"Sequence": {"id": "B", "type_id": 0}},
                _special(alphabet.EOS),
            ],
            "special_tokens": ends,
        },
        "decoder": {"type": "Fuse"},
        "model": {"type": "WordLevel", "vocab": dict(alphabet.TOKEN_TO_ID), "unk_token": alphabet.UNK},
    }


def tokenizer_files(max_len: int) -> dict[str, str]:
    """The tokenizer of an exported folder (file name -> text): ``tokenizer.json`` (:func:`tokenizer_json`) with the
    config ``AutoTokenizer`` reads it by (``PreTrainedTokenizerFast``, no remote code), our specials, and the inputs
    our models take (no token types)."""
    specials = {
        "cls_token": alphabet.CLS,
        "pad_token": alphabet.PAD,
        "eos_token": alphabet.EOS,
        "unk_token": alphabet.UNK,
        "mask_token": alphabet.MASK,
    }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": max_len,
        "model_input_names": ["input_ids", "attention_mask"],
        "padding_side": "right",
        **specials,
    }
    return {
        TOKENIZER_JSON: json.dumps(tokenizer_json(), indent=1) + "\n",
        "tokenizer_config.json": json.dumps(config, indent=2) + "\n",
        "special_tokens_map.json": json.dumps(specials, indent=2) + "\n",
    }


def export_encoder(
    encoder: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    overwrite: bool = False,
    adapter: str | os.PathLike | None = None,
) -> tuple[Path, HfLayout]:
    """Write the folder of ``encoder`` (model.safetensors or its folder) as ``out_dir``, a folder target of
    ``pmlm export`` (pmlm.outputs; ``overwrite`` as ``--overwrite``); (folder, layout). ``adapter``: a fine-tuned
    run whose adapters are merged into the weights first (pmlm.adapters.merge): a plain encoder that
    computes what the adapted one does."""
    folder_target(out_dir, command=EXPORT_COMMAND, overwrite=overwrite)
    model, info, weights = load_encoder(encoder, adapter=adapter)
    if is_esm(info):
        if adapter is None:
            raise InputError(weights, "an ESM encoder is a transformers folder already (the folder holding it)")
        # transformers is needed for ESM encoders only (the optional `hf` extra), as in pmlm.pretrained.load_encoder
        from pmlm.hf_esm import save_merged

        provenance = {"encoder_file": weights.name, "encoder_sha256": file_digest(weights), **adapter_record(adapter)}
        provenance["exported_by"] = f"pmlm {__version__}"
        return save_merged(merge(model), weights, out_dir, overwrite, provenance, EXPORT_COMMAND), HfLayout.ESM
    if adapter is not None:
        merge(model)
    cfg = model.cfg
    kind = HfLayout.of(cfg)
    to_tensors, to_config = (pmlm_tensors, pmlm_config) if kind.own_names else (roberta_tensors, roberta_config)
    tensors, config = to_tensors(model.state_dict(), cfg), to_config(cfg)
    config[PROVENANCE_SECTION] = {
        "layout": kind,
        "model": cfg.to_dict(),
        "objective": info["objective"],
        "step": info.get("step"),
        "final_scores": info.get("final_scores"),
        "source": info.get("source"),
        "encoder_file": weights.name,
        "encoder_sha256": file_digest(weights),
        **adapter_record(adapter),  # merged into the weights
        "exported_by": f"pmlm {__version__}",
    }
    with writing_folder(out_dir, command=EXPORT_COMMAND, overwrite=overwrite) as staged:
        save_file(tensors, staged / ENCODER_FILE, metadata={"format": "pt"})
        (staged / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        for name, text in tokenizer_files(cfg.max_len).items():
            (staged / name).write_text(text)
        if kind.own_names:
            shutil.copyfile(REMOTE_SOURCE, staged / REMOTE_MODULE)
    return Path(out_dir), kind


# -- the way back --------------------------------------------------------------------------------------------


def _check_derived(tensors: dict, name: str, expected: torch.Tensor, where: Path) -> None:
    found = tensors.get(name)
    if found is None or found.shape != expected.shape or not torch.equal(found.float(), expected):
        raise InputError(where, f"{name} is not what pmlm export writes (changed after export?); not a pmlm encoder")


def encoder_state(tensors: dict, cfg: ModelConfig, kind: HfLayout, where: Path) -> dict[str, torch.Tensor]:
    """A folder's tensors (``export_encoder``'s layout ``kind``) under our names; the tensors the export derives
    must be exactly what it writes."""
    if kind.own_names:
        _check_derived(tensors, "encoder.positions", position_table(cfg), where)
        return {k: v for k, v in tensors.items() if k != "encoder.positions"}
    _check_derived(tensors, f"{ROBERTA_EMBEDDINGS}position_embeddings.weight", roberta_positions(cfg), where)
    _check_derived(tensors, f"{ROBERTA_EMBEDDINGS}token_type_embeddings.weight", torch.zeros(1, cfg.hidden), where)
    decoder, bias = tensors.get("lm_head.decoder.weight"), tensors.get("lm_head.bias")
    if decoder is None or bias is None:
        raise InputError(where, "lm_head.decoder.weight or lm_head.bias is missing; not a pmlm encoder")
    _check_derived(tensors, "lm_head.decoder.weight", vocabulary_rows(decoder[RESIDUE_IDS], 0.0), where)
    _check_derived(tensors, "lm_head.bias", vocabulary_rows(bias[RESIDUE_IDS], float("-inf")), where)
    state = {
        "encoder.embed.weight": tensors[f"{ROBERTA_EMBEDDINGS}word_embeddings.weight"],
        "encoder.embed_norm.weight": tensors[f"{ROBERTA_EMBEDDINGS}LayerNorm.weight"],
        "encoder.embed_norm.bias": tensors[f"{ROBERTA_EMBEDDINGS}LayerNorm.bias"],
        "token_head.out.weight": decoder[RESIDUE_IDS],
        "token_head.out.bias": bias[RESIDUE_IDS],
    }
    for i in range(cfg.num_layers):
        ours, theirs = f"encoder.layers.{i}.", f"roberta.encoder.layer.{i}."
        for p in ("weight", "bias"):
            blocks = [tensors.get(f"{theirs}attention.self.{name}.{p}") for name in ("query", "key", "value")]
            if any(b is None for b in blocks):
                raise InputError(where, f"{theirs}attention.self.*.{p} is missing; not a pmlm encoder")
            state[f"{ours}attn.qkv.{p}"] = torch.cat(blocks)
            for a, b in ROBERTA_LAYER.items():
                state[f"{ours}{a}.{p}"] = tensors.get(f"{theirs}{b}.{p}")
    for p in ("weight", "bias"):
        for a, b in ROBERTA_HEAD.items():
            state[f"{a}.{p}"] = tensors.get(f"{b}.{p}")
    missing = sorted(k for k, v in state.items() if v is None)
    if missing:
        raise InputError(where, f"the tensor for {missing[0]} is missing; not a pmlm encoder")
    return state


def described_model(section: dict, where: Path) -> dict:
    """The model.json sections a folder's ``pmlm`` section records (model, objective, step, source)."""
    if not isinstance(section, dict) or section.get("layout") not in (HfLayout.ROBERTA, HfLayout.PMLM):
        raise InputError(where, "config.json's pmlm section has no layout roberta / pmlm (not written by pmlm export)")
    for key in ("model", "objective"):
        if not isinstance(section.get(key), dict):
            raise InputError(where, f"config.json's pmlm section has no {key!r} (not written by pmlm export)")
    return {"model": section["model"], "objective": section["objective"], "step": section.get("step")}
