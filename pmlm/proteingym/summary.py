"""``pmlm proteingym aggregate``: the per-assay metrics of every encoder, aggregated the way ProteinGym aggregates.

ProteinGym (``proteingym/performance_DMS_benchmarks.py``) does not average over assays: a protein with several
assays would weigh more, and so would the function categories with many proteins; the three levels (UniProt ID,
function category, overall) and the depth subsets: docs/proteingym.md, "How it works" (4.).

An assay whose metric is undefined (e.g. AUC when every mutant has the same ``DMS_score_bin``) is left out of
that metric's means, as pandas' ``mean`` leaves it out there. Every value comes with the number of assays,
proteins and mutants behind it.

Outputs: ``PREFIX.tsv``, long format: ``level`` (assay | uniprot | category | overall), ``key`` (the assay,
protein, category or ``overall``), ``encoder``, ``scorer`` (pair_joint | additive), ``subset`` (all | depth1 |
depth2 | depth3+), ``metric`` (spearman, spearman_p, auc, mcc, ndcg; epistasis_spearman for doubles),
``value``, ``n_assays``, ``n_proteins``, ``n_mutants``; and ``PREFIX_assays.tsv``, one row per encoder and
assay with its counts (rows read, mutants scored, skipped, doubles from the pair joint) and cost. ``Levels``
reads both back for the tables (``pmlm.proteingym.tabulate``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from pmlm.errors import InputError
from pmlm.files import atomic_output
from pmlm.proteingym import published
from pmlm.proteingym.reference import read_selection

METRICS = ("spearman", "auc", "mcc", "ndcg")
LEVEL_COLUMNS = (
    "level",
    "key",
    "encoder",
    "scorer",
    "subset",
    "metric",
    "value",
    "n_assays",
    "n_proteins",
    "n_mutants",
)
COUNT_COLUMNS = (
    "encoder",
    "DMS_id",
    "UniProt_ID",
    "category",
    "seq_len",
    "rows",
    "scored",
    "skipped",
    "doubles",
    "doubles_pair_joint",
    "higher_order",
    "forward_passes",
    "seconds",
)
GROUP = ["encoder", "scorer", "subset", "metric"]
SCORERS = ("pair_joint", "additive")  # the scorer column's values, in the order the tables list them


def _read_summary(path: Path) -> dict:
    if not path.is_file():
        raise InputError(path, "no such file (the assay's scores are missing)")
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(path, f"not a score summary ({exc})") from None


def assay_rows(encoders: list[tuple[str, str]], selection_path: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per-assay metric rows, per-assay counts) of every encoder (label, folder of ``<DMS_id>.json``) on every
    assay of the selection."""
    assays = read_selection(selection_path)
    metric_rows, count_rows = [], []
    for label, folder in encoders:
        for assay in assays:
            path = Path(folder) / f"{assay.dms_id}.json"
            doc = _read_summary(path)
            if doc.get("assay", {}).get("DMS_id") != assay.dms_id:
                held = doc.get("assay", {}).get("DMS_id")
                raise InputError(path, f"holds the scores of {held!r}, not {assay.dms_id!r}")
            base = {"encoder": label, "key": assay.dms_id, "uniprot": assay.uniprot, "category": assay.category}
            for scorer, subsets in doc["metrics"].items():
                for subset, entry in subsets.items():
                    for metric in (*METRICS, "spearman_p"):
                        if entry.get("n"):
                            metric_rows.append(
                                {
                                    **base,
                                    "scorer": scorer,
                                    "subset": subset,
                                    "metric": metric,
                                    "value": entry.get(metric),
                                    "n_mutants": entry["n"],
                                }
                            )
            epistasis = doc.get("epistasis") or {}
            if epistasis.get("n"):
                metric_rows.append(
                    {
                        **base,
                        "scorer": "pair_joint",
                        "subset": "depth2",
                        "metric": "epistasis_spearman",
                        "value": epistasis.get("spearman"),
                        "n_mutants": epistasis["n"],
                    }
                )
            counts = doc["counts"]
            count_rows.append(
                {
                    "encoder": label,
                    "DMS_id": assay.dms_id,
                    "UniProt_ID": assay.uniprot,
                    "category": assay.category,
                    "seq_len": len(assay.target_seq),
                    "rows": counts["rows"],
                    "scored": counts["scored"],
                    "skipped": sum(counts["skipped"].values()),
                    "doubles": counts["depth"].get("2", 0),
                    "doubles_pair_joint": counts["doubles_from"].get("pair_joint", 0),
                    "higher_order": sum(n for d, n in counts["depth"].items() if int(d) >= 3),
                    "forward_passes": doc["cost"]["forward_passes"],
                    "seconds": doc["cost"]["seconds"],
                }
            )
    frame = pd.DataFrame(
        metric_rows,
        columns=["encoder", "key", "uniprot", "category", "scorer", "subset", "metric", "value", "n_mutants"],
    )
    frame["value"] = pd.to_numeric(frame["value"], errors="coerce")
    return frame, pd.DataFrame(count_rows, columns=list(COUNT_COLUMNS))


