"""The pre-training table (``pmlm tables pretrain-scores``): validation losses and accuracies of our encoders,
read from their sidecars, beside the paper's rows."""

from __future__ import annotations

from pmlm.artefacts import read_encoder_info
from pmlm.model.objective_registry import objective_named
from pmlm.outputs import prefix_targets
from pmlm.pretrained import encoder_parameters
from pmlm.reports import paper
from pmlm.reports.staging import staged, staged_outputs
from pmlm.reports.tables import TABLE_SUFFIXES, Column, write_table

PRETRAIN_COLUMNS = [
    Column("model", "model"),
    Column("data", "data"),
    Column("params", "params"),
    Column("step", "steps", "{:d}"),
    Column("l_mlm", "L_mlm", "{:.4f}"),
    Column("l_pmlm", "L_pmlm", "{:.4f}"),
    Column("acc_mlm", "Acc_mlm (%)", "{:.1f}", percent=True),
    Column("acc_pmlm", "Acc_pmlm (%)", "{:.1f}", percent=True),
    Column("dacc", "dAcc (%)", "{:.2f}", percent=True),
    Column("dacc_ratio", "dAcc / Acc_pmlm (%)", "{:.1f}", percent=True),
]


SCORES = ("l_mlm", "l_pmlm", "acc_mlm", "acc_pmlm", "dacc")  # an encoder's columns from its final scores


def dacc_ratio(row: dict) -> float | None:
    """The paper's dAcc / Acc_pmlm: the share of the pair accuracy that independent tokens would not give
    (dAcc = Acc_pmlm - Acc_mlm^2); None where either is missing or Acc_pmlm is 0."""
    if row.get("dacc") is None or not row.get("acc_pmlm"):
        return None
    return row["dacc"] / row["acc_pmlm"]


def _params_label(info: dict, weights: str) -> str:
    """Parameter count of the described model, without reading its weights (pmlm.pretrained.encoder_parameters)."""
    n = encoder_parameters(info, weights)
    return f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.0f}K"


def pretrain_rows(entries: list[tuple[str, str, str]]) -> list[dict]:
    """entries: (label, dataset, weights path); scores come from the weights' .json sidecar."""
    rows = [{"source": "paper", **r} for r in paper.PRETRAIN_SCORES]  # dAcc / Acc_pmlm from the reported numbers
    for label, dataset, weights in entries:
        info = read_encoder_info(weights)
        scores = info["final_scores"]
        shown = objective_named(info["objective"]["name"]).table_scores
        ours = {k: scores.get(k) if k in shown else None for k in SCORES}
        rows.append(
            {
                "source": "ours",
                "model": label,
                "data": dataset,
                "params": _params_label(info, weights),
                "step": scores["step"],
                **ours,
            }
        )
    return [{**row, "dacc_ratio": dacc_ratio(row)} for row in rows]


def write_pretrain_scores(entries: list[tuple[str, str, str]], out_prefix: str, *, overwrite: bool = False) -> list:
    """The table of ``entries`` (label, dataset, weights) beside the paper's rows, as PREFIX.csv / .md / .tex /
    .html (prefix targets, pmlm.outputs; ``overwrite`` as ``--overwrite``); returns the paths written."""
    targets = prefix_targets(out_prefix, TABLE_SUFFIXES, overwrite=overwrite)
    rows = pretrain_rows(entries)
    caption = (
        "Validation losses and accuracies of pre-training (paper rows: 60 epochs on Pfam / UR50; "
        "ours: this run's final validation, per masked residue / masked pair)"
    )
    with staged_outputs(targets) as folder:
        write_table(rows, PRETRAIN_COLUMNS, staged(folder, out_prefix), caption=caption)
    return targets
