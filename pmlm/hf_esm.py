"""ESM checkpoints in ``transformers``' format (ESM-2; ESM-1b and ESM-1v folders are read the same way) as pmlm
encoders: ``transformers``' own ``EsmModel`` runs the layers, wrapped so that fine-tuning, evaluation, ``embed``,
``contacts`` (through a fine-tuned head) and ``score`` use it like a ``PMLMModel``. Why a wrapper rather than
converting the weights, and what is exact: docs/huggingface.md, "Import".

The wrapper's interface is the ``PMLMModel`` one that callers read: ``cfg`` (``EsmShape``: layers, width,
window), ``encode``, ``forward`` (``representations``, ``logits``), ``token_head`` (our ``TokenHead`` holding
``EsmLMHead``'s dense, LayerNorm and the 20 residues' rows of its decoder and bias: logits over residues, as for
imported released models), ``pair_head`` / ``triple_head`` None. Token ids stay ours (``pmlm.alphabet``) and are
mapped onto ESM's ids by symbol inside ``encode``. Parameter names start with ``encoder.`` for the trunk and
``token_head.`` for the head, as ``TaskModel`` expects (the trunk trains under full fine-tuning, the head never).

The encoder artefact (``pmlm import``, pmlm.hf_import) is a ``transformers`` folder written by
``save_pretrained`` plus ``model.json`` with ``model.architecture: esm``; loading goes through ``from_pretrained``
(which knows its own files' names across ``transformers`` versions), with missing or mismatched tensors refused in
one line.
"""

from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import transformers
from torch import nn
from transformers import EsmForMaskedLM, EsmTokenizer

from pmlm import alphabet
from pmlm.errors import ConfigError, InputError
from pmlm.model.heads import TokenHead
from pmlm.outputs import writing_folder

CONFIG_FILE = "config.json"
VOCAB_FILE = "vocab.txt"  # EsmTokenizer's vocabulary: one token a line, in id order
# our specials -> ESM's (the same names; listed so a vocabulary that lacks one is refused by name)
REQUIRED_TOKENS = (alphabet.CLS, alphabet.PAD, alphabet.EOS, alphabet.UNK, alphabet.MASK)


@dataclass(frozen=True)
class EsmShape:
    """What callers read of an encoder's ``cfg``: the sizes, the window (max_len counts <cls> and <eos>) and the
    heads carried (a token head, no pair or triple head)."""

    num_layers: int
    hidden: int
    ffn: int
    heads: int
    max_len: int
    token_head: bool = True
    pair_head: bool = False
    triple_head: bool = False

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def of(cls, config) -> EsmShape:
        return cls(
            num_layers=config.num_hidden_layers,
            hidden=config.hidden_size,
            ffn=config.intermediate_size,
            heads=config.num_attention_heads,
            max_len=config.max_position_embeddings,
        )


class EsmTrunk(nn.Module):
    """``transformers``' EsmModel on our token ids: (B, L) -> (B, L, C) after its final LayerNorm.

    ``dropout`` and ``layers`` are the modules whose outputs are the representations after the embedding (token
    dropout included) and after each layer, where ``pmlm embed --layer`` reads them (pmlm.inference.embedding);
    ``attention`` is accepted and ignored (``transformers`` picks its attention kernel)."""

    def __init__(self, esm: nn.Module, token_map: torch.Tensor):
        super().__init__()
        self.esm = esm
        self.attention = "auto"
        self.register_buffer("token_map", token_map, persistent=False)  # (VOCAB_SIZE,) our id -> ESM id

    @property
    def dropout(self) -> nn.Module:
        return self.esm.embeddings

    @property
    def layers(self) -> nn.ModuleList:
        return self.esm.encoder.layer

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        ids = self.token_map[tokens]  # (B, L) ESM ids
        mask = tokens.ne(alphabet.PAD_ID).long()  # (B, L) 1 at real tokens, as the tokenizer's attention_mask
        return self.esm(input_ids=ids, attention_mask=mask).last_hidden_state  # (B, L, C)


