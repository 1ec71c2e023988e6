"""Training curves from the ``metrics.csv`` logs of pre-training and fine-tuning runs (one row per logged
step; ``split`` is ``train`` or ``valid``), drawn for the workflow report."""

from __future__ import annotations

import csv
import math
from pathlib import Path

from pmlm.choices import Choice
from pmlm.errors import InputError
from pmlm.figures import FORMATS, pyplot, save_figure
from pmlm.outputs import prefix_targets
from pmlm.reports.staging import staged, staged_outputs


class Curves(Choice):
    """Whose curves are drawn (``pmlm report curves --kind``)."""

    PRETRAIN = "pretrain"  # L_mlm, L_pmlm, Acc_mlm, Acc_pmlm
    FINETUNE = "finetune"  # loss and the validation metric


# (column, panel title): pre-training logs L_mlm / Acc_mlm per masked residue, L_pmlm / Acc_pmlm per masked pair
PRETRAIN_PANELS = (
    ("l_mlm", "L_mlm (per masked residue)"),
    ("l_pmlm", "L_pmlm (per masked pair)"),
    ("acc_mlm", "Acc_mlm"),
    ("acc_pmlm", "Acc_pmlm"),
)


def read_metrics(path: str | Path) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """{split: {column: [(step, value), ...]}}, numeric columns only, empty cells skipped; a step logged
    twice (a resumed run logs again from its checkpoint) keeps its last row."""
    path = Path(path)
    try:
        fh = open(path, newline="")
    except OSError as exc:
        raise InputError(path, f"cannot read metrics log ({exc.strerror})") from None
    rows: dict[str, dict[int, dict[str, float]]] = {}
    with fh:
        reader = csv.DictReader(fh)
        missing = {"split", "step"} - set(reader.fieldnames or ())
        if missing:
            raise InputError(path, f"not a metrics log: no column(s) {', '.join(sorted(missing))}", line=1)
        for row in reader:
            try:
                step = int(row["step"])
                values = {k: float(v) for k, v in row.items() if k not in ("split", "step", "metric") and v}
            except (TypeError, ValueError) as exc:
                raise InputError(path, f"bad number ({exc})", line=reader.line_num) from None
            if row.get("metric"):  # fine-tuning's validation rows name their metric
                values[f"metric:{row['metric']}"] = values.get("value", math.nan)
            rows.setdefault(row["split"], {})[step] = values
    if not rows:
        raise InputError(path, "metrics log has no rows")
    out: dict[str, dict[str, list[tuple[int, float]]]] = {}
    for split, by_step in rows.items():
        series = out.setdefault(split, {})
        for step in sorted(by_step):
            for key, value in by_step[step].items():
                if not math.isnan(value):
                    series.setdefault(key, []).append((step, value))
    return out


def _line(ax, points, **style) -> bool:
    if not points:
        return False
    steps, values = zip(*points)
    ax.plot(steps, values, **style)
    return True


def plot_pretrain(runs: list[tuple[str, dict]], prefix: str | Path) -> list[Path]:
    """2 x 2 panels (L_mlm, L_pmlm, Acc_mlm, Acc_pmlm): thin lines train, dots and dashes validation."""
    plt = pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(10, 7), sharex=True)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (column, title) in zip(axes.flat, PRETRAIN_PANELS):
        drawn = False
        for k, (label, log) in enumerate(runs):
            colour = colours[k % len(colours)]
            drawn |= _line(
                ax, log.get("train", {}).get(column), color=colour, linewidth=1, alpha=0.7, label=f"{label} train"
            )
            drawn |= _line(
                ax, log.get("valid", {}).get(column), color=colour, linestyle="--", marker="o", label=f"{label} valid"
            )
        ax.set_title(title, fontsize=10)
        if drawn:
            ax.legend(fontsize=7)
        else:
            _empty(ax, "no run logs this (MLM runs have no pair head)")
    for ax in axes[1]:
        ax.set_xlabel("optimizer step")
    fig.suptitle("Pre-training curves", fontsize=11)
    fig.tight_layout()
    return save_figure(fig, prefix)


def _empty(ax, why: str) -> None:
    """Say in an empty panel why nothing is drawn there."""
    ax.text(0.5, 0.5, why, ha="center", va="center", transform=ax.transAxes, fontsize=8, color="grey")


def plot_finetune(runs: list[tuple[str, dict]], prefix: str | Path) -> list[Path]:
    """Training loss per run (left) and each run's validation metric (right)."""
    plt = pyplot()
    fig, (loss_ax, metric_ax) = plt.subplots(1, 2, figsize=(11, 4.2))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    metric_drawn = False
    for k, (label, log) in enumerate(runs):
        colour = colours[k % len(colours)]
        _line(loss_ax, log.get("train", {}).get("loss"), color=colour, linewidth=1, label=label)
        for key, points in log.get("valid", {}).items():
            if key.startswith("metric:"):
                metric_drawn |= _line(
                    metric_ax,
                    points,
                    color=colour,
                    linestyle="--",
                    marker="o",
                    label=f"{label}: {key[len('metric:') :]}",
                )
    loss_ax.set_yscale("log")  # cross-entropy of 3 classes and a contact map's binary loss differ ten-fold
    loss_ax.set_title("training loss", fontsize=10)
    loss_ax.set_xlabel("optimizer step")
    loss_ax.legend(fontsize=7)
    metric_ax.set_title("validation metric", fontsize=10)
    metric_ax.set_xlabel("optimizer step")
    if metric_drawn:
        metric_ax.legend(fontsize=7)
    else:
        _empty(metric_ax, "no validation during fine-tuning (eval_every: 0)")
    fig.suptitle("Fine-tuning curves", fontsize=11)
    fig.tight_layout()
    return save_figure(fig, prefix)


def write_curves(
    kind: Curves, runs: list[tuple[str, str]], prefix: str | Path, *, overwrite: bool = False
) -> list[Path]:
    """kind ``pretrain`` or ``finetune``; runs: (label, metrics.csv); PREFIX.png and .svg are prefix targets
    (pmlm.outputs; ``overwrite`` as ``--overwrite``)."""
    targets = prefix_targets(prefix, FORMATS, overwrite=overwrite)
    logs = [(label, read_metrics(path)) for label, path in runs]
    with staged_outputs(targets) as folder:
        {Curves.PRETRAIN: plot_pretrain, Curves.FINETUNE: plot_finetune}[kind](logs, staged(folder, prefix))
    return targets
