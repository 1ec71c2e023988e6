"""The ``optim`` sections of the pre-training and fine-tuning recipes, the AdamW checks they share and the
warm-up / decay schedule of both loops."""

from __future__ import annotations

from dataclasses import dataclass

from pmlm.config.tree import require


def check_adamw(optim) -> None:
    """The checks of the AdamW and schedule settings both runs' ``optim`` sections share."""
    require(optim.lr > 0, "optim.lr", "must be > 0", optim.lr)
    betas_ok = len(optim.betas) == 2 and all(0 <= b < 1 for b in optim.betas)
    require(betas_ok, "optim.betas", "must be two numbers in [0, 1)", optim.betas)
    require(optim.eps > 0, "optim.eps", "must be > 0", optim.eps)
    require(optim.weight_decay >= 0, "optim.weight_decay", "must be >= 0", optim.weight_decay)
    require(optim.total_steps >= 1, "optim.total_steps", "must be >= 1", optim.total_steps)
    warmup_ok = 0 <= optim.warmup_steps <= optim.total_steps
    require(warmup_ok, "optim.warmup_steps", "must be in [0, optim.total_steps]", optim.warmup_steps)
    require(optim.clip_norm >= 0, "optim.clip_norm", "must be >= 0 (0 disables clipping)", optim.clip_norm)


def warmup_decay(
    step: int, warmup_steps: int, total_steps: int, peak: float = 1.0, end: float = 0.0, power: float = 1.0
) -> float:
    """The schedule of both runs at optimizer step ``step`` (0-based): linear warm-up from 0 to ``peak``,
    then polynomial decay to ``end`` at ``total_steps``."""
    update = step + 1
    if update <= warmup_steps:
        return peak * update / warmup_steps
    decay_steps = total_steps - warmup_steps
    if decay_steps <= 0:
        return end
    remaining = max(0.0, 1.0 - (update - warmup_steps) / decay_steps)
    return end + (peak - end) * remaining**power


@dataclass
class PretrainOptimConfig:
    """AdamW with linear warm-up then polynomial decay (paper: Adam (0.9, 0.98), eps 1e-6, clip 1.0)."""

    lr: float = 3e-4  # peak learning rate, reached at the end of warm-up (paper: 3e-4 base, 1e-4 large/xl)
    end_lr: float = 0.0  # learning rate at total_steps
    betas: tuple[float, float] = (0.9, 0.98)  # Adam moment decay rates
    eps: float = 1e-6  # Adam denominator epsilon
    # decoupled decay on matrices only (biases, LayerNorms stay undecayed); 0 gives plain Adam
    weight_decay: float = 0.01
    warmup_steps: int = 20_000  # optimizer steps of linear warm-up from 0 to lr
    total_steps: int = 100_000  # optimizer steps in the whole run (the decay ends here)
    power: float = 1.0  # exponent of the polynomial decay; 1.0 is linear
    clip_norm: float = 1.0  # global gradient-norm clip; 0 disables clipping

    def __post_init__(self) -> None:
        check_adamw(self)
        require(0 <= self.end_lr <= self.lr, "optim.end_lr", "must be in [0, optim.lr]", self.end_lr)
        require(self.power > 0, "optim.power", "must be > 0", self.power)

    def lr_at(self, step: int) -> float:
        """Learning rate of optimizer step ``step`` (0-based): warm-up, then decay to end_lr."""
        return warmup_decay(step, self.warmup_steps, self.total_steps, self.lr, self.end_lr, self.power)


@dataclass
class FinetuneOptimConfig:
    """AdamW with two learning rates (encoder, head), linear warm-up then linear decay to 0."""

    lr: float = 1e-5  # peak learning rate of the encoder (used only when freeze_encoder is false)
    head_lr: float = 1e-3  # peak learning rate of the head
    betas: tuple[float, float] = (0.9, 0.999)  # Adam moment decay rates
    eps: float = 1e-8  # Adam denominator epsilon
    weight_decay: float = 0.01  # decoupled decay on weight matrices (not biases / norms)
    warmup_steps: int = 100  # optimizer steps of linear warm-up
    total_steps: int = 3000  # optimizer steps in the whole run
    clip_norm: float = 1.0  # global gradient-norm clip; 0 disables clipping

    def __post_init__(self) -> None:
        check_adamw(self)
        require(self.head_lr > 0, "optim.head_lr", "must be > 0", self.head_lr)

    def scale_at(self, step: int) -> float:
        """Multiplier of both peak learning rates at optimizer step ``step`` (0-based): linear up, linear down."""
        return warmup_decay(step, self.warmup_steps, self.total_steps)
