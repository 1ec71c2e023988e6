"""The best validation of a fine-tuning run: which step's head (and adapters, or encoder) it keeps, and when to stop.

Every validation (``eval_every`` steps, and the final one) scores the task's headline metric (Spearman, accuracy,
P@L/5, ...; higher is better for every task). A strictly higher value than the best so far makes this step the
best: its trained weights are copied to the host and kept. A tie keeps the earlier step. With ``patience`` > 0, the
run stops after that many validations in a row without a new best. The run's final head file holds the best step's
weights, and ``head.json`` says which step, the value, and the step training reached.

A checkpoint carries the selection (the best step, its value, its scores and weights) in its training state, so a
resumed run keeps the same best, whichever part of the run found it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch


@dataclass
class Selection:
    """The best validation so far and the validations since it."""

    metric: str  # the task's headline
    patience: int  # validations without a new best before stopping; 0 = never
    step: int | None = None  # the best validation's step
    value: float | None = None  # its headline value
    scores: dict | None = None  # all its metrics
    since: int = 0  # validations since the best
    validations: int = 0
    weights: dict[str, torch.Tensor] | None = field(default=None, repr=False)  # the best step's trained weights (CPU)

    def observe(self, step: int, scores: dict, state: dict[str, torch.Tensor]) -> bool:
        """Record a validation at ``step`` (``scores``: metric -> value; ``state``: the trained weights now); True
        when it is the new best."""
        self.validations += 1
        value = scores.get(self.metric)
        better = value is not None and not math.isnan(value) and (self.value is None or value > self.value)
        if better:
            self.step, self.value, self.scores, self.since = step, float(value), dict(scores), 0
            self.weights = {k: v.detach().to("cpu", copy=True) for k, v in state.items()}
        else:
            self.since += 1
        return better

    @property
    def exhausted(self) -> bool:
        """Whether ``patience`` validations in a row brought no new best."""
        return self.patience > 0 and self.since >= self.patience

    def state_dict(self) -> dict:
        fields = ("step", "value", "scores", "since", "validations", "weights")
        return {name: getattr(self, name) for name in fields}

    def load_state_dict(self, state: dict | None) -> None:
        for name, value in (state or {}).items():
            setattr(self, name, value)

    def record(self, last_step: int) -> dict | None:
        """What ``head.json`` says of the selection (None without a validation)."""
        if self.step is None:
            return None
        return {
            "step": self.step,
            "metric": self.metric,
            "value": self.value,
            "validations": self.validations,
            "last_step": last_step,
            "stopped_early": self.exhausted,
            "patience": self.patience,
        }
