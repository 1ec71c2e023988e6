"""The paper's downstream tables from evaluation TSVs (long format, one metric per row).

Each TSV comes with the table it feeds (``tape_contact``, ``raptorx_contact``, ``secondary_structure``,
``remote_homology``, ``unsupervised_contact``); the model column carries ``LABEL@DATASET``. Contact runs of
every head also feed the ablation table (long-range P@L by model x head x data). Each of our rows says in its
``precision`` column which arithmetic evaluated it (the TSVs' ``precision``: fp32 or bf16; ``–`` for TSVs written
before evaluation recorded it).
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from pmlm.errors import InputError
from pmlm.outputs import folder_target, writing_folder
from pmlm.reports import paper
from pmlm.reports.tables import Column, write_table
from pmlm.vocabulary import (
    CONTACT_TABLE_KINDS,
    RESULT_TABLES,
    TABLE_ABLATION,
    TABLE_KINDS,
    TABLE_RAPTORX_CONTACT,
    TABLE_REMOTE_HOMOLOGY,
    TABLE_SECONDARY_STRUCTURE,
    TABLE_TAPE_CONTACT,
    TABLE_UNSUPERVISED_CONTACT,
)

KINDS = TABLE_KINDS
# the tables `write_all` writes (OUT_DIR/<name>.md, .csv, .tex); the workflow declares its outputs from this
TABLES = RESULT_TABLES
RESULTS_COMMAND = "pmlm tables results"  # the writer of its --out-dir (pmlm.outputs)


def read_evaluation(path, required=("model", "head", "test_set", "metric", "value")) -> pd.DataFrame:
    """One evaluation TSV with its rows' ``label`` and ``data`` (the model column's LABEL@DATASET), ``features``
    and ``precision`` (``–`` where the TSV has none) and ``path``; a missing ``required`` column is an error."""
    try:
        df = pd.read_csv(path, sep="\t")
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise InputError(path, f"cannot read results TSV ({exc})") from None
    missing = set(required) - set(df.columns)
    if missing:
        raise InputError(path, f"results TSV lacks column(s) {', '.join(sorted(missing))}")
    parts = df["model"].astype(str).str.partition("@")  # LABEL@DATASET
    features = df["features"].astype(str) if "features" in df else "–"
    precision = df["precision"].astype(str) if "precision" in df else "–"
    return df.assign(label=parts[0], data=parts[2], features=features, precision=precision, path=str(path))


def read_results(kind_paths: list[tuple[str, str]]) -> pd.DataFrame:
    frames = []
    for kind, path in kind_paths:
        if kind not in KINDS:
            raise InputError(path, f"unknown table {kind!r}; one of {', '.join(KINDS)}")
        frames.append(read_evaluation(path).assign(kind=kind))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def _metric(df: pd.DataFrame, metric: str, test_set: str | None = None) -> float | None:
    sel = df[df["metric"] == metric]
    if test_set is not None:
        sel = sel[sel["test_set"] == test_set]
    if sel.empty:
        return None
    value = float(sel["value"].iloc[0])
    return None if math.isnan(value) else value


def _runs(df: pd.DataFrame, kinds: tuple[str, ...]):
    """(label, data, head, test_set, rows) per evaluated run and test set, in a stable order; a run's
    features are rows["features"]."""
    sub = df[df["kind"].isin(kinds)]
    for (label, data, head, _, test_set), rows in sub.groupby(
        ["label", "data", "head", "features", "test_set"], sort=True
    ):
        yield label, data, head, test_set, rows


def _n(rows: pd.DataFrame, metric: str) -> int | None:
    sel = rows[rows["metric"] == metric]
    return int(sel["n_proteins"].iloc[0]) if not sel.empty and "n_proteins" in sel else None


# which representation each row's head read: M (encoder outputs) or M+ (the pair head's first block)
FEATURES_COLUMN = Column("features", "features")
# the arithmetic that evaluated each of our rows (fp32, bf16), every table's last column; the paper's rows have none
PRECISION_COLUMN = Column("precision", "evaluated in")


def evaluated_in(rows: pd.DataFrame) -> str:
    """The precision of a row's evaluations: one name, or several joined by ``/`` if its TSVs differ."""
    return "/".join(sorted(set(rows["precision"])))


def contact_tables(df: pd.DataFrame, out_dir: Path, test_label: str) -> list[Path]:
    """The TAPE-Contact, RaptorX-Contact and ablation tables."""
    written = tape_contact_table(df, out_dir, test_label)
    written += raptorx_contact_table(df, out_dir, test_label)
    written += ablation_table(df, out_dir)
    return written