def aggregate(per_assay: pd.DataFrame) -> pd.DataFrame:
    """The four levels of the module docstring from per-assay rows (``assay_rows``' first frame)."""
    valid = per_assay.dropna(subset=["value"])
    levels = [valid.assign(level="assay", n_assays=1, n_proteins=1)]
    means = valid[valid["metric"] != "spearman_p"]  # p-values are per assay; their mean is not one
    protein = (
        means.groupby([*GROUP, "uniprot"], sort=True)
        .agg(value=("value", "mean"), n_assays=("key", "size"), n_mutants=("n_mutants", "sum"))
        .reset_index()
    )
    levels.append(protein.rename(columns={"uniprot": "key"}).assign(level="uniprot", n_proteins=1))
    groups = (
        means.groupby([*GROUP, "uniprot", "category"], sort=True)
        .agg(value=("value", "mean"), n_assays=("key", "size"), n_mutants=("n_mutants", "sum"))
        .reset_index()
    )
    category = (
        groups.groupby([*GROUP, "category"], sort=True)
        .agg(
            value=("value", "mean"),
            n_assays=("n_assays", "sum"),
            n_proteins=("uniprot", "nunique"),
            n_mutants=("n_mutants", "sum"),
        )
        .reset_index()
    )
    levels.append(category.rename(columns={"category": "key"}).assign(level="category"))
    overall = []
    for keys, part in groups.groupby(GROUP, sort=True):
        subset = keys[GROUP.index("subset")]
        cats = category
        for column, value in zip(GROUP, keys):
            cats = cats[cats[column] == value]
        # the headline is the mean over categories; depth subsets average the (protein, category) groups
        value = cats["value"].mean() if subset == "all" else part["value"].mean()
        overall.append(
            {
                **dict(zip(GROUP, keys)),
                "key": "overall",
                "level": "overall",
                "value": value,
                "n_assays": int(part["n_assays"].sum()),
                "n_proteins": int(part["uniprot"].nunique()),
                "n_mutants": int(part["n_mutants"].sum()),
            }
        )
    levels.append(pd.DataFrame(overall))
    out = pd.concat(levels, ignore_index=True)
    return out[list(LEVEL_COLUMNS)]


def write_tsv(path, frame: pd.DataFrame) -> None:
    with atomic_output(path) as tmp:
        frame.to_csv(tmp, sep="\t", index=False, float_format="%.6g")


def _read_tsv(path: str | Path, columns, what: str) -> pd.DataFrame:
    try:
        frame = pd.read_csv(path, sep="\t")
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise InputError(path, f"cannot read the {what} ({exc})") from None
    missing = set(columns) - set(frame.columns)
    if missing:
        raise InputError(path, f"no column(s) {', '.join(sorted(missing))}: not written by pmlm proteingym aggregate")
    return frame


def read_levels(path: str | Path) -> pd.DataFrame:
    return _read_tsv(path, LEVEL_COLUMNS, "aggregated metrics")


def read_counts(path: str | Path) -> pd.DataFrame:
    return _read_tsv(path, COUNT_COLUMNS, "per-assay counts")


def aggregate_scores(encoders: list[tuple[str, str]], assays: str | Path, out_prefix: str | Path) -> pd.DataFrame:
    """ProteinGym's aggregation of the per-assay summaries in each encoder's folder ((label, folder) pairs) over the
    selection ``assays``: writes PREFIX.tsv (every level) and PREFIX_assays.tsv (the counts); returns the counts."""
    per_assay, counts = assay_rows(encoders, assays)
    levels = aggregate(per_assay)
    prefix = str(out_prefix)
    write_tsv(prefix + "_assays.tsv", counts)
    write_tsv(prefix + ".tsv", levels)
    return counts


class Levels:
    """Lookup of ``pmlm proteingym aggregate``'s long table and its counts, as ``pmlm proteingym tables`` reads them."""

    def __init__(self, frame: pd.DataFrame, counts: pd.DataFrame):
        self.frame = frame
        self.counts = counts  # pmlm proteingym aggregate's PREFIX_assays.tsv
        self._rows = {
            tuple(r[c] for c in ("level", "key", "encoder", "scorer", "subset", "metric")): r
            for r in frame.to_dict("records")
        }

    def get(self, level: str, key: str, encoder: str, scorer: str, subset: str, metric: str) -> dict | None:
        return self._rows.get((level, key, encoder, scorer, subset, metric))

    def value(self, *args) -> float | None:
        row = self.get(*args)
        return None if row is None or pd.isna(row["value"]) else float(row["value"])

    def runs(self) -> list[tuple[str, str]]:
        """(encoder, scorer) in a stable order: encoders as given, the pair joint before additive."""
        pairs = self.frame[["encoder", "scorer"]].drop_duplicates()
        order = {s: k for k, s in enumerate(SCORERS)}
        encoders = list(dict.fromkeys(pairs["encoder"]))
        return sorted(map(tuple, pairs.values.tolist()), key=lambda p: (encoders.index(p[0]), order.get(p[1], 9)))

    def assays_in(self, category: str, encoder: str) -> set[str]:
        c = self.counts
        return set(c.loc[(c["category"] == category) & (c["encoder"] == encoder), "DMS_id"])

    def assays_scored(self) -> int:
        """Assays scored (every encoder scores every selected assay)."""
        return int(self.counts["DMS_id"].nunique())

    def categories(self) -> list[str]:
        found = set(self.frame.loc[self.frame["level"] == "category", "key"])
        return [c for c in published.CATEGORIES if c in found] + sorted(found - set(published.CATEGORIES))
