"""The table of one downstream task outside the paper's tables (TAPE's fluorescence and stability, a user's own
task): every evaluated encoder x head x test set as a row, the task's metrics as columns (``Task.metric_names``:
Spearman, Pearson and MSE for a value; accuracy and macro-F1 for a class; accuracy per residue), TAPE's published
rows beside ours where TAPE reports the task.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from pmlm.errors import InputError
from pmlm.outputs import prefix_targets
from pmlm.reports.results import FEATURES_COLUMN, PRECISION_COLUMN, evaluated_in, read_evaluation
from pmlm.reports.staging import staged, staged_outputs
from pmlm.reports.tables import TABLE_SUFFIXES, Column, write_table
from pmlm.tasks.registry import task_named
from pmlm.vocabulary import TASK_FLUORESCENCE, TASK_STABILITY

# TAPE's Table 2 (Rao et al., NeurIPS 2019), Spearman's rho on the test sets, its pre-trained models and baselines
PUBLISHED: dict[str, list[dict]] = {
    TASK_FLUORESCENCE: [
        {"model": "TAPE Transformer", "spearman": 0.68},
        {"model": "TAPE LSTM", "spearman": 0.67},
        {"model": "TAPE ResNet", "spearman": 0.21},
        {"model": "UniRep", "spearman": 0.67},
        {"model": "one-hot", "spearman": 0.14},
    ],
    TASK_STABILITY: [
        {"model": "TAPE Transformer", "spearman": 0.73},
        {"model": "TAPE LSTM", "spearman": 0.69},
        {"model": "TAPE ResNet", "spearman": 0.73},
        {"model": "UniRep", "spearman": 0.73},
        {"model": "one-hot", "spearman": 0.19},
    ],
}
ERROR_FORMAT = {"mse": "{:.3g}"}
REQUIRED = ("model", "task", "head", "features", "test_set", "metric", "value", "n_proteins")


def read_task_results(paths: list[str | Path]) -> pd.DataFrame:
    if not paths:
        raise InputError("--result", "no results given")
    return pd.concat([read_evaluation(path, REQUIRED) for path in paths], ignore_index=True)


def _value(rows: pd.DataFrame, metric: str) -> float | None:
    sel = rows[rows["metric"] == metric]
    if sel.empty:
        return None
    value = float(sel["value"].iloc[0])
    return None if math.isnan(value) else value


def write_task_table(
    paths: list[str | Path], prefix: str | Path, title: str | None = None, *, overwrite: bool = False
) -> list[Path]:
    """PREFIX.csv / .md / .tex / .html of one task's evaluation TSVs (all of one task); prefix targets
    (pmlm.outputs; ``overwrite`` as ``--overwrite``)."""
    targets = prefix_targets(prefix, TABLE_SUFFIXES, overwrite=overwrite)
    df = read_task_results(paths)
    names = sorted(set(df["task"].astype(str)))
    if len(names) != 1:
        raise InputError(paths[0], f"a task table holds one task; these TSVs hold {', '.join(names)}")
    task = task_named(names[0], key="the TSVs' task")
    rows = [{"source": "paper", "test_set": "test", **r} for r in PUBLISHED.get(task.name, [])]
    groups = df.groupby(["label", "data", "head", "features", "test_set"], sort=True)
    for (label, data, head, features, test_set), runs in groups:
        headline = runs[runs["metric"] == task.headline]
        rows.append(
            {
                "source": "ours",
                "model": label,
                "data": data,
                "head": head,
                "features": features,
                "test_set": test_set,
                **{m: _value(runs, m) for m in task.metric_names},
                "n": int(headline["n_proteins"].iloc[0]) if not headline.empty else None,
                "precision": evaluated_in(runs),
            }
        )
    cols = [Column("model", "model"), Column("data", "data"), Column("head", "head"), FEATURES_COLUMN]
    # correlations and accuracies to 3 decimals; an error in the value's own unit to 3 significant digits
    cols += [Column("test_set", "test set")] + [Column(m, m, ERROR_FORMAT.get(m, "{:.3f}")) for m in task.metric_names]
    cols += [Column("n", "proteins"), PRECISION_COLUMN]
    caption = title or f"{task.name} ({task.kind}): {', '.join(task.metric_names)} on each test set"
    with staged_outputs(targets) as folder:
        write_table(rows, cols, staged(folder, prefix), caption=caption)
    return targets