def tape_contact_table(df: pd.DataFrame, out_dir: Path, test_label: str) -> list[Path]:
    rows = [
        {
            "source": "paper",
            "model": r["model"],
            "data": r["data"],
            "test_set": "TAPE test",
            "head": "-" if r["model"] == "MSA baseline" else "linear",
            "features": r["features"],
            "p_l5_s12": r["p_l5_s12"] / 100,
        }
        for r in paper.TAPE_CONTACT_P_L5
    ]
    for label, data, head, test_set, runs in _runs(df, (TABLE_TAPE_CONTACT,)):
        rows.append(
            {
                "source": "ours",
                "model": label,
                "data": data,
                "head": head,
                "test_set": test_set,
                "precision": evaluated_in(runs),
                "features": runs["features"].iloc[0],
                "p_l5_s12": _metric(runs, "P@L/5_medium_long"),
                "p_l5_s6": _metric(runs, "P@L/5_tape_s6"),
                "p_l_long": _metric(runs, "P@L_long"),
                "n": _n(runs, "P@L/5_medium_long"),
            }
        )
    cols = [
        Column("model", "model"),
        Column("data", "data"),
        Column("head", "head"),
        FEATURES_COLUMN,
        Column("test_set", "test set"),
        Column("p_l5_s12", "P@L/5, s >= 12 (%)", "{:.1f}", percent=True),
        Column("p_l5_s6", "P@L/5, s >= 6 (TAPE's count, %)", "{:.1f}", percent=True),
        Column("p_l_long", "P@L, s >= 24 (%)", "{:.1f}", percent=True),
        Column("n", "proteins", "{:d}"),
        PRECISION_COLUMN,
    ]
    return write_table(
        rows,
        cols,
        out_dir / TABLE_TAPE_CONTACT,
        caption=(
            f"TAPE-Contact: precision of the top L/5 medium + long-range contacts (s >= 12), linear head on the outer "
            f"product and difference of pair representations; per protein, averaged. Ours on {test_label}."
        ),
    )


def raptorx_contact_table(df: pd.DataFrame, out_dir: Path, test_label: str) -> list[Path]:
    rows = [
        {
            "source": "paper",
            "model": r["model"],
            "features": r["features"],
            "p_l_long": r["p_l_long"] / 100,
            "test_set": "RaptorX test",
        }
        for r in paper.RAPTORX_LONG_P_L
    ]
    for label, data, head, test_set, runs in _runs(df, (TABLE_RAPTORX_CONTACT,)):
        rows.append(
            {
                "source": "ours",
                "model": label,
                "data": data,
                "head": head,
                "test_set": test_set,
                "precision": evaluated_in(runs),
                "features": runs["features"].iloc[0],
                "p_l_long": _metric(runs, "P@L_long"),
                "p_l2_long": _metric(runs, "P@L/2_long"),
                "p_l5_long": _metric(runs, "P@L/5_long"),
                "n": _n(runs, "P@L_long"),
            }
        )
    cols = [
        Column("model", "model"),
        Column("data", "data"),
        Column("head", "head"),
        FEATURES_COLUMN,
        Column("test_set", "test set"),
        Column("p_l_long", "P@L, s >= 24 (%)", "{:.1f}", percent=True),
        Column("p_l2_long", "P@L/2, s >= 24 (%)", "{:.1f}", percent=True),
        Column("p_l5_long", "P@L/5, s >= 24 (%)", "{:.1f}", percent=True),
        Column("n", "proteins", "{:d}"),
        PRECISION_COLUMN,
    ]
    return write_table(
        rows,
        cols,
        out_dir / TABLE_RAPTORX_CONTACT,
        caption=(
            f"RaptorX-Contact: long-range (s >= 24) precision at L with an 8-block 2-D ResNet head; per protein, averaged. "
            f"Ours on {test_label}."
        ),
    )


def ablation_table(df: pd.DataFrame, out_dir: Path) -> list[Path]:
    rows = [
        {"source": "paper", **r, "p_l_long": r["p_l_long"] / 100, "test_set": "RaptorX test"}
        for r in paper.ABLATION_LONG_P_L
    ]
    for label, data, head, test_set, runs in _runs(df, CONTACT_TABLE_KINDS):
        rows.append(
            {
                "source": "ours",
                "model": label,
                "head": head,
                "data": data,
                "test_set": test_set,
                "precision": evaluated_in(runs),
                "features": runs["features"].iloc[0],
                "p_l_long": _metric(runs, "P@L_long"),
            }
        )
    cols = [
        Column("model", "model"),
        Column("head", "head"),
        Column("data", "data"),
        FEATURES_COLUMN,
        Column("test_set", "test set"),
        Column("p_l_long", "P@L, s >= 24 (%)", "{:.1f}", percent=True),
        PRECISION_COLUMN,
    ]
    return write_table(
        rows,
        cols,
        out_dir / TABLE_ABLATION,
        caption=("Ablation: long-range precision at L by pre-training objective, head and data (paper: RaptorX test)."),
    )


