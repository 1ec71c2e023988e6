"""``pmlm coevolution report``: aggregate per-seed planted-coupling results into one table (mean and
std over seeds; PMLM, MLM, MSA baseline, chance) and one figure (KL histograms, precision bars)."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

from pmlm.errors import InputError
from pmlm.utils import atomic_output

MODELS = ("pmlm", "mlm", "msa")
MIN_SEEDS = 3  # the study's design; fewer is allowed for quick looks but flagged
READOUT_TITLES = {
    "pair_head_mi_apc": "pair head, MI of the joint + APC",
    "chain_rule_mi_apc": "token head chain rule, MI + APC",
    "attention_apc": "attention maps + APC",
    "linear_probe": "linear probe on concat(h_i*h_j, h_i-h_j), held-out families",
    "msa_mi_apc": "MI + APC of the training sequences (MSA baseline)",
}
METRIC_TITLES = {"p_at_edges": "top-#edges precision", "p_at_l5": "P@L/5"}
# the KL histogram of each model: (read-out, model, panel title)
KL_PANELS = (
    ("pair_head", "pmlm", "PMLM: token-head marginals vs pair-head joint"),
    ("chain_rule", "mlm", "MLM: token-head marginals vs chain-rule joint"),
)


def _get(doc: dict, *keys):
    node = doc
    for key in keys:
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


def measures() -> list[tuple[str, dict[str, Callable[[dict], float | None]], bool]]:
    """(label, model -> getter on one seed's results, is a precision) for every table row."""
    rows: list = [
        ("Acc_mlm, held-out sequences",
         {m: (lambda d, m=m: _get(d, "pretraining", m, "acc_mlm")) for m in ("pmlm", "mlm")}, False),
        ("Acc_pmlm, held-out sequences", {"pmlm": lambda d: _get(d, "pretraining", "pmlm", "acc_pmlm")}, False),
        ("dAcc = Acc_pmlm - Acc_mlm^2", {"pmlm": lambda d: _get(d, "pretraining", "pmlm", "dacc")}, False),
    ]
    for stat, title in (("median_planted", "median, planted pairs"),
                        ("median_non_planted", "median, non-planted pairs"),
                        ("ratio", "ratio of medians planted / non-planted")):
        rows.append((f"KL {title} (PMLM pair head; MLM chain rule)", {
            "pmlm": lambda d, s=stat: _get(d, "dependence", "pair_head", "pmlm", "kl", s),
            "mlm": lambda d, s=stat: _get(d, "dependence", "chain_rule", "mlm", "kl", s),
        }, False))
    rows.append(("KL ratio of medians, token head chain rule (both)", {
        m: (lambda d, m=m: _get(d, "dependence", "chain_rule", m, "kl", "ratio")) for m in ("pmlm", "mlm")}, False))
    rows.append(("MI ratio of medians, pair-head joint", {
        "pmlm": lambda d: _get(d, "dependence", "pair_head", "pmlm", "mi", "ratio")}, False))
    for metric, metric_title in METRIC_TITLES.items():
        for readout, readout_title in READOUT_TITLES.items():
            getters = {m: (lambda d, r=readout, m=m, k=metric: _get(d, "summary", r, m, k)) for m in MODELS}
            rows.append((f"{metric_title}: {readout_title}", getters, True))
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
        for key in ("seed", "summary", "dependence", "dependence_values", "pretraining"):
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
    for label, getters, is_precision in measures():
        row = {"source": "ours", "measure": label, "seeds": len(docs)}
        for model in MODELS:
            mean, std = _stats([getters[model](d) for d in docs]) if model in getters else (None, None)
            row[f"{model}_mean"], row[f"{model}_std"] = mean, std
        if is_precision:
            row["chance"] = _stats([_get(d, "summary", "msa_mi_apc", "msa", "chance") for d in docs])[0]
        if any(row[f"{m}_mean"] is not None for m in MODELS):
            rows.append(row)
    return rows


def write_report_table(docs: list[dict], prefix: str) -> list[Path]:
    from pmlm.reports.tables import Column, write_table

    num = "{:.3g}"
    columns = [Column("measure", "measure"),
               Column("pmlm_mean", "PMLM mean", num), Column("pmlm_std", "PMLM std", num),
               Column("mlm_mean", "MLM mean", num), Column("mlm_std", "MLM std", num),
               Column("msa_mean", "MSA baseline mean", num), Column("msa_std", "MSA baseline std", num),
               Column("chance", "chance", num), Column("seeds", "seeds")]
    families = _get(docs[0], "families") or {}
    caption = (f"Planted couplings of synthetic Potts families, read out from tiny MLM and PMLM encoders on held-out "
               f"sequences of the training families: mean and sample std over {len(docs)} seeds "
               f"({len(families)} families per seed). Precisions count pairs |i-j| >= 6 against the planted edges.")
    return write_table(table_rows(docs), columns, prefix, caption=caption)


def _pooled(docs: list[dict], readout: str, model: str, group: str) -> np.ndarray:
    out = [np.asarray(_get(d, "dependence_values", readout, model, "kl", group) or [], dtype=float) for d in docs]
    return np.concatenate(out) if out else np.zeros(0)


def plot_report(docs: list[dict], prefix: str) -> list[Path]:
    """2 x 2 figure: KL histograms (planted vs non-planted) of both models, then precision bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
                ax.hist(np.clip(v, lo, None), bins=bins, weights=np.full(v.size, 1.0 / v.size), histtype="step",
                        linewidth=1.6, color=colour,
                        label=f"{group.replace('_', '-')} (n={v.size}, median {np.median(v):.2e})")
        ax.set_xscale("log")
        ax.set_xlabel("KL( P(x_i) P(x_j) || P(x_i, x_j) )  [nats], exactly the pair masked")
        ax.set_ylabel("fraction of pairs")
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=8)
    readouts = list(READOUT_TITLES)
    short = {"pair_head_mi_apc": "pair head", "chain_rule_mi_apc": "chain rule", "attention_apc": "attention",
             "linear_probe": "linear probe", "msa_mi_apc": "MSA MI+APC"}
    colours = {"pmlm": "tab:blue", "mlm": "tab:orange", "msa": "tab:green"}
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
    paths = []
    for ext in (".png", ".svg"):
        path = Path(prefix + ext)
        with atomic_output(path) as tmp:
            fig.savefig(tmp, format=ext[1:], dpi=150)
        paths.append(path)
    plt.close(fig)
    return paths


def run_report(args) -> int:
    docs = load_results(args.results)
    if len(docs) < MIN_SEEDS:
        print(f"coevolution report: note: {len(docs)} seed(s); the study calls for at least {MIN_SEEDS}",
              file=sys.stderr)
    paths = write_report_table(docs, args.out_prefix) + plot_report(docs, args.out_prefix)
    print(f"coevolution report: {len(docs)} seed(s) -> {', '.join(str(p) for p in paths)}", file=sys.stderr)
    return 0