class EsmEncoderModel(nn.Module):
    """An ESM checkpoint as a pmlm encoder (module docstring): trunk plus a 20-residue token head."""

    def __init__(self, shape: EsmShape, trunk: EsmTrunk, token_head: TokenHead):
        super().__init__()
        self.cfg = shape
        self.encoder = trunk
        self.token_head = token_head
        self.pair_head = None
        self.triple_head = None

    def encode(self, tokens: torch.Tensor) -> torch.Tensor:
        """Token ids (B, L) -> representations (B, L, C)."""
        return self.encoder(tokens)

    def forward(self, tokens: torch.Tensor, pair_index=None, return_pair_repr: bool = False, **kwargs) -> dict:
        """``representations`` (B, L, C) and ``logits`` (B, L, 20) (or (N, 20) at ``token_positions``); no pairs."""
        if pair_index is not None or kwargs.get("triple_index") is not None:
            raise ConfigError("an ESM encoder has no pair or triple head (pair_index / triple_index)")
        reps = self.encoder(tokens)
        positions = kwargs.get("token_positions")
        logits = self.token_head(reps if positions is None else reps[positions])
        return {
            "representations": reps,
            "logits": logits,
            "pair_logits": None,
            "pair_repr": None,
            "triple_logits": None,
        }

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


@contextlib.contextmanager
def quiet_transformers():
    """``transformers``' load reports and progress bars off (pmlm reports problems itself, in one line)."""
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    try:
        yield
    finally:
        transformers.logging.set_verbosity(verbosity)
        transformers.utils.logging.enable_progress_bar()


def esm_token_map(vocabulary: list[str], where: str | Path) -> torch.Tensor:
    """(VOCAB_SIZE,) ESM id of each of our tokens, by symbol; our vocabulary padding (never produced) -> <unk>."""
    index = {token: i for i, token in enumerate(vocabulary)}
    missing = [t for t in (*REQUIRED_TOKENS, *alphabet.RESIDUES, alphabet.UNKNOWN_RESIDUE) if t not in index]
    if missing:
        raise InputError(where, f"the tokenizer's vocabulary lacks {' '.join(missing)} (not a protein ESM tokenizer)")
    return torch.tensor([index.get(t, index[alphabet.UNK]) for t in alphabet.TOKENS], dtype=torch.long)


def load_masked_lm(source: str | Path, where: str | Path, **kwargs) -> EsmForMaskedLM:
    """``EsmForMaskedLM.from_pretrained(source)`` in fp32, every tensor the config describes present with its shape:
    a missing or mismatched tensor is one line naming ``where`` (``transformers`` would initialise it at random)."""
    try:
        with quiet_transformers():
            model, report = EsmForMaskedLM.from_pretrained(
                source, dtype=torch.float32, output_loading_info=True, ignore_mismatched_sizes=True, **kwargs
            )
    except (OSError, ValueError, RuntimeError) as exc:
        first = (str(exc).strip() or type(exc).__name__).splitlines()[0]
        raise InputError(where, f"transformers cannot read these weights ({first})") from None
    mismatched = sorted(report.get("mismatched_keys") or [])
    if mismatched:
        key, *shapes = mismatched[0] if isinstance(mismatched[0], tuple) else (mismatched[0],)
        detail = f": the file has {tuple(shapes[0])}, the config needs {tuple(shapes[1])}" if len(shapes) == 2 else ""
        raise InputError(where, f"weights do not match config.json ({len(mismatched)} tensors, e.g. {key}{detail})")
    missing = sorted(report.get("missing_keys") or [])
    if missing:
        raise InputError(where, f"weights do not match config.json: {len(missing)} tensors missing, e.g. {missing[0]}")
    return model.eval()