def per_test_set_table(
    df: pd.DataFrame,
    kind: str,
    metric: str,
    paper_rows: list[dict],
    paper_sets: tuple[str, ...],
    out_dir: Path,
    caption: str,
) -> list[Path]:
    ours = df[(df["kind"] == kind) & (df["metric"] == metric)]
    test_sets = list(paper_sets) + sorted(set(ours["test_set"]) - set(paper_sets))
    rows = [
        {
            "source": "paper",
            "model": r["model"],
            "data": r["data"],
            "head": "-",
            "features": r["features"],
            **{s: r.get(s) for s in paper_sets},
        }
        for r in paper_rows
    ]
    for (label, data, head, features), runs in ours.groupby(["label", "data", "head", "features"], sort=True):
        rows.append(
            {
                "source": "ours",
                "model": label,
                "data": data,
                "head": head,
                "features": features,
                "precision": evaluated_in(runs),
                **{s: _metric(runs, metric, s) for s in set(runs["test_set"])},
            }
        )
    cols = [Column("model", "model"), Column("data", "data"), Column("head", "head"), FEATURES_COLUMN]
    cols += [Column(s, s, "{:.3f}") for s in test_sets]
    cols.append(PRECISION_COLUMN)
    return write_table(rows, cols, out_dir / kind, caption=caption)


def unsupervised_table(df: pd.DataFrame, out_dir: Path, test_label: str) -> list[Path]:
    rows = []
    for label, data, head, test_set, runs in _runs(df, (TABLE_UNSUPERVISED_CONTACT,)):
        rows.append(
            {
                "source": "ours",
                "model": label,
                "data": data,
                "head": head,
                "test_set": test_set,
                "precision": evaluated_in(runs),
                "p_l5_s12": _metric(runs, "P@L/5_medium_long"),
                "p_l_long": _metric(runs, "P@L_long"),
                "p_l5_long": _metric(runs, "P@L/5_long"),
                "p_l5_short": _metric(runs, "P@L/5_short"),
                "n": _n(runs, "P@L_long"),
            }
        )
    cols = [
        Column("model", "model"),
        Column("data", "data"),
        Column("head", "read-out"),
        Column("test_set", "test set"),
        Column("p_l5_short", "P@L/5 short (%)", "{:.1f}", percent=True),
        Column("p_l5_s12", "P@L/5, s >= 12 (%)", "{:.1f}", percent=True),
        Column("p_l5_long", "P@L/5 long (%)", "{:.1f}", percent=True),
        Column("p_l_long", "P@L long (%)", "{:.1f}", percent=True),
        Column("n", "proteins", "{:d}"),
        PRECISION_COLUMN,
    ]
    return write_table(
        rows,
        cols,
        out_dir / TABLE_UNSUPERVISED_CONTACT,
        caption=(
            "Unsupervised contacts from the pair head, no fine-tuning: KL(P(x_i)P(x_j) || P(x_i,x_j)) (or mutual "
            f"information) of the predicted joint, symmetrised, APC-corrected; same metrics as above, on {test_label}. "
            "The paper reports no such read-out."
        ),
    )


def write_all(
    kind_paths: list[tuple[str, str]],
    out_dir: str | Path,
    test_label: str = "the configured test sets",
    *,
    overwrite: bool = False,
) -> list[Path]:
    """Every table of TABLES into ``out_dir``, a folder of ``pmlm tables results`` (pmlm.outputs: checked before the
    TSVs are read, the tables appearing when all are written; ``overwrite`` as ``--overwrite``)."""
    out_dir = folder_target(out_dir, command=RESULTS_COMMAND, option="--out-dir", overwrite=overwrite)
    df = read_results(kind_paths)
    if df.empty:
        raise InputError(str(out_dir), "no results given")
    with writing_folder(out_dir, command=RESULTS_COMMAND, overwrite=overwrite) as staged:
        written = contact_tables(df, staged, test_label)
        written += per_test_set_table(
            df,
            TABLE_SECONDARY_STRUCTURE,
            "Q3",
            paper.SECONDARY_STRUCTURE_Q3,
            ("cb513", "casp12", "ts115"),
            staged,
            "Secondary structure: 3-state accuracy (Q3, pooled over residues) per test set.",
        )
        written += per_test_set_table(
            df,
            TABLE_REMOTE_HOMOLOGY,
            "top1",
            paper.REMOTE_HOMOLOGY,
            ("fold", "superfamily", "family"),
            staged,
            "Remote homology: top-1 fold accuracy on the fold / superfamily / family holdouts.",
        )
        written += unsupervised_table(df, staged, test_label)
    return [out_dir / path.name for path in written]
