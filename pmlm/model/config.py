"""Typed configuration of the PMLM encoder and its heads, the named size presets, and the layer recipe each
objective's encoder gets by default (the table: docs/model.md, "Encoder layers").

Layer recipes (``RELEASED_LAYERS``) are what the released PMLM code registers (microsoft/Mu-Protein at
ff29ce1, ``pmlm/src/protein/models/{pmlm,mlm,pmlmx}.py``, run on fairseq 0.10.2; its ``pretrain.sh``
passes none of these flags, so the registered defaults are what it trains with): ``prot_pmlm_base``
pmlm.py:404-406, 418, 420; ``prot_mlm_base`` mlm.py:362-364, 378, 380; ``prot_pmlmx`` pmlmx.py:436-438, 450, 452.
In that fairseq version every ``TransformerSentenceEncoder`` layer is post-LN with no final LayerNorm, and
``encoder_normalize_before`` only adds a LayerNorm on the embeddings (``transformer_sentence_encoder.py``
l.171-174, 273-278; ``transformer_sentence_encoder_layer.py`` l.104-134). The size presets (``PRESETS``) say
nothing about layers: ``model_config(preset, objective)`` joins a preset's dimensions with the objective's recipe.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from pmlm.alphabet import FIRST_RESIDUE_ID, FULL_PAIR_SIDE, NUM_RESIDUES
from pmlm.choices import Choice
from pmlm.errors import ConfigError
from pmlm.vocabulary import MLM, PMLM, PMLM_PAIR_ONLY


class PairVocab(Choice):
    """The pair head's classes (``model.pair_vocab``): the pairs of what, and how a pair's class is numbered."""

    STANDARD = "standard"  # 20 * 20 = 400 residue-pair classes, 20 a + b (the paper)
    FULL = "full"  # the released code's dictionary squared, FULL_PAIR_SIDE ** 2 = 729 classes over token ids

    @property
    def residue_pairs(self) -> bool:
        """Whether the classes are pairs of the 20 residues (the token head's classes), not of token ids."""
        return self is PairVocab.STANDARD

    @property
    def side(self) -> int:
        """Rows (and columns) of the joint: 20 residues, or the released dictionary's 27 symbols."""
        return NUM_RESIDUES if self.residue_pairs else FULL_PAIR_SIDE

    @property
    def offset(self) -> int:
        """Where residue class 0 sits along a side."""
        return 0 if self.residue_pairs else FIRST_RESIDUE_ID

    @property
    def classes(self) -> int:
        """Number of classes K of the pair head."""
        return self.side**2

    def pair_class(self, first, second):
        """The class of ordered pairs (tensors) of residue classes ``first``, ``second``: ``side * a + b`` along
        the sides."""
        return (first + self.offset) * self.side + (second + self.offset)


class Norm(Choice):
    """Where each encoder block's LayerNorm sits (``model.norm``)."""

    POST = "post"  # x = LN(x + f(x)) per block, no final LayerNorm (fairseq 0.10.2, the released code)
    PRE = "pre"  # x = x + f(LN(x)) per block plus a final LayerNorm (ESM-1b; steadier at depth)

    @property
    def final(self) -> bool:
        """Whether the encoder ends in a LayerNorm of its own (pre-LN leaves the residual stream unnormalised)."""
        return self is Norm.PRE


ACTIVATIONS = ("relu", "gelu")
POSITIONS = ("pmlm", "fairseq")

# the released code's layer recipe per pre-training objective (module docstring, with the lines read)
RELEASED_LAYERS: dict[str, dict] = {
    PMLM: {
        "norm": "post",
        "embedding_norm": False,
        "activation": "relu",
        "dropout": 0.1,
        "attention_dropout": 0.1,
        "activation_dropout": 0.0,
    },
    MLM: {
        "norm": "post",
        "embedding_norm": True,
        "activation": "gelu",
        "dropout": 0.1,
        "attention_dropout": 0.1,
        "activation_dropout": 0.0,
    },
    PMLM_PAIR_ONLY: {
        "norm": "post",
        "embedding_norm": True,
        "activation": "gelu",
        "dropout": 0.0,
        "attention_dropout": 0.0,
        "activation_dropout": 0.0,
    },
}
# an objective without released code names the recipe it takes (``Objective.layers``; the Triple MLM: PMLM's)


@dataclass
class ModelConfig:
    """Shape of the encoder and which prediction heads it carries (field defaults: the released PMLM layers)."""

    num_layers: int  # Transformer encoder layers
    hidden: int  # model width C
    ffn: int  # inner width of each feed-forward block
    heads: int  # attention heads; hidden must be divisible by it
    max_len: int  # longest input in tokens, <cls> and <eos> included (so max_len - 2 residues)
    norm: Norm = Norm.POST  # post | pre (Norm)
    embedding_norm: bool = False  # LayerNorm on token + position embeddings (fairseq's encoder_normalize_before)
    activation: str = "relu"  # of the feed-forward blocks and of both heads' hidden layers: relu | gelu
    dropout: float = 0.1  # dropout on embeddings, attention output and feed-forward output
    # dropout on attention probabilities (on CPU: pmlm.model.dropout_attention; packed on GPUs: FlashAttention's own)
    attention_dropout: float = 0.1
    activation_dropout: float = 0.0  # dropout after the feed-forward activation
    token_head: bool = True  # 20-class masked-token head; False for the pmlm_pair_only objective
    pair_head: bool = True  # masked-pair head; False for plain MLM models
    pair_vocab: PairVocab = PairVocab.STANDARD  # standard | full (PairVocab; pmlm.alphabet)
    pair_chunk_size: int = 65536  # rows of pair_index pushed through the pair head at once (bounds transient memory)
    # sinusoidal position table: "pmlm" (token t at angle t * f_k, <cls> = 0) or "fairseq" (fairseq 0.10.2's
    # SinusoidalPositionalEmbedding: t + padding index + 1, computed in fp32), the convention of imported
    # released checkpoints (pmlm.model.encoder.position_table)
    positions: str = "pmlm"
    # the pair head's output written as out(M+)[a, b] + u_1(M+)[a] + u_2(M+)[b]: the same linear map of M+ (the
    # same functions), with per-residue terms every class of that residue trains (pmlm.model.heads); false: the paper
    pair_unary: bool = False
    # the pair (and triple) head's joint as the product of the token head's marginals at its positions times
    # exp(its own output), so independence is its default and it learns only the departure from it
    # (pmlm.model.heads, pmlm.model.triple); false: the paper's free 400-class softmax
    product_base: bool = False
    triple_head: bool = False  # the Triple MLM's factorised triple-joint head (pmlm.model.triple); objective tmlm
    triple_rank: int = 16  # rank R of its three-way factors
    triple_width: int = 0  # width of its hidden layer; 0: 2 * hidden, as the pair head
    triple_chunk_size: int = 1024  # triples pushed through it at once (each materialises 8,000 logits)

    def __post_init__(self) -> None:
        for name in ("num_layers", "hidden", "ffn", "heads", "pair_chunk_size", "triple_rank", "triple_chunk_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"model.{name} must be a positive integer, got {value!r}")
        if not isinstance(self.max_len, int) or self.max_len < 3:
            raise ConfigError(
                f"model.max_len must be an integer >= 3 (it counts <cls> and <eos>), got {self.max_len!r}"
            )
        if self.hidden % self.heads:
            raise ConfigError(f"model.hidden ({self.hidden}) must be divisible by model.heads ({self.heads})")
        if self.hidden % 2:
            # sinusoidal positions fill sin/cos halves of the width
            raise ConfigError(f"model.hidden must be even for sinusoidal positions, got {self.hidden}")
        self.norm = Norm.parse(self.norm, "model.norm")
        if self.activation not in ACTIVATIONS:
            raise ConfigError(f"model.activation must be one of {', '.join(ACTIVATIONS)}, got {self.activation!r}")
        for name in ("embedding_norm", "pair_unary", "product_base", "triple_head", "token_head", "pair_head"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"model.{name} must be true or false, got {getattr(self, name)!r}")
        for name in ("dropout", "attention_dropout", "activation_dropout"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
                raise ConfigError(f"model.{name} must be in [0, 1), got {value!r}")
        if self.positions not in POSITIONS:
            raise ConfigError(f"model.positions must be one of {', '.join(POSITIONS)}, got {self.positions!r}")
        if not isinstance(self.triple_width, int) or isinstance(self.triple_width, bool) or self.triple_width < 0:
            raise ConfigError(f"model.triple_width must be an integer >= 0 (0: 2 * hidden), got {self.triple_width!r}")
        self.pair_vocab = PairVocab.parse(self.pair_vocab, "model.pair_vocab")
        if (
            self.product_base
            and (self.pair_head or self.triple_head)
            and (not self.pair_vocab.residue_pairs or not self.token_head)
        ):
            raise ConfigError(
                "model.product_base needs a token head and pair_vocab standard (the product of "
                "the token head's 20-class marginals)"
            )

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def pair_classes(self) -> int:
        """Number of classes K of the pair head."""
        return self.pair_vocab.classes

    @property
    def triple_hidden(self) -> int:
        """Width of the triple head's hidden layer."""
        return self.triple_width or 2 * self.hidden

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# Paper, Experiment Setup (base = RoBERTa-base dims); xl from the paper and the released recipe.
# "tiny" runs a training step in well under a second on a laptop CPU (tests, the demo).
PRESETS: dict[str, dict] = {
    "tiny": {"num_layers": 2, "hidden": 64, "ffn": 256, "heads": 4, "max_len": 256},
    "base": {"num_layers": 12, "hidden": 768, "ffn": 3072, "heads": 12, "max_len": 512},
    "large": {"num_layers": 34, "hidden": 768, "ffn": 3072, "heads": 12, "max_len": 1024},
    "xl": {"num_layers": 36, "hidden": 1280, "ffn": 5120, "heads": 20, "max_len": 1024},
}


def model_config(preset: str, objective: str = PMLM, **overrides) -> ModelConfig:
    """Build a ModelConfig from a named preset and the layer recipe of ``objective`` (``RELEASED_LAYERS``),
    with any field overridden by keyword."""
    if preset not in PRESETS:
        raise ConfigError(f"unknown model preset {preset!r}; choose one of {', '.join(PRESETS)}")
    if objective not in RELEASED_LAYERS:
        raise ConfigError(f"unknown objective {objective!r}; choose one of {', '.join(RELEASED_LAYERS)}")
    fields = {f.name for f in dataclasses.fields(ModelConfig)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise ConfigError(f"unknown model field(s) {', '.join(unknown)}; valid fields: {', '.join(sorted(fields))}")
    return ModelConfig(**{**PRESETS[preset], **RELEASED_LAYERS[objective], **overrides})