def encoder_model(masked_lm: EsmForMaskedLM, vocabulary: list[str], where: str | Path) -> EsmEncoderModel:
    """The pmlm encoder of a loaded ``EsmForMaskedLM`` and its tokenizer's vocabulary (ids in order)."""
    config = masked_lm.config
    token_map = esm_token_map(vocabulary, where)
    if len(vocabulary) != config.vocab_size:
        raise InputError(
            where, f"the tokenizer has {len(vocabulary)} tokens, config.json's vocab_size is {config.vocab_size}"
        )
    for name, token in (("pad_token_id", alphabet.PAD), ("mask_token_id", alphabet.MASK)):
        if getattr(config, name) != vocabulary.index(token):
            raise InputError(
                where,
                f"config.json's {name} is {getattr(config, name)}, the tokenizer's {token} is {vocabulary.index(token)}",
            )
    shape = EsmShape.of(config)
    lm = masked_lm.lm_head
    head = TokenHead(shape.hidden, "gelu")  # EsmLMHead: dense -> gelu (erf form) -> LayerNorm -> decoder + bias
    head.norm.eps = lm.layer_norm.eps
    residues = token_map[alphabet.FIRST_RESIDUE_ID : alphabet.FIRST_RESIDUE_ID + alphabet.NUM_RESIDUES]
    with torch.no_grad():
        head.dense.load_state_dict(lm.dense.state_dict())
        head.norm.load_state_dict(lm.layer_norm.state_dict())
        head.out.weight.copy_(lm.decoder.weight[residues])
        head.out.bias.copy_(lm.bias[residues])
    return EsmEncoderModel(shape, EsmTrunk(masked_lm.esm, token_map), head).eval()


def folder_vocabulary(folder: Path) -> list[str]:
    """The tokens of ``folder``'s EsmTokenizer, in id order."""
    vocab = folder / VOCAB_FILE
    if not vocab.is_file():
        raise InputError(vocab, "missing: an ESM folder needs its tokenizer's vocabulary (vocab.txt)")
    tokenizer = EsmTokenizer(str(vocab))
    return [token for token, _ in sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])]


def load_esm_encoder(weights: Path, info: dict) -> EsmEncoderModel:
    """An ESM encoder artefact (``model.safetensors`` beside ``config.json``, ``vocab.txt`` and ``model.json``)."""
    folder = weights.parent
    if not (folder / CONFIG_FILE).is_file():
        raise InputError(
            folder / CONFIG_FILE, "missing: an ESM encoder is a transformers folder (pmlm import writes it)"
        )
    model = encoder_model(load_masked_lm(folder, weights, local_files_only=True), folder_vocabulary(folder), folder)
    recorded = info["model"]
    if {k: recorded.get(k) for k in ("num_layers", "hidden", "max_len")} != {
        k: getattr(model.cfg, k) for k in ("num_layers", "hidden", "max_len")
    }:
        raise InputError(weights.with_suffix(".json"), f"describes another model than {folder / CONFIG_FILE}")
    return model


def save_merged(
    model: EsmEncoderModel, weights: Path, out_dir, overwrite: bool, provenance: dict, command: str
) -> Path:
    """An ESM encoder whose adapters were merged into its trunk (``model``) as the transformers folder it came from:
    ``EsmForMaskedLM`` read from the encoder's folder with the trunk's weights replaced, its tokenizer, and
    ``provenance`` as config.json's ``pmlm`` section; ``out_dir`` a folder target of ``command`` (pmlm.outputs)."""
    masked_lm = load_masked_lm(weights.parent, weights, local_files_only=True)
    masked_lm.esm.load_state_dict(model.encoder.esm.state_dict())
    masked_lm.config.pmlm = provenance
    with writing_folder(out_dir, command=command, overwrite=overwrite) as staged:
        masked_lm.save_pretrained(staged)
        EsmTokenizer.from_pretrained(weights.parent).save_pretrained(staged)
    return Path(out_dir)
