"""How long the pre-training jobs of a workflow config take and how their batch meets a GPU, before any job is
submitted (``pmlm plan``): steps and tokens from each recipe (its ``tokens_per_step``, the same on any number of
GPUs), GPU-hours from a per-GPU throughput, the number of time-limit segments at the SLURM profile's runtime, and per
card size the micro-batch, the accumulation and the peak memory per GPU (``train.step_layout``, ``train.budget``).

The throughput per GPU is, in this order: ``--tokens-per-second``; the job's own rate in the throughput file
(``config/throughput.yaml``, ``pmlm.train.throughput``: measured per preset and objective by a GPU check); a rate
derived from the nearest measured one at the same model-FLOP rate (another objective of the preset, else another
preset measured, the same objective first, the closest size first); else an assumption derived from the paper's own
hardware time (``paper_rate``). Every row says which, and the notes name the card.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

import yaml

from pmlm.config.pretraining import TrainConfig
from pmlm.errors import ConfigError
from pmlm.train.budget import GIB, Precision, flops_per_token, peak_memory
from pmlm.train.step_layout import CARD_HEADROOM, choose_layout
from pmlm.train.throughput import ANY_OBJECTIVE, MeasuredRate

# The paper: MLM-base / PMLM-base "pre-trained on 24 Tesla V100 GPU cards, about three weeks", evaluated at the
# 60th epoch. 60 epochs of UR50 is what config/train/base.yaml's total_steps estimates: 2,000,000 optimizer steps
# of 262,144 tokens (the recipe's tokens_per_step). Spread over 24 GPUs x 21 days that is ~12,000 tokens/s per V100
# at base dims; its model-FLOP rate, divided by another recipe's FLOPs per token, gives that recipe's tokens/s.
PAPER_BASE_TOKENS = 2_000_000 * 262_144
PAPER_BASE_GPU_SECONDS = 24 * 21 * 86_400
PAPER_BASE_RECIPE = Path("config/train/base.yaml")
DEFAULT_WARNING_S = 600  # the profile's --signal=USR1@600: the trainers stop this long before the limit
CARD_BYTES = {"40 GB": 40 * GIB, "80 GB": 80 * GIB}


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


@dataclass(frozen=True)
class Job:
    name: str  # dataset/objective-preset, as the workflow's results/<run>/pretrain/ folders
    preset: str
    recipe: Path
    config: TrainConfig


def read_yaml(path: str | Path) -> dict:
    try:
        data = yaml.safe_load(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not YAML ({str(exc).splitlines()[0]})") from None
    return data if isinstance(data, dict) else {}


def recipe_job(recipe: str | Path, objective: str, sets: list[str] = (), name: str | None = None) -> Job:
    """One recipe trained with ``objective`` (the workflow's own ``--set objective.name=...``, then ``sets``)."""
    cfg = TrainConfig.from_yaml(recipe, [f"objective.name={objective}", *sets])
    preset = cfg.model.preset
    return Job(name or f"{objective}-{preset}", preset, Path(recipe), cfg)


def workflow_jobs(configfile: str | Path, root: str | Path = ".") -> list[Job]:
    """The pre-training jobs of a workflow config (released checkpoints are imported, not trained), with the
    overrides the workflow passes them (``pretrain.set``); recipe paths are resolved against ``root``, the
    workflow directory, as the Snakefile resolves them."""
    config = read_yaml(configfile)
    pretrain = config.get("pretrain") or {}
    recipes = pretrain.get("recipes") or {}
    sets = [f"{key}={value}" for key, value in (pretrain.get("set") or {}).items()]
    jobs = []
    for i, model in enumerate(pretrain.get("models") or []):
        if model.get("release"):
            continue
        if model.get("preset") not in recipes:
            raise ConfigError(f"{configfile}: pretrain.models[{i}].preset: no recipe for {model.get('preset')!r}")
        recipe = Path(recipes[model["preset"]])
        recipe = recipe if recipe.is_absolute() else Path(root) / recipe
        name = f"{model['dataset']}/{model['objective']}-{model['preset']}"
        jobs.append(recipe_job(recipe, model["objective"], sets, name))
    if not jobs:
        raise ConfigError(f"{configfile}: pretrain.models names no encoder to pre-train")
    return jobs


def pretrain_resources(profile: str | Path) -> dict:
    """The pre-training job's GPUs, runtime (minutes) and time-limit warning (seconds) under a SLURM profile:
    ``set-resources: pretrain:`` of ``<profile>/config.yaml``. The one place that knows where they live."""
    path = Path(profile) / "config.yaml" if Path(profile).is_dir() else Path(profile)
    section = (read_yaml(path).get("set-resources") or {}).get("pretrain") or {}
    nodes = int(section.get("nodes", 1) or 1)
    per_node = re.fullmatch(r"gpu(?::[^:]+)?:(\d+)", str(section.get("gres", "") or ""))
    gpus = int(per_node.group(1)) * nodes if per_node else int(section.get("gpu", 0) or 0)
    warning = re.search(r"--signal=\w*@(\d+)", str(section.get("slurm_extra", "")))
    return {
        "source": str(path),
        "gpus": gpus or None,
        "runtime_min": int(section["runtime"]) if section.get("runtime") else None,
        "warning_s": int(warning.group(1)) if warning else DEFAULT_WARNING_S,
    }


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
            return Rate(
                own[key].tokens_per_second, RateKind.MEASURED, f"measured on {own[key].describe()}", own[key].card
            )
    size = _matmul_weights(job.config)
    candidates = []
    for preset, entries in rates.items():
        recipe = job.recipe if preset == job.preset else Path(root) / "config" / "train" / f"{preset}.yaml"
        if not recipe.exists():
            continue
        for measured_objective, rate in entries.items():
            other = recipe_job(recipe, objective if measured_objective == ANY_OBJECTIVE else measured_objective).config
            preference = (preset != job.preset, measured_objective not in (objective, ANY_OBJECTIVE))
            flop_rate = rate.tokens_per_second * flops_per_token(other)
            candidates.append(
                (*preference, abs(_matmul_weights(other) - size), flop_rate, preset, measured_objective, rate)
            )
    if not candidates:
        return None
    *_, flop_rate, preset, measured_objective, rate = min(candidates, key=lambda c: c[:3])
    name = "" if measured_objective == ANY_OBJECTIVE else f" {measured_objective}"
    source = f"derived from {preset}{name} measured on {rate.describe()}"
    return Rate(flop_rate / flops_per_token(job.config), RateKind.DERIVED, source, rate.card)


def _matmul_weights(cfg: TrainConfig) -> int:
    m = cfg.model_config()
    return m.num_layers * (4 * m.hidden * m.hidden + 2 * m.hidden * m.ffn)


def plan_job(job: Job, gpus: int, runtime_min: int | None, warning_s: int, rate: Rate) -> dict:
    """One row of the plan: steps, tokens, GPU-hours, wall time, segments; per card size the micro-batch, the
    accumulation and the peak memory per GPU (``cards``), and the memory by component on the largest card."""
    cfg = job.config
    try:  # whatever the card: the batch must split over the GPUs, and an explicit micro-batch divide their share
        choose_layout(cfg, gpus)
    except ConfigError as exc:
        raise ConfigError(f"{job.name} ({job.recipe}): {exc}") from None
    tokens = cfg.tokens_per_step * cfg.optim.total_steps
    gpu_hours = tokens / rate.tokens_per_second / 3600
    wall_hours = gpu_hours / gpus
    usable_min = None if runtime_min is None else runtime_min - warning_s / 60
    row = {
        "job": job.name,
        "recipe": str(job.recipe),
        "gpus": gpus,
        "steps": cfg.optim.total_steps,
        "tokens_per_step": cfg.tokens_per_step,
        "tokens": tokens,
        "tokens_per_gpu_second": round(rate.tokens_per_second),
        "throughput_kind": rate.kind.value,
        "throughput_source": rate.source,
        "throughput_card": rate.card,
        "gpu_hours": round(gpu_hours),
        "wall_days": round(wall_hours / 24, 1),
        "runtime_min": runtime_min,
        "segments": None if not usable_min or usable_min <= 0 else math.ceil(wall_hours * 60 / usable_min),
    }
    chosen = Precision(bf16=cfg.bf16 is not False)
    row["precision"] = "bf16" if chosen.bf16 else "fp32"
    row["cards"], row["memory"] = {}, None
    for card, size in CARD_BYTES.items():
        try:
            layout = choose_layout(cfg, gpus, size, chosen)
        except ConfigError as exc:  # no micro-batch fits
            row["cards"][card] = {"fits": False, "note": str(exc)}
            continue
        split = {"micro_batch": layout.micro_tokens, "accumulation": layout.accumulation}
        try:
            memory = {
                p: peak_memory(cfg, gpus, Precision(bf16=p == "bf16"), layout.accumulation) for p in ("bf16", "fp32")
            }
        except ConfigError as exc:  # a recipe the estimate does not model
            row["cards"][card] = {**split, "peak_gib": None, "fits": None, "note": layout.note or str(exc)}
            continue
        peak = memory[row["precision"]]["total_bytes"]
        row["cards"][card] = {
            **split,
            "peak_gib": round(peak / GIB, 1),
            "fits": peak <= size * (1 - CARD_HEADROOM),
        }
        row["memory"] = memory
    return row


def plan(
    jobs: list[Job],
    resources: dict,
    tokens_per_second: float | None = None,
    rates: dict[str, dict[str, MeasuredRate]] | None = None,
    root: str | Path = ".",
) -> list[dict]:
    """Rows for ``jobs`` under ``resources`` (``pretrain_resources``; ``gpus`` must be set)."""
    if not resources.get("gpus"):
        raise ConfigError(f"{resources.get('source', 'the profile')}: no GPU count for pretrain; pass --gpus")
    rates = rates or {}
    assumed = None
    rows = []
    for job in jobs:
        if tokens_per_second:
            rate = Rate(tokens_per_second, RateKind.OPTION, "--tokens-per-second")
        else:
            rate = job_rate(job, rates, root)
            if rate is None:
                assumed = assumed or paper_rate(root)
                rate = Rate(assumed / flops_per_token(job.config), RateKind.ASSUMED, "assumed: the paper's V100 rate")
        rows.append(plan_job(job, resources["gpus"], resources.get("runtime_min"), resources["warning_s"], rate))
    return rows


def render(rows: list[dict]) -> str:
    """The plan as a Markdown table, then what each figure assumes."""
    cards = list(CARD_BYTES)
    head = (
        "| job | GPUs | steps | tokens/step | tokens | tok/s/GPU | GPU-hours | wall days | segments | "
        + " | ".join(f"{card}: micro-batch x accum, peak GiB/GPU" for card in cards)
        + " |"
    )
    lines = [head, "|" + "---|" * (9 + len(cards))]
    for r in rows:
        segments = "n/a" if r["segments"] is None else str(r["segments"])
        lines.append(
            f"| {r['job']} | {r['gpus']} | {r['steps']:,} | {r['tokens_per_step']:,} | {r['tokens']:.3g} | "
            f"{r['tokens_per_gpu_second']:,}{RateKind(r['throughput_kind']).mark} | "
            f"{r['gpu_hours']:,} | {r['wall_days']} | {segments} | "
            + " | ".join(_card_cell(r["cards"][card]) for card in cards)
            + " |"
        )
    notes = [
        "",
        "tokens/step: the recipe's tokens_per_step, the same on any number of GPUs; tokens: x steps (padding "
        "included). micro-batch x accum: the tokens one GPU computes at once and the micro-batches it accumulates "
        "per step (tokens/step = micro-batch x accum x GPUs); data.tokens_per_batch: auto takes the largest "
        "micro-batch the card holds.",
    ]
    kinds = {RateKind(r["throughput_kind"]) for r in rows}
    measured = [r for r in rows if RateKind(r["throughput_kind"]) in (RateKind.MEASURED, RateKind.DERIVED)]
    for source in dict.fromkeys(r["throughput_source"] for r in measured):  # each source once, in the rows' order
        jobs = [r for r in measured if r["throughput_source"] == source]
        mark = RateKind(jobs[0]["throughput_kind"]).mark
        if len(jobs) < len(rows):  # name the rows it prices
            mark = f"{mark or 'tok/s/GPU of'} {', '.join(r['job'] for r in jobs)}"
        notes.append(f"{mark or 'tok/s/GPU'}: {source}.")
    if RateKind.DERIVED in kinds:
        notes.append(
            "~ derived: the measured model-FLOP rate (tokens/s x FLOPs per token) over the job's own FLOPs per token "
            "(the throughput file has no figure for its preset and objective)."
        )
    cards = sorted({r["throughput_card"] for r in measured if r["throughput_card"]})
    if len(cards) > 1:
        notes.append(
            f"The rates come from {len(cards)} cards ({'; '.join(cards)}): each row's GPU-hours are on the card named above."
        )
    if RateKind.ASSUMED in kinds:
        notes.append(
            "* assumed: the paper's V100 rate (24 V100 x ~3 weeks for 60 epochs of PMLM-base, scaled by each "
            "recipe's FLOPs per token); config/throughput.yaml has no figure measured on a GPU. Give --tokens-per-second "
            "or fill config/throughput.yaml (pmlm throughput RESULT.json -o config/throughput.yaml)."
        )
    runtime = next((r["runtime_min"] for r in rows if r["runtime_min"]), None)
    if runtime:
        notes.append(f"segments: SLURM jobs of {runtime} min each (the trainers stop before each time limit).")
    notes.append(
        "peak: the largest micro-batch's weights, gradients, AdamW state and saved activations (pmlm.train.budget), at "
        f"the recipe's precision; a card holds it when it leaves {CARD_HEADROOM:.0%} for the CUDA context and the "
        'allocator. "no": an explicit data.tokens_per_batch the card does not hold.'
    )
    notes += [f"{r['job']}, {card}: {c['note']}" for r in rows for card, c in r["cards"].items() if c.get("note")]
    return "\n".join(lines + notes) + "\n"


def _card_cell(card: dict) -> str:
    if "micro_batch" not in card:
        return "does not fit"
    if card["peak_gib"] is None:
        return f"{card['micro_batch']:,} x {card['accumulation']}, not estimated"
    cell = f"{card['micro_batch']:,} x {card['accumulation']}, {card['peak_gib']}"
    return cell if card["fits"] else cell + " (no)"
