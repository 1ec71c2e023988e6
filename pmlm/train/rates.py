"""Where ``pmlm plan``'s tokens/s per GPU of each pre-training job comes from, in this order: ``--tokens-per-second``
(``given_rates``: a preset's own, the others derived from it); the job's own rate in the throughput file
(``config/throughput.yaml``, ``pmlm.train.throughput``: measured per preset and objective by a GPU check); a rate
derived from the nearest measured one at the same model-FLOP rate (another objective of the preset, else another
preset measured, the same objective first, the closest size first); else an assumption derived from the paper's own
hardware time (``paper_rate``). And the paper's stated time per model beside the recipe's steps (``paper_time``)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from pmlm.config.pretraining import TrainConfig
from pmlm.errors import ConfigError
from pmlm.train.budget import flops_per_token
from pmlm.train.jobs import Job, recipe_job
from pmlm.train.throughput import ANY_OBJECTIVE, GIVEN, MeasuredRate
from pmlm.vocabulary import OBJECTIVES

# The paper: MLM-base / PMLM-base "pre-trained on 24 Tesla V100 GPU cards, about three weeks", evaluated at the
# 60th epoch. 60 epochs of UR50 is what config/train/base.yaml's total_steps estimates: 2,000,000 optimizer steps
# of 262,144 tokens (the recipe's tokens_per_step). Spread over 24 GPUs x 21 days that is ~12,000 tokens/s per V100
# at base dims; its model-FLOP rate, divided by another recipe's FLOPs per token, gives that recipe's tokens/s.
PAPER_BASE_TOKENS = 2_000_000 * 262_144
PAPER_BASE_GPU_SECONDS = 24 * 21 * 86_400
PAPER_BASE_RECIPE = Path("config/train/base.yaml")
# The paper's own hardware time per model (its "Experiment Setup"): (GPUs, days, what it says). The plan sets each
# job's GPU-hours beside it: the recipes train 2,000,000 steps (our estimate of the 60 epochs the paper states for
# the base models); for PMLM-large and PMLM-xl the paper gives no epochs or steps, only the time below.
PAPER_GPU_TIME = {
    ("mlm", "base"): (24, 21, "24 V100 x about three weeks"),
    ("pmlm", "base"): (24, 21, "24 V100 x about three weeks"),
    ("pmlm", "large"): (24, 49, "24 V100 x about seven weeks"),
    ("pmlm", "xl"): (16, 14, "16 V100 x more than two weeks"),
    ("pmlm_pair_only", "xl"): (16, 14, "16 V100 x more than two weeks"),
}


class RateKind(str, Enum):
    """Where a job's tokens/s per GPU comes from (module docstring), and its mark in the table."""

    OPTION = "option"  # --tokens-per-second
    MEASURED = "measured"
    DERIVED = "derived"
    ASSUMED = "assumed"

    @property
    def mark(self) -> str:
        return {RateKind.DERIVED: "~", RateKind.ASSUMED: "*"}.get(self, "")


@dataclass(frozen=True)
class Rate:
    tokens_per_second: float
    kind: RateKind
    source: str  # what the notes say, e.g. "measured on NVIDIA H100 80GB HBM3 (torch 2.11.0+cu130, 2026-11-28)"
    card: str | None = None  # the card that measured it (None: assumed, given, or not recorded)
    # the share of tokens_per_step that was padding where the rate was measured: the rate counts non-pad tokens, so
    # the job's tokens are counted without the same share. None: not measured (padding then counts as tokens)
    padding: float | None = None


def paper_rate(root: str | Path = ".") -> float:
    """Model FLOP/s per GPU the paper's base runs sustained (module constants): the assumed rate."""
    base = recipe_job(Path(root) / PAPER_BASE_RECIPE, "pmlm").config
    return PAPER_BASE_TOKENS / PAPER_BASE_GPU_SECONDS * flops_per_token(base)


