"""How long the pre-training jobs of a workflow config take and how their batch meets a GPU, before any job is
submitted (``pmlm plan``): steps and tokens from each recipe (its ``tokens_per_step``, the same on any number of
GPUs), GPU-hours from a per-GPU throughput, the number of time-limit segments at the SLURM profile's runtime, and per
card size the micro-batch, the accumulation and the peak memory per GPU (``train.step_layout``, ``train.budget``).

The throughput per GPU comes from ``train.rates`` (given, measured, derived or assumed): every row says which, and the
notes name the card. The jobs and the profile's resources come from ``train.jobs``.
"""

from __future__ import annotations

import math
from pathlib import Path

from pmlm.choices import Device, Precision
from pmlm.errors import ConfigError
from pmlm.train.budget import GIB, Arithmetic, count_parameters, flops_per_token, peak_memory
from pmlm.train.jobs import Job
from pmlm.train.rates import Rate, RateKind, given_rates, job_rate, paper_rate, paper_time
from pmlm.train.step_layout import CARD_HEADROOM, choose_layout
from pmlm.train.throughput import MeasuredRate

CARD_BYTES = {"40 GB": 40 * GIB, "80 GB": 80 * GIB}


def plan_job(job: Job, gpus: int, runtime_min: int | None, warning_s: int, rate: Rate) -> dict:
    """One row of the plan: steps, tokens, GPU-hours, wall time, segments; per card size the micro-batch, the
    accumulation and the peak memory per GPU (``cards``), and the memory by component on the largest card."""
    cfg = job.config
    try:  # whatever the card: the batch must split over the GPUs, and an explicit micro-batch divide their share
        choose_layout(cfg, gpus)
    except ConfigError as exc:
        raise ConfigError(f"{job.name} ({job.recipe}): {exc}") from None
    tokens = cfg.tokens_per_step * cfg.optim.total_steps
    # the rate and the tokens it divides count padding alike: a measured rate counts non-pad tokens, so the job's
    # tokens lose the share of padding its measurement had; the paper's rate is tokens_per_step x steps over time
    counted = tokens * (1 - (rate.padding or 0.0))
    gpu_hours = counted / rate.tokens_per_second / 3600
    wall_hours = gpu_hours / gpus
    usable_min = None if runtime_min is None else runtime_min - warning_s / 60
    row = {
        "job": job.name,
        "recipe": str(job.recipe),
        "gpus": gpus,
        "steps": cfg.optim.total_steps,
        "tokens_per_step": cfg.tokens_per_step,
        "tokens": tokens,
        "padding_fraction": rate.padding,
        "counted_tokens": round(counted),
        "tokens_per_gpu_second": round(rate.tokens_per_second),
        "throughput_kind": rate.kind.value,
        "throughput_source": rate.source,
        "throughput_card": rate.card,
        "gpu_hours": round(gpu_hours),
        "wall_days": round(wall_hours / 24, 1),
        "runtime_min": runtime_min,
        "segments": None if not usable_min or usable_min <= 0 else math.ceil(wall_hours * 60 / usable_min),
        "paper": None,
    }
    chosen, params = Arithmetic(cfg.precision.on(Device.CUDA)), count_parameters(cfg.model_config(), cfg.objective.kind)
    row["precision"] = chosen.precision
    row["cards"], row["memory"] = {}, None
    for card, size in CARD_BYTES.items():
        try:
            layout = choose_layout(cfg, gpus, size, chosen, params)
        except ConfigError as exc:  # no micro-batch fits
            row["cards"][card] = {"fits": False, "note": str(exc)}
            continue
        split = {"micro_batch": layout.micro_tokens, "accumulation": layout.accumulation}
        try:
            memory = {
                p: peak_memory(cfg, params, gpus, Arithmetic(p), layout.accumulation)
                for p in (Precision.BF16, Precision.FP32)
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
    given: list[str] | None = None,
    rates: dict[str, dict[str, MeasuredRate]] | None = None,
    root: str | Path = ".",
) -> list[dict]:
    """Rows for ``jobs`` under ``resources`` (``pretrain_resources``; ``gpus`` must be set). ``given``:
    ``--tokens-per-second`` items (``given_rates``), which replace the throughput file's ``rates``."""
    if not resources.get("gpus"):
        raise ConfigError(f"{resources.get('source', 'the profile')}: no GPU count for pretrain; pass --gpus")
    rates = given_rates(given, jobs) if given else rates or {}
    assumed = None
    rows = []
    for job in jobs:
        rate = job_rate(job, rates, root)
        if rate is None:
            assumed = assumed or paper_rate(root)
            rate = Rate(assumed / flops_per_token(job.config), RateKind.ASSUMED, "assumed: the paper's V100 rate")
        rows.append(plan_job(job, resources["gpus"], resources.get("runtime_min"), resources["warning_s"], rate))
        rows[-1]["paper"] = paper_time(job, root)
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
        "tokens/step: the recipe's tokens_per_step, the same on any number of GPUs (which need not divide it: "
        "the step's rows are split as evenly as they go); tokens: x steps. micro-batch x accum: the most tokens one "
        "GPU computes at once and the micro-batches it accumulates per step (tokens/step <= micro-batch x accum x "
        "GPUs); data.tokens_per_batch: auto takes the largest micro-batch the card holds.",
    ]
    padded = [r for r in rows if r.get("padding_fraction")]
    for r in padded:
        notes.append(
            f"{r['job']}: GPU-hours of {r['counted_tokens']:.3g} non-pad tokens (tokens less the "
            f"{r['padding_fraction']:.1%} padding of the step its rate was measured on, which the rate does not count)."
        )
    if len(padded) < len(rows):
        notes.append(
            "GPU-hours: tokens (padding included) over the rate; the paper's rate counts the same way, a rate measured "
            "without its step's padding fraction counts the padding as tokens (a few % more hours)."
        )
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
    for r in rows:
        paper = r.get("paper")
        if paper and not 0.8 <= paper["recipe_over_paper"] <= 1.25:
            notes.append(
                f"{r['job']}: the paper trained this model on {paper['stated']} ({paper['gpu_hours']:,} GPU-hours), "
                f"about {paper['steps_in_that_time']:,} of the recipe's steps at the paper's own rate; the recipe trains "
                f"{r['steps']:,} (the base models' 60-epoch estimate: the paper gives this model's time, not its steps), "
                f"{paper['recipe_over_paper']}x that. For the paper's budget: --set optim.total_steps="
                f"{paper['steps_in_that_time']}."
            )
    return "\n".join(lines + notes) + "\n"


def _card_cell(card: dict) -> str:
    if "micro_batch" not in card:
        return "does not fit"
    if card["peak_gib"] is None:
        return f"{card['micro_batch']:,} x {card['accumulation']}, not estimated"
    cell = f"{card['micro_batch']:,} x {card['accumulation']}, {card['peak_gib']}"
    return cell if card["fits"] else cell + " (no)"
