"""``pmlm proteingym tables``: the benchmark's tables beside the published models (``pmlm.proteingym.published``), and
its figures, from ``pmlm proteingym aggregate``'s outputs: ``PREFIX``, ``PREFIX_categories``, ``PREFIX_assays``,
``PREFIX_doubles`` (CSV, Markdown, LaTeX, HTML; ``pmlm.reports.tables``) and ``FIGURE_categories``,
``FIGURE_doubles`` (PNG + SVG). What each holds: docs/proteingym.md, "How it works" (5.).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from pmlm.figures import pyplot, save_figure
from pmlm.proteingym import published
from pmlm.proteingym.summary import Levels, read_counts, read_levels
from pmlm.reports.tables import Column, write_table

SCORER_LABELS = {"pair_joint": "pair joint", "additive": "additive"}
METRIC_TITLES = {"spearman": "Spearman", "auc": "AUC", "mcc": "MCC", "ndcg": "NDCG"}
CATEGORY_SHORT = {"OrganismalFitness": "Org. fitness"}


def _published_note(n_assays: int) -> str:
    comparable = n_assays == published.SOURCE_ASSAYS
    return (
        f"Published rows: {published.SOURCE}. Ours on {n_assays} assay(s)"
        + (
            ""
            if comparable
            else f", not the benchmark's {published.SOURCE_ASSAYS}: compare with the published "
            "rows only when all of them are scored"
        )
        + "."
    )


def headline_rows(levels: Levels) -> list[dict]:
    rows = []
    for p in published.rows():
        v = p["values"]
        rows.append(
            {
                "source": "published",
                "model": p["model"],
                "type": p["type"],
                "doubles": None,
                "assays": published.SOURCE_ASSAYS,
                "proteins": published.SOURCE_PROTEINS,
                "mutants": published.SOURCE_MUTANTS,
                **{m: v[m]["average"] for m in published.METRICS},
                **{f"spearman_{c}": v["spearman"][c] for c in published.CATEGORIES},
                "spearman_depth1": v["spearman"]["depth1"],
                "spearman_depth2": v["spearman"]["depth2"],
            }
        )
    for encoder, scorer in levels.runs():
        main = levels.get("overall", "overall", encoder, scorer, "all", "spearman") or {}
        row = {
            "source": "ours",
            "model": encoder,
            "type": "single sequence",
            "doubles": SCORER_LABELS.get(scorer, scorer),
            "assays": main.get("n_assays"),
            "proteins": main.get("n_proteins"),
            "mutants": main.get("n_mutants"),
        }
        row.update({m: levels.value("overall", "overall", encoder, scorer, "all", m) for m in published.METRICS})
        row.update(
            {
                f"spearman_{c}": levels.value("category", c, encoder, scorer, "all", "spearman")
                for c in levels.categories()
            }
        )
        for subset in ("depth1", "depth2"):
            row[f"spearman_{subset}"] = levels.value("overall", "overall", encoder, scorer, subset, "spearman")
        rows.append(row)
    return rows


def headline_table(levels: Levels, prefix: Path) -> list[Path]:
    rows = headline_rows(levels)
    categories = list(dict.fromkeys([*published.CATEGORIES, *levels.categories()]))
    cols = [
        Column("model", "model"),
        Column("type", "type"),
        Column("doubles", "doubles from"),
        Column("assays", "assays", "{:d}"),
        Column("proteins", "proteins", "{:d}"),
        Column("mutants", "mutants", "{:,d}"),
    ]
    cols += [Column(m, METRIC_TITLES[m], "{:.3f}") for m in published.METRICS]
    cols += [Column(f"spearman_{c}", f"Spearman {c}", "{:.3f}") for c in categories]
    cols += [
        Column("spearman_depth1", "Spearman singles", "{:.3f}"),
        Column("spearman_depth2", "Spearman doubles", "{:.3f}"),
    ]
    caption = (
        "Zero-shot fitness prediction on ProteinGym's substitution assays: Spearman with DMS_score, AUC with "
        "DMS_score_bin, MCC of score >= median against DMS_score_bin, NDCG of the top 10 %; each averaged per "
        "UniProt ID, then per function category, then over categories (ProteinGym's aggregation); singles / "
        "doubles: Spearman on the mutants with one / two sites, averaged over (UniProt ID, category) groups. "
        "Doubles from: the pair head's joint or the sum of single-site masked marginals (3+ sites: always the "
        "sum). " + _published_note(levels.assays_scored())
    )
    return write_table(rows, cols, prefix, caption=caption)


def category_table(levels: Levels, prefix: Path) -> list[Path]:
    rows = []
    for p in published.rows():
        for c in published.CATEGORIES:
            rows.append(
                {
                    "source": "published",
                    "model": p["model"],
                    "doubles": None,
                    "category": c,
                    **{m: p["values"][m][c] for m in published.METRICS},
                }
            )
    for encoder, scorer in levels.runs():
        for c in levels.categories():
            main = levels.get("category", c, encoder, scorer, "all", "spearman") or {}
            rows.append(
                {
                    "source": "ours",
                    "model": encoder,
                    "doubles": SCORER_LABELS.get(scorer, scorer),
                    "category": c,
                    "proteins": main.get("n_proteins"),
                    "assays": main.get("n_assays"),
                    "mutants": main.get("n_mutants"),
                    **{m: levels.value("category", c, encoder, scorer, "all", m) for m in published.METRICS},
                }
            )
    cols = [
        Column("model", "model"),
        Column("doubles", "doubles from"),
        Column("category", "category"),
        Column("proteins", "proteins", "{:d}"),
        Column("assays", "assays", "{:d}"),
        Column("mutants", "mutants", "{:,d}"),
    ] + [Column(m, METRIC_TITLES[m], "{:.3f}") for m in published.METRICS]
    return write_table(
        rows,
        cols,
        prefix,
        caption=(
            "ProteinGym metrics per function category (coarse_selection_type): the mean over the (UniProt ID, category) "
            "groups of each category. " + _published_note(levels.assays_scored())
        ),
    )


def assay_table(levels: Levels, prefix: Path) -> list[Path]:
    rows = []
    for encoder, scorer in levels.runs():
        for r in levels.counts[levels.counts["encoder"] == encoder].to_dict("records"):
            key = r["DMS_id"]
            rows.append(
                {
                    "source": "ours",
                    "model": encoder,
                    "doubles": SCORER_LABELS.get(scorer, scorer),
                    "assay": key,
                    "category": r["category"],
                    "length": r["seq_len"],
                    "scored": r["scored"],
                    "skipped": r["skipped"],
                    "multi": r["doubles"] + r["higher_order"],
                    **{m: levels.value("assay", key, encoder, scorer, "all", m) for m in published.METRICS},
                    "p": levels.value("assay", key, encoder, scorer, "all", "spearman_p"),
                }
            )
    cols = [
        Column("model", "model"),
        Column("doubles", "doubles from"),
        Column("assay", "assay (DMS_id)"),
        Column("category", "category"),
        Column("length", "length", "{:d}"),
        Column("scored", "mutants", "{:,d}"),
        Column("skipped", "skipped", "{:d}"),
        Column("multi", "with 2+ sites", "{:,d}"),
    ]
    cols += [Column(m, METRIC_TITLES[m], "{:.3f}") for m in published.METRICS]
    cols.append(Column("p", "Spearman p (permutation)", "{:.2g}"))
    return write_table(
        rows,
        cols,
        prefix,
        caption=(
            "Every scored assay: mutants scored, skipped (wild type or mutated_sequence disagreeing with target_seq), "
            "with two or more sites; the metrics on all its mutants and a one-sided permutation p-value of Spearman "
            "(scores shuffled against DMS_score; the smallest possible value is 1 / (permutations + 1))."
        ),
    )


def doubles_rows(levels: Levels) -> list[dict]:
    rows = []
    joint_encoders = [e for e, s in levels.runs() if s == "pair_joint"]
    for encoder in joint_encoders:
        c = levels.counts
        for r in c[(c["encoder"] == encoder) & (c["doubles"] > 0)].to_dict("records"):
            key = r["DMS_id"]
            joint = levels.value("assay", key, encoder, "pair_joint", "depth2", "spearman")
            additive = levels.value("assay", key, encoder, "additive", "depth2", "spearman")
            epistasis = levels.get("assay", key, encoder, "pair_joint", "depth2", "epistasis_spearman") or {}
            rows.append(
                {
                    "source": "ours",
                    "model": encoder,
                    "assay": key,
                    "doubles": r["doubles"],
                    "pair_joint_n": r["doubles_pair_joint"],
                    "joint": joint,
                    "additive": additive,
                    "gain": None if joint is None or additive is None else joint - additive,
                    "epistasis_n": epistasis.get("n_mutants"),
                    "epistasis": None if pd.isna(epistasis.get("value", math.nan)) else epistasis["value"],
                }
            )
        joint = levels.get("overall", "overall", encoder, "pair_joint", "depth2", "spearman") or {}
        additive = levels.value("overall", "overall", encoder, "additive", "depth2", "spearman")
        epistasis = levels.get("overall", "overall", encoder, "pair_joint", "depth2", "epistasis_spearman") or {}
        if joint:
            rows.append(
                {
                    "source": "ours",
                    "model": encoder,
                    "assay": f"all ({joint['n_assays']} assays, aggregated)",
                    "doubles": joint["n_mutants"],
                    "joint": joint["value"],
                    "additive": additive,
                    "gain": None if additive is None else joint["value"] - additive,
                    "epistasis_n": epistasis.get("n_mutants"),
                    "epistasis": epistasis.get("value"),
                }
            )
    return rows


def doubles_table(levels: Levels, prefix: Path) -> list[Path]:
    cols = [
        Column("model", "model"),
        Column("assay", "assay"),
        Column("doubles", "doubles", "{:,d}"),
        Column("pair_joint_n", "from the pair joint", "{:,d}"),
        Column("joint", "Spearman, pair joint", "{:.3f}"),
        Column("additive", "Spearman, additive", "{:.3f}"),
        Column("gain", "pair joint - additive", "{:+.3f}"),
        Column("epistasis_n", "doubles with both singles", "{:,d}"),
        Column("epistasis", "Spearman, epistasis", "{:.3f}"),
    ]
    return write_table(
        doubles_rows(levels),
        cols,
        prefix,
        caption=(
            "Double mutants: Spearman of DMS_score with the pair head's joint score, log P(a', b') - log P(a, b) with both "
            "sites masked, and with the additive score (the sum of the two single-site masked marginals) on the same "
            "doubles (a double whose sites do not fit one window is scored additively in both). Epistasis: Spearman of "
            "the predicted (joint - additive) with the measured (DMS(double) - DMS(single 1) - DMS(single 2)) where both "
            "singles are in the assay; additive scoring predicts none."
        ),
    )


def plot_categories(levels: Levels, prefix: Path) -> list[Path]:
    plt = pyplot()
    categories = levels.categories() or ["(none)"]
    runs = levels.runs()
    refs = published.rows()
    width = max(7.0, 2.3 * len(categories) + 1.5)
    fig, axes = plt.subplots(1, len(categories), figsize=(width, 4.6), sharey=True, squeeze=False)
    colours = plt.get_cmap("tab10")
    greys = [str(g) for g in np.linspace(0.1, 0.65, len(refs))]
    dashes = [(0, (4, 1.5)), (0, (1, 1.2)), (0, (6, 2, 1, 2)), (0, (2, 2)), (0, (8, 2)), (0, (3, 1, 1, 1, 1, 1))]
    assay_rows = levels.frame[
        (levels.frame["level"] == "assay") & (levels.frame["subset"] == "all") & (levels.frame["metric"] == "spearman")
    ]
    for ax, category in zip(axes[0], categories):
        for k, (encoder, scorer) in enumerate(runs):
            sel = levels.get("category", category, encoder, scorer, "all", "spearman")
            if sel is None:
                continue
            ax.bar(
                k,
                sel["value"],
                color=colours(k % 10),
                alpha=0.45,
                width=0.7,
                label=f"{encoder}, doubles {SCORER_LABELS.get(scorer, scorer)}: category mean",
            )
            points = assay_rows[
                (assay_rows["encoder"] == encoder)
                & (assay_rows["scorer"] == scorer)
                & assay_rows["key"].isin(levels.assays_in(category, encoder))
            ]["value"].to_numpy()
            jitter = np.linspace(-0.2, 0.2, len(points)) if len(points) > 1 else np.zeros(len(points))
            ax.scatter(k + jitter, points, s=8, color=colours(k % 10), zorder=3)
        for j, ref in enumerate(refs):
            if category in ref["values"]["spearman"]:
                ax.axhline(
                    ref["values"]["spearman"][category],
                    color=greys[j],
                    lw=0.9,
                    ls=dashes[j % len(dashes)],
                    label=f"{ref['model']} (published, 217 assays)",
                )
        info = levels.get("category", category, *runs[0], "all", "spearman") if runs else None
        counts = f"\n{info['n_proteins']} proteins, {info['n_assays']} assays" if info else ""
        ax.set_title(f"{CATEGORY_SHORT.get(category, category)}{counts}", fontsize=8)
        ax.set_xticks([])
        ax.axhline(0, color="black", lw=0.5)
        ax.tick_params(labelsize=7)
    axes[0][0].set_ylabel("Spearman with DMS_score", fontsize=8)
    handles, labels = axes[0][0].get_legend_handles_labels()
    rows = -(-len(labels) // 2)
    fig.legend(handles, labels, loc="lower center", ncol=2, fontsize=6.5, frameon=False)
    fig.suptitle("ProteinGym Spearman per function category (dots: assays; bars: mean over proteins)", fontsize=9)
    fig.tight_layout(rect=(0, 0.05 + 0.045 * rows, 1, 0.95))
    return save_figure(fig, str(prefix) + "_categories")


def plot_doubles(levels: Levels, prefix: Path) -> list[Path]:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(4.4, 4.2))
    rows = [r for r in doubles_rows(levels) if not r["assay"].startswith("all (")]
    colours = plt.get_cmap("tab10")
    encoders = list(dict.fromkeys(r["model"] for r in rows))
    for k, encoder in enumerate(encoders):
        pts = [
            (r["additive"], r["joint"])
            for r in rows
            if r["model"] == encoder and r["additive"] is not None and r["joint"] is not None
        ]
        if pts:
            x, y = zip(*pts)
            ax.scatter(x, y, s=14, color=colours(k % 10), label=f"{encoder} ({len(pts)} assays)")
    if rows:
        ax.plot([-1, 1], [-1, 1], color="0.5", lw=0.8, ls="--")
        ax.set_xlim(-1, 1)
        ax.set_ylim(-1, 1)
        ax.legend(fontsize=7, loc="upper left")
    else:
        ax.text(0.5, 0.5, "no double mutants scored by a pair head", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("Spearman on doubles, additive", fontsize=8)
    ax.set_ylabel("Spearman on doubles, pair joint", fontsize=8)
    ax.set_title("Double mutants: above the diagonal, the pair joint ranks better", fontsize=8)
    ax.tick_params(labelsize=7)
    fig.tight_layout()
    return save_figure(fig, str(prefix) + "_doubles")


def write_tables(
    summary: str | Path, assays_scored: str | Path, table_prefix: str | Path, figure_prefix: str | Path
) -> list[Path]:
    """The tables (PREFIX, PREFIX_categories, PREFIX_assays, PREFIX_doubles) and figures of aggregate's
    ``summary`` and ``assays_scored`` files; returns the paths written."""
    levels = Levels(read_levels(summary), read_counts(assays_scored))
    prefix = Path(table_prefix)
    paths = headline_table(levels, prefix)
    paths += category_table(levels, Path(f"{prefix}_categories"))
    paths += assay_table(levels, Path(f"{prefix}_assays"))
    paths += doubles_table(levels, Path(f"{prefix}_doubles"))
    paths += plot_categories(levels, Path(figure_prefix))
    paths += plot_doubles(levels, Path(figure_prefix))
    return paths