def job_rate(job: Job, rates: dict[str, dict[str, MeasuredRate]], root: str | Path = ".") -> Rate | None:
    """The job's tokens/s per GPU from measured ``rates``: its own, else derived (module docstring); None when
    nothing is measured."""
    objective = job.config.objective.name
    own = rates.get(job.preset, {})
    for key in (objective, ANY_OBJECTIVE):
        if key in own:
            if own[key].source == GIVEN:
                return Rate(own[key].tokens_per_second, RateKind.OPTION, GIVEN, padding=own[key].padding_fraction)
            return Rate(
                own[key].tokens_per_second, RateKind.MEASURED, f"measured on {own[key].describe()}", own[key].card,
                own[key].padding_fraction,
            )  # fmt: skip
    size = _matmul_weights(job.config)
    candidates = []
    for preset, entries in rates.items():
        recipe = job.recipe if preset == job.preset else Path(root) / "config" / "train" / f"{preset}.yaml"
        if not recipe.exists():
            continue
        for key, rate in entries.items():
            measured = {ANY_OBJECTIVE: objective}.get(key, key)  # the flat form's rate is every objective's
            other = recipe_job(recipe, measured).config
            preference = (preset != job.preset, measured != objective)
            flop_rate = rate.tokens_per_second * flops_per_token(other)
            candidates.append((*preference, abs(_matmul_weights(other) - size), flop_rate, preset, key, rate))
    if not candidates:
        return None
    *_, flop_rate, preset, key, rate = min(candidates, key=lambda c: c[:3])
    name = {ANY_OBJECTIVE: ""}.get(key, f" {key}")
    how = (
        f"given as {GIVEN} {preset}{name.replace(' ', '/')}"
        if rate.source == GIVEN
        else f"measured on {rate.describe()}"
    )
    source = f"derived from {preset}{name} {how}"
    return Rate(flop_rate / flops_per_token(job.config), RateKind.DERIVED, source, rate.card, rate.padding_fraction)


def given_rates(values: list[str], jobs: list[Job]) -> dict[str, dict[str, MeasuredRate]]:
    """``--tokens-per-second`` items as rates (``{preset: {objective: rate}}``): ``PRESET=N`` or
    ``PRESET/OBJECTIVE=N`` for a preset's own, a bare ``N`` for the first job's preset and objective; the other jobs
    take one derived at the same model-FLOP rate (``job_rate``)."""
    rates: dict[str, dict[str, MeasuredRate]] = {}
    for value in values:
        key, sep, number = value.rpartition("=")
        preset, _, objective = key.partition("/")
        if not sep:
            if not jobs:
                raise ConfigError(f"--tokens-per-second {value}: no job to give it to")
            preset, objective = jobs[0].preset, jobs[0].config.objective.name
        try:
            tps = float(number)
        except ValueError:
            tps = 0.0
        if tps <= 0 or not preset or (sep and "/" in key and not objective):
            raise ConfigError(
                f"--tokens-per-second {value}: give N, PRESET=N or PRESET/OBJECTIVE=N with N > 0 non-pad tokens/s "
                "per GPU (e.g. base=12000 or base/pmlm=11000)"
            )
        if objective and objective not in OBJECTIVES:
            raise ConfigError(f"--tokens-per-second {value}: {objective!r} is not one of {', '.join(OBJECTIVES)}")
        rates.setdefault(preset, {})[objective or ANY_OBJECTIVE] = MeasuredRate(tps, source=GIVEN)
    return rates


def _matmul_weights(cfg: TrainConfig) -> int:
    m = cfg.model_config()
    return m.num_layers * (4 * m.hidden * m.hidden + 2 * m.hidden * m.ffn)


def paper_time(job: Job, root: str | Path = ".") -> dict | None:
    """The paper's stated hardware time for the job's model (``PAPER_GPU_TIME``) and the optimizer steps of the
    recipe that time buys at the paper's own rate (``paper_rate``, card-independent): where the recipe trains a
    multiple of them, that multiple is why its GPU-hours are a multiple of the paper's."""
    stated = PAPER_GPU_TIME.get((job.config.objective.name, job.preset))
    if stated is None:
        return None
    gpus, days, text = stated
    seconds = gpus * days * 86_400
    steps = seconds * paper_rate(root) / flops_per_token(job.config) / job.config.tokens_per_step
    return {"gpu_hours": seconds // 3600, "stated": text, "steps_in_that_time": round(steps),
            "recipe_over_paper": round(job.config.optim.total_steps / steps, 2)}  # fmt: skip
