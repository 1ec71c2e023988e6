"""``pmlm coevolution report``: aggregate per-seed planted-coupling results into one table (mean and
std over seeds; PMLM, MLM, MSA baseline, chance; each read-out's cost in encoder forwards), the
supervised-protocol table (contact head on M / M+ on held-out families, with a paired test of PMLM
against MLM), and one figure (KL histograms, precision bars).

The paired test: the units are (seed, held-out family), each scored by PMLM's and by MLM's head;
the statistic is the mean difference, its two-sided p-value that of a sign-flip permutation test
(under the null each difference is as likely negated; exact over all 2^n sign patterns for
n <= ``EXACT_MAX_PAIRS``, else ``PERMUTATION_DRAWS`` seeded random patterns, p = (hits + 1) / (draws + 1)).
The paired t statistic is reported beside it; its p-value is not (no t distribution without scipy,
and the permutation p-value needs no normality).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np

from pmlm.errors import InputError
from pmlm.figures import pyplot, save_figure
from pmlm.reports.tables import Column, write_table
from pmlm.vocabulary import MLM, PMLM

MODELS = (PMLM, MLM, "msa")
MIN_SEEDS = 3  # the study's design; fewer is allowed for quick looks but flagged
EXACT_MAX_PAIRS = 16  # up to 2^16 sign patterns enumerated
PERMUTATION_DRAWS = 100_000
# supervised-protocol rows: (label, read-out, model)
SUPERVISED_ROWS = (
    ("PMLM, M+", "supervised_mplus", PMLM),
    ("PMLM, M", "supervised_m", PMLM),
    ("MLM, M", "supervised_m", MLM),
)
READOUT_TITLES = {
    "pair_head_mi_apc": "pair head, MI of the joint + APC",
    "chain_rule_mi_apc": "token head chain rule, MI + APC",
    "attention_apc": "attention maps + APC",
    "supervised_m": "supervised contact head, linear on M (encoder outputs), held-out families",
    "supervised_mplus": "supervised contact head, linear on M+ (pair head's first block), held-out families",
    "msa_mi_apc": "MI + APC of the training sequences (MSA baseline)",
}
METRIC_TITLES = {"p_at_edges": "top-#edges precision", "p_at_l5": "P@L/5"}
# the KL histogram of each model: (read-out, model, panel title)
KL_PANELS = (
    ("pair_head", PMLM, "PMLM: token-head marginals vs pair-head joint"),
    ("chain_rule", MLM, "MLM: token-head marginals vs chain-rule joint"),
)


def _get(doc: dict, *keys):
    node = doc
    for key in keys:
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


def measures() -> list[tuple[str, dict[str, Callable[[dict], float | None]], str | None]]:
    """(label, model -> getter on one seed's results, the read-out of a precision row or None) for every row."""
    rows: list = [
        (
            "Acc_mlm, held-out sequences",
            {m: (lambda d, m=m: _get(d, "pretraining", m, "acc_mlm")) for m in (PMLM, MLM)},
            None,
        ),
        ("Acc_pmlm, held-out sequences", {PMLM: lambda d: _get(d, "pretraining", PMLM, "acc_pmlm")}, None),
        ("dAcc = Acc_pmlm - Acc_mlm^2", {PMLM: lambda d: _get(d, "pretraining", PMLM, "dacc")}, None),
    ]
    for stat, title in (
        ("median_planted", "median, planted pairs"),
        ("median_non_planted", "median, non-planted pairs"),
        ("ratio", "ratio of medians planted / non-planted"),
    ):
        rows.append(
            (
                f"KL {title} (PMLM pair head; MLM chain rule)",
                {
                    PMLM: lambda d, s=stat: _get(d, "dependence", "pair_head", PMLM, "kl", s),
                    MLM: lambda d, s=stat: _get(d, "dependence", "chain_rule", MLM, "kl", s),
                },
                None,
            )
        )
    rows.append(
        (
            "KL ratio of medians, token head chain rule (both)",
            {m: (lambda d, m=m: _get(d, "dependence", "chain_rule", m, "kl", "ratio")) for m in (PMLM, MLM)},
            None,
        )
    )
    rows.append(
        (
            "MI ratio of medians, pair-head joint",
            {PMLM: lambda d: _get(d, "dependence", "pair_head", PMLM, "mi", "ratio")},
            None,
        )
    )
    for metric, metric_title in METRIC_TITLES.items():
        for readout, readout_title in READOUT_TITLES.items():
            getters = {m: (lambda d, r=readout, m=m, k=metric: _get(d, "summary", r, m, k)) for m in MODELS}
            rows.append((f"{metric_title}: {readout_title}", getters, readout))
    return rows


def load_results(paths: list[str]) -> list[dict]:
    docs, seeds = [], {}
    for path in paths:
        try:
            doc = json.loads(Path(path).read_text())
        except OSError as exc:
            raise InputError(path, f"cannot read: {exc.strerror or exc}") from None
        except json.JSONDecodeError as exc:
            raise InputError(path, f"not valid JSON: {exc.msg}", line=exc.lineno) from None
        for key in ("seed", "summary", "dependence", "dependence_values", "pretraining", "per_family"):
            if not isinstance(doc, dict) or key not in doc:
                raise InputError(path, f"missing {key!r}: not a results file of pmlm coevolution")
        if doc["seed"] in seeds:
            raise InputError(path, f"seed {doc['seed']} already given by {seeds[doc['seed']]}; each seed once")
        seeds[doc["seed"]] = path
        docs.append(doc)
    return docs


def _stats(values: list) -> tuple[float | None, float | None]:
    finite = [float(v) for v in values if v is not None and not math.isnan(float(v))]
    if not finite:
        return None, None
    std = float(np.std(finite, ddof=1)) if len(finite) > 1 else None
    return float(np.mean(finite)), std


def table_rows(docs: list[dict]) -> list[dict]:
    rows = []
    for label, getters, readout in measures():
        row = {"source": "ours", "measure": label, "seeds": len(docs)}
        for model in MODELS:
            mean, std = _stats([getters[model](d) for d in docs]) if model in getters else (None, None)
            row[f"{model}_mean"], row[f"{model}_std"] = mean, std
        if readout is not None:
            row["chance"] = _stats([_get(d, "summary", "msa_mi_apc", "msa", "chance") for d in docs])[0]
            row["forwards_per_sequence"] = _get(docs[0], "costs", readout, "forwards_per_sequence")
            row["sequences"] = _get(docs[0], "config", "sequences")
        if any(row[f"{m}_mean"] is not None for m in MODELS):
            rows.append(row)
    return rows


def write_report_table(docs: list[dict], prefix: str) -> list[Path]:
    num = "{:.3g}"
    columns = [
        Column("measure", "measure"),
        Column("pmlm_mean", "PMLM mean", num),
        Column("pmlm_std", "PMLM std", num),
        Column("mlm_mean", "MLM mean", num),
        Column("mlm_std", "MLM std", num),
        Column("msa_mean", "MSA baseline mean", num),
        Column("msa_std", "MSA baseline std", num),
        Column("chance", "chance", num),
        Column("seeds", "seeds"),
        Column("sequences", "held-out sequences per family"),
        Column("forwards_per_sequence", "encoder forwards per sequence", "{:.0f}"),
    ]
    families = _get(docs[0], "families") or {}
    caption = (
        f"Planted couplings of synthetic Potts families, read out from tiny MLM and PMLM encoders on held-out "
        f"sequences of the training families: mean and sample std over {len(docs)} seeds "
        f"({len(families)} families per seed). Precisions count pairs |i-j| >= 6 against the planted edges; "
        f"every model read-out averages over the same held-out sequences of each family, and its cost is "
        f"the encoder forwards it spends per sequence (all pairs)."
    )
    return write_table(table_rows(docs), columns, prefix, caption=caption)


def paired_test(a: np.ndarray, b: np.ndarray, seed: int = 0) -> dict:
    """Two-sided sign-flip permutation test of mean(a - b) = 0 on paired scores, with the paired t statistic."""
    d = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    n = int(d.size)
    if n == 0:
        return {"pairs": 0, "mean_difference": None, "t": None, "p": None, "p_method": None, "wins": 0, "losses": 0}
    sd = float(np.std(d, ddof=1)) if n > 1 else 0.0
    t = float(d.mean() / (sd / math.sqrt(n))) if sd > 0 else None
    observed = abs(d.sum())
    if n <= EXACT_MAX_PAIRS:
        signs = 1 - 2 * ((np.arange(2**n)[:, None] >> np.arange(n)) & 1)  # (2^n, n): every sign pattern
        method = f"exact sign-flip over {2**n} patterns"
        hits, draws = int((np.abs(signs @ d) >= observed - 1e-12).sum()), 2**n
        p = hits / draws
    else:
        signs = np.random.default_rng(seed).choice([-1.0, 1.0], size=(PERMUTATION_DRAWS, n))
        hits = int((np.abs(signs @ d) >= observed - 1e-12).sum())
        method = f"sign-flip, {PERMUTATION_DRAWS} seeded random patterns"
        p = (hits + 1) / (PERMUTATION_DRAWS + 1)
    return {
        "pairs": n,
        "mean_difference": float(d.mean()),
        "t": t,
        "p": float(p),
        "p_method": method,
        "wins": int((d > 0).sum()),
        "losses": int((d < 0).sum()),
    }


def _paired_scores(docs: list[dict], readout: str, model: str, metric: str) -> dict[tuple, float]:
    """(seed, family) -> the score of one supervised head, for every family the head scored."""
    out = {}
    for d in docs:
        for family, row in d["per_family"].items():
            value = _get(row, readout, model, metric)
            if value is not None and not math.isnan(float(value)):
                out[(d["seed"], family)] = float(value)
    return out


def supervised_rows(docs: list[dict]) -> list[dict]:
    """The supervised-protocol table: each head's mean and std over seeds (of its per-seed mean over
    held-out families), and PMLM's heads paired with MLM's on the same (seed, family) units."""
    rows = []
    reference = {k: _paired_scores(docs, "supervised_m", MLM, k) for k in METRIC_TITLES}
    for label, readout, model in SUPERVISED_ROWS:
        row: dict = {"source": "ours", "encoder, features": label, "seeds": len(docs)}
        for metric in METRIC_TITLES:
            row[f"{metric}_mean"], row[f"{metric}_std"] = _stats(
                [_get(d, "summary", readout, model, metric) for d in docs]
            )
        scores = _paired_scores(docs, readout, model, "p_at_edges")
        row["families_scored"] = len(scores)
        if model != MLM:
            units = sorted(set(scores) & set(reference["p_at_edges"]))
            test = paired_test(
                np.array([scores[u] for u in units]), np.array([reference["p_at_edges"][u] for u in units])
            )
            row.update(
                {
                    "vs_mlm_difference": test["mean_difference"],
                    "vs_mlm_t": test["t"],
                    "vs_mlm_p": test["p"],
                    "vs_mlm_wins": f"{test['wins']}/{test['losses']}/{test['pairs']}",
                    "vs_mlm_test": test["p_method"],
                }
            )
        rows.append(row)
    return rows


def write_supervised_table(docs: list[dict], prefix: str) -> list[Path]:
    num = "{:.3g}"
    columns = [
        Column("encoder, features", "encoder, features"),
        Column("seeds", "seeds"),
        Column("families_scored", "(seed, family) scored"),
        Column("p_at_edges_mean", "top-#edges precision mean", num),
        Column("p_at_edges_std", "std", num),
        Column("p_at_l5_mean", "P@L/5 mean", num),
        Column("p_at_l5_std", "std", num),
        Column("vs_mlm_difference", "minus MLM, M (paired mean)", num),
        Column("vs_mlm_t", "paired t", num),
        Column("vs_mlm_p", "p (sign-flip)", num),
        Column("vs_mlm_wins", "wins/losses/pairs"),
    ]
    caption = (
        "Supervised contact prediction on planted families (the paper's fine-tuning protocol): a linear "
        "contact head on frozen pair features, fitted on the planted contacts of half the families and "
        "scored on the other half (then swapped). Mean and sample std over seeds of each seed's mean over "
        "held-out families; the paired test compares each PMLM head with MLM's on the same (seed, family), "
        "top-#edges precision, two-sided sign-flip permutation p-value."
    )
    return write_table(supervised_rows(docs), columns, prefix + "_supervised", caption=caption)


def _pooled(docs: list[dict], readout: str, model: str, group: str) -> np.ndarray:
    out = [np.asarray(_get(d, "dependence_values", readout, model, "kl", group) or [], dtype=float) for d in docs]
    return np.concatenate(out) if out else np.zeros(0)


def plot_report(docs: list[dict], prefix: str) -> list[Path]:
    """2 x 2 figure: KL histograms (planted vs non-planted) of both models, then precision bars."""
    plt = pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    for ax, (readout, model, title) in zip(axes[0], KL_PANELS):
        groups = {g: _pooled(docs, readout, model, g) for g in ("planted", "non_planted")}
        values = np.concatenate(list(groups.values()))
        positive = values[values > 0]
        lo = max(float(positive.min()) if positive.size else 1e-6, 1e-8)
        hi = max(float(values.max()) if values.size else 1.0, lo * 10)
        bins = np.logspace(np.log10(lo), np.log10(hi), 40)
        for group, colour in (("non_planted", "tab:gray"), ("planted", "tab:red")):
            v = groups[group]
            if v.size:
                # each group sums to 1: the groups differ ten-fold in size, and a density over
                # log-spaced bins would be scaled by the bin widths
                ax.hist(
                    np.clip(v, lo, None),
                    bins=bins,
                    weights=np.full(v.size, 1.0 / v.size),
                    histtype="step",
                    linewidth=1.6,
                    color=colour,
                    label=f"{group.replace('_', '-')} (n={v.size}, median {np.median(v):.2e})",
                )
        ax.set_xscale("log")
        ax.set_xlabel("KL( P(x_i) P(x_j) || P(x_i, x_j) )  [nats], exactly the pair masked")
        ax.set_ylabel("fraction of pairs")
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=8)
    readouts = list(READOUT_TITLES)
    short = {
        "pair_head_mi_apc": "pair head",
        "chain_rule_mi_apc": "chain rule",
        "attention_apc": "attention",
        "supervised_m": "head on M",
        "supervised_mplus": "head on M+",
        "msa_mi_apc": "MSA MI+APC",
    }
    colours = {PMLM: "tab:blue", MLM: "tab:orange", "msa": "tab:green"}
    for ax, (metric, metric_title) in zip(axes[1], METRIC_TITLES.items()):
        width = 0.27
        x = np.arange(len(readouts))
        top = 1.0
        for k, model in enumerate(MODELS):
            stats = [_stats([_get(d, "summary", r, model, metric) for d in docs]) for r in readouts]
            means = [s[0] if s[0] is not None else np.nan for s in stats]
            errs = [s[1] if s[1] is not None else 0.0 for s in stats]
            ax.bar(x + (k - 1) * width, means, width, yerr=errs, capsize=3, color=colours[model], label=model.upper())
            top = max([top] + [m + e for m, e in zip(means, errs) if not np.isnan(m)])
        chance = _stats([_get(d, "summary", "msa_mi_apc", "msa", "chance") for d in docs])[0]
        if chance is not None:
            ax.axhline(chance, color="black", linestyle="--", linewidth=1, label="chance")
        ax.set_xticks(x, [short[r] for r in readouts], fontsize=8)
        ax.set_ylim(0, top + 0.05)  # room for every error bar
        ax.set_ylabel(metric_title)
        ax.set_title(f"{metric_title} (|i-j| >= 6), mean ± std over {len(docs)} seeds", fontsize=10)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return save_figure(fig, prefix, dpi=150)
