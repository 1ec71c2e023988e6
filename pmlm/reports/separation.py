"""Contact precision by sequence separation (short / medium / long, the ranges of
``pmlm.evaluation.metrics.CONTACT_RANGES``) for every evaluated contact run: a figure and a table."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from pmlm.errors import InputError
from pmlm.evaluation.metrics import CONTACT_RANGES, TOP_K_DIVISORS
from pmlm.figures import FORMATS, pyplot, save_figure
from pmlm.outputs import prefix_targets
from pmlm.reports.results import PRECISION_COLUMN, evaluated_in, read_results
from pmlm.reports.staging import staged, staged_outputs
from pmlm.reports.tables import TABLE_SUFFIXES, Column, write_table
from pmlm.vocabulary import TASK_CONTACT

RANGES = ("short", "medium", "long")


def range_label(name: str) -> str:
    lo, hi = CONTACT_RANGES[name]
    return f"{name} ({lo} <= s < {hi})" if hi is not None else f"{name} (s >= {lo})"


def precision_rows(kind_paths: list[tuple[str, str]]) -> list[dict]:
    """One row per (model, data, head, test set) of the contact task: P@L/k per range, as fractions."""
    df = read_results(kind_paths)
    df = df[df["task"] == TASK_CONTACT] if "task" in df else df.iloc[0:0]
    if df.empty:
        raise InputError(kind_paths[0][1] if kind_paths else "-", "no contact results among the given TSVs")
    rows = []
    for (label, data, head, test_set), runs in df.groupby(["label", "data", "head", "test_set"], sort=True):
        values = dict(zip(runs["metric"], runs["value"].astype(float)))
        row = {
            "source": "ours",
            "model": label,
            "data": data,
            "head": head,
            "test_set": test_set,
            "precision": evaluated_in(runs),
            "n": int(runs["n_proteins"].iloc[0]) if "n_proteins" in runs else None,
        }
        for div in TOP_K_DIVISORS:
            for name in RANGES:
                value = values.get(f"P@{div}_{name}")
                row[f"P@{div}_{name}"] = None if value is None or math.isnan(value) else value
        rows.append(row)
    return rows


def write_table_files(rows: list[dict], prefix: str | Path) -> list[Path]:
    cols = [Column("model", "model"), Column("data", "data"), Column("head", "head"), Column("test_set", "test set")]
    cols += [
        Column(f"P@{div}_{name}", f"P@{div} {name} (%)", "{:.1f}", percent=True)
        for div in ("L", "L/5")
        for name in RANGES
    ]
    cols += [Column("n", "proteins", "{:d}"), PRECISION_COLUMN]
    ranges = "; ".join(range_label(name) for name in RANGES)
    caption = (
        f"Contact precision by separation s = j - i: {ranges}. Per protein, the top floor(L/k) pairs of the "
        "range by score, averaged over proteins; L the sequence length."
    )
    return write_table(rows, cols, prefix, caption=caption)


def plot(rows: list[dict], prefix: str | Path) -> list[Path]:
    """One panel per P@L/k; groups short / medium / long, one bar per evaluated run."""
    plt = pyplot()
    fig, axes = plt.subplots(1, len(TOP_K_DIVISORS), figsize=(4.2 * len(TOP_K_DIVISORS), 4.2), sharey=True)
    x = np.arange(len(RANGES))
    width = 0.8 / max(len(rows), 1)
    for ax, div in zip(axes, TOP_K_DIVISORS):
        for k, row in enumerate(rows):
            values = [row[f"P@{div}_{name}"] for name in RANGES]
            ax.bar(
                x + (k - (len(rows) - 1) / 2) * width,
                [np.nan if v is None else v for v in values],
                width,
                label=f"{row['model']} {row['head']} ({row['test_set']})",
            )
        ax.set_xticks(x, [range_label(name).replace(" (", "\n(") for name in RANGES], fontsize=8)
        ax.set_title(f"P@{div}", fontsize=10)
    axes[0].set_ylabel("precision")
    handles, labels = axes[0].get_legend_handles_labels()
    columns = min(len(labels), 4)
    fig.legend(handles, labels, loc="lower center", ncol=columns, fontsize=8, frameon=False)
    fig.suptitle("Contact precision by sequence separation", fontsize=11)
    fig.tight_layout(rect=(0, 0.05 * -(-len(labels) // columns), 1, 1))  # room for the legend rows below
    return save_figure(fig, prefix)


def write_precision_by_separation(
    kind_paths: list[tuple[str, str]], figure_prefix: str | Path, table_prefix: str | Path, *, overwrite: bool = False
) -> list[Path]:
    """The table at ``table_prefix`` (.csv / .md / .tex / .html) and the figure at ``figure_prefix`` (.png, .svg):
    prefix targets, appearing together (pmlm.outputs; ``overwrite`` as ``--overwrite``)."""
    table_option = "--out-prefix" if str(table_prefix) == str(figure_prefix) else "--table-prefix"
    figures = prefix_targets(figure_prefix, FORMATS, overwrite=overwrite)
    tables = prefix_targets(table_prefix, TABLE_SUFFIXES, option=table_option, overwrite=overwrite)
    rows = precision_rows(kind_paths)
    with staged_outputs(tables + figures) as folder:
        write_table_files(rows, staged(folder, table_prefix))
        plot(rows, staged(folder, figure_prefix))
    return tables + figures
