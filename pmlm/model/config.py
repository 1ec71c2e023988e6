"""Typed configuration of the PMLM encoder and its heads, plus the named size presets."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from pmlm.alphabet import NUM_PAIR_CLASSES, VOCAB_SIZE
from pmlm.errors import ConfigError

PAIR_VOCABS = ("standard", "full")


@dataclass
class ModelConfig:
    """Shape of the encoder and which prediction heads it carries."""

    num_layers: int  # Transformer encoder layers
    hidden: int  # model width C
    ffn: int  # inner width of each feed-forward block
    heads: int  # attention heads; hidden must be divisible by it
    max_len: int  # longest input in tokens, <cls> and <eos> included (so max_len - 2 residues)
    dropout: float = 0.1  # dropout on embeddings, attention output and feed-forward output
    # dropout on attention probabilities; the fused variable-length kernel has none, so > 0 trains in the padded layout
    attention_dropout: float = 0.0
    token_head: bool = True  # 20-class masked-token head; False for the pmlm_pair_only objective
    pair_head: bool = True  # masked-pair head; False for plain MLM models
    # "standard": 20 * 20 = 400 residue-pair classes (the paper);
    # "full": VOCAB_SIZE ** 2 classes over token ids (the released code's dictionary-squared variant)
    pair_vocab: str = "standard"
    pair_chunk_size: int = 65536  # rows of pair_index pushed through the pair head at once (bounds transient memory)

    def __post_init__(self) -> None:
        for name in ("num_layers", "hidden", "ffn", "heads", "pair_chunk_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"model.{name} must be a positive integer, got {value!r}")
        if not isinstance(self.max_len, int) or self.max_len < 3:
            raise ConfigError(
                f"model.max_len must be an integer >= 3 (it counts <cls> and <eos>), got {self.max_len!r}"
            )
        if self.hidden % self.heads:
            raise ConfigError(
                f"model.hidden ({self.hidden}) must be divisible by model.heads ({self.heads})"
            )
        if self.hidden % 2:
            # sinusoidal positions fill sin/cos halves of the width
            raise ConfigError(f"model.hidden must be even for sinusoidal positions, got {self.hidden}")
        for name in ("dropout", "attention_dropout"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
                raise ConfigError(f"model.{name} must be in [0, 1), got {value!r}")
        if self.pair_vocab not in PAIR_VOCABS:
            raise ConfigError(
                f"model.pair_vocab must be one of {', '.join(PAIR_VOCABS)}, got {self.pair_vocab!r}"
            )

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def pair_classes(self) -> int:
        """Number of classes K of the pair head."""
        return NUM_PAIR_CLASSES if self.pair_vocab == "standard" else VOCAB_SIZE * VOCAB_SIZE

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


def model_config(preset: str, **overrides) -> ModelConfig:
    """Build a ModelConfig from a named preset, with any field overridden by keyword."""
    if preset not in PRESETS:
        raise ConfigError(f"unknown model preset {preset!r}; choose one of {', '.join(PRESETS)}")
    fields = {f.name for f in dataclasses.fields(ModelConfig)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise ConfigError(
            f"unknown model field(s) {', '.join(unknown)}; valid fields: {', '.join(sorted(fields))}"
        )
    return ModelConfig(**{**PRESETS[preset], **overrides})
