"""The tables and the figure of ``pmlm coevolution curves``, made from its ``curves.tsv`` alone: the answer at the
last budget (each PMLM arm minus the MLM per read-out, paired over (seed, family) with a sign-flip permutation
p-value, ``paired_test``), the curves' points, the classical baselines per family group,
each arm's cost, and the read-outs per family group. ``markdown`` is the block ``docs/coevolution.md`` carries
between its markers (``write_doc`` replaces it), so the page's numbers are the run's and a test can regenerate them.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from pathlib import Path

import numpy as np

from pmlm.coevolution.curves import ALL
from pmlm.coevolution.curves_config import BASELINE_ARM
from pmlm.errors import InputError
from pmlm.figures import pyplot, save_figure
from pmlm.files import atomic_output
from pmlm.vocabulary import MLM

DOC_BLOCK = "coevolution-curves"  # docs/coevolution.md's CPU study; its GPU-length run: coevolution-curves-gpu-length


def markers(name: str = DOC_BLOCK) -> tuple[str, str]:
    """The lines around a generated block of a page."""
    return f"<!-- {name}:begin -->", f"<!-- {name}:end -->"


BEGIN, END = markers()
EXACT_MAX_PAIRS = 16  # up to 2^16 sign patterns enumerated
PERMUTATION_DRAWS = 100_000
# the answer's rows: (label, metric, PMLM's read-out, MLM's read-out); higher is better unless the label says so
COMPARISONS = (
    ("epistasis rho, planted pairs: pair joint vs MLM token head by substitution", "spearman_planted", "pair_joint", "substitution"),
    ("the same, pair joint as pmlm score computes it", "spearman_planted", "pair_joint_score", "substitution"),
    ("epistasis rho, planted pairs: token heads by substitution", "spearman_planted", "substitution", "substitution"),
    ("epistasis rho, planted pairs: token heads' chain-rule joints", "spearman_planted", "chain_rule", "chain_rule"),
    ("epistasis rho, planted pairs: token heads' categorical Jacobians", "spearman_planted", "jacobian", "jacobian"),
    ("mean abs epistasis, unplanted pairs (truth 0; lower is better): pair joint vs substitution", "mean_abs_unplanted", "pair_joint", "substitution"),
    ("pair log-loss gap, planted pairs (nats; lower is better): pair joint vs MLM chain rule", "gap_planted", "pair_joint", "chain_rule"),
    ("pair log-loss gap, unplanted pairs (nats; lower is better): pair joint vs MLM chain rule", "gap_unplanted", "pair_joint", "chain_rule"),
    ("contacts top-#edges: pair head MI + APC vs MLM Jacobian + APC", "p_edges", "pair_mi_apc", "jacobian_apc"),
    ("contacts top-#edges: pair head KL + APC vs MLM Jacobian + APC", "p_edges", "pair_kl_apc", "jacobian_apc"),
    ("contacts long-range P@L/5: pair head MI + APC vs MLM Jacobian + APC", "p_l5_long", "pair_mi_apc", "jacobian_apc"),
    ("contacts top-#edges: token heads' Jacobian + APC", "p_edges", "jacobian_apc", "jacobian_apc"),
    ("contacts top-#edges: attention + APC", "p_edges", "attention_apc", "attention_apc"),
    ("contacts top-#edges, supervised linear head: PMLM on M+ vs MLM on M", "p_edges", "supervised_mplus", "supervised_m"),
    ("contacts top-#edges, supervised linear head on M", "p_edges", "supervised_m", "supervised_m"),
    ("contacts long-range P@L/5, supervised: PMLM on M+ vs MLM on M", "p_l5_long", "supervised_mplus", "supervised_m"),
    ("epistasis rho, every pair |i-j| >= min_separation: pair joint as pmlm score vs MLM Jacobian", "spearman_all", "pair_joint_score", "jacobian"),
    ("KL to independence, median planted / median unplanted: pair head vs MLM chain rule", "median_ratio", "pair_kl", "chain_rule_kl"),
    ("third-order epistasis rho, planted triplets: triple joint (0 without a triple head)", "spearman_planted", "triple_joint", "triple_joint"),
    ("triple log-loss gap, planted triplets (nats; lower is better): triple joint vs MLM product", "gap_planted", "triple_joint", "triple_product"),
    ("the same, a pair head's pairwise composition vs MLM product", "gap_planted", "triple_pairs", "triple_product"),
)  # fmt: skip
# the curves' table and the figure: (read-out, metric, title)
CURVES = (
    ("pair_joint", "spearman_planted", "epistasis rho, planted pairs, pair joint"),
    ("substitution", "spearman_planted", "epistasis rho, planted pairs, token head by substitution"),
    ("pair_joint", "gap_planted", "pair log-loss gap, planted pairs (nats), pair joint"),
    ("chain_rule", "gap_planted", "pair log-loss gap, planted pairs (nats), token head chain rule"),
    ("pair_mi_apc", "p_edges", "contacts top-#edges, pair head MI + APC"),
    ("jacobian_apc", "p_edges", "contacts top-#edges, token head Jacobian + APC"),
    ("supervised_mplus", "p_edges", "contacts top-#edges, supervised head on M+"),
    ("supervised_m", "p_edges", "contacts top-#edges, supervised head on M"),
    ("pair_kl", "median_ratio", "KL to independence, median planted / median unplanted, pair head"),
    ("chain_rule_kl", "median_ratio", "KL to independence, median planted / median unplanted, token head chain rule"),
    ("triple_joint", "spearman_planted", "third-order epistasis rho, planted triplets, triple joint"),
)
BASELINES = (
    ("exact_couplings_apc", "p_edges", "exact couplings, Frobenius + APC (ceiling): top-#edges"),
    ("plm_apc", "p_edges", "pseudo-likelihood Potts fit, Frobenius + APC: top-#edges"),
    ("msa_mi_apc", "p_edges", "MSA MI + APC: top-#edges"),
    ("chance", "p_edges", "chance: top-#edges"),
    ("plm_apc", "p_l5_long", "pseudo-likelihood fit: long-range P@L/5"),
    ("exact_couplings_apc", "p_l5_long", "exact couplings: long-range P@L/5"),
    ("plm", "spearman_planted", "pseudo-likelihood fit: epistasis rho, planted pairs"),
    ("plm", "gap_planted", "pseudo-likelihood fit: pair log-loss gap, planted pairs (nats)"),
    ("exact", "entropy_planted", "exact pair conditional entropy, planted pairs (nats)"),
    ("exact", "mean_abs_planted", "exact mean abs epistasis, planted pairs"),
    ("exact", "triple_entropy_planted", "exact triple conditional entropy, planted triplets (nats)"),
    ("exact", "triple_mean_abs_planted", "exact mean abs third-order epistasis, planted triplets"),
)


class Results:
    """``curves.tsv`` indexed: (arm, step, read-out, metric) -> {(seed, family): value}, with each family's group."""

    def __init__(self, rows: list[tuple], source: str | Path = "curves.tsv"):
        self.values: dict[tuple, dict[tuple, float]] = defaultdict(dict)
        self.group: dict[tuple, str] = {}
        self.encoders: list[str] = []
        for seed, group, family, arm, step, readout, metric, value in rows:
            if family == ALL:  # a run's own rows (its cost): the group column names its encoder
                family = f"{ALL}{group}"
                if group not in self.encoders:
                    self.encoders.append(group)
            else:
                self.group[(seed, family)] = group
            self.values[(arm, step, readout, metric)][(seed, family)] = value
        self.arms = list(dict.fromkeys(r[3] for r in rows if r[3] != BASELINE_ARM))
        self.steps = sorted({r[4] for r in rows if r[3] != BASELINE_ARM and r[4] > 0})
        self.groups = list(dict.fromkeys(self.group.values()))
        self.seeds = sorted({r[0] for r in rows})
        if MLM not in self.arms or not self.steps:
            raise InputError(source, "needs the rows of an mlm arm at one budget at least")
        # the last budget every arm reached on every unit it has (a run stopped by a time limit reaches fewer)
        reached = {(r[0], r[2], r[3]): 0 for r in rows if r[3] != BASELINE_ARM and r[2] != ALL}
        for seed, _, family, arm, step, *_ in rows:
            if arm != BASELINE_ARM and family != ALL:
                reached[(seed, family, arm)] = max(reached[(seed, family, arm)], step)
        self.last = min(reached.values(), default=self.steps[-1]) or self.steps[-1]

    def units(self, arm: str, step: int, readout: str, metric: str, group: str | None = None) -> dict[tuple, float]:
        found = self.values.get((arm, step, readout, metric), {})
        return {u: v for u, v in found.items() if not math.isnan(v) and (group is None or self.group.get(u) == group)}

    def pmlm_arms(self) -> list[str]:
        return [a for a in self.arms if a != MLM]


def paired_test(a: np.ndarray, b: np.ndarray, seed: int = 0) -> dict:
    """Two-sided sign-flip permutation test of mean(a - b) = 0 on paired scores, with the paired t statistic: under
    the null each difference is as likely negated; exact over all 2^n sign patterns for n <= ``EXACT_MAX_PAIRS``,
    else ``PERMUTATION_DRAWS`` seeded random patterns, p = (hits + 1) / (draws + 1). The t statistic's p-value is
    not reported (the permutation p-value needs no normality)."""
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


def _mean_std(values) -> str:
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return "–"
    std = f" ± {np.std(values, ddof=1):.3f}" if len(values) > 1 else ""
    return f"{np.mean(values):.3f}{std}"


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    return [f"| {' | '.join(head)} |", "|" + "---|" * len(head), *(f"| {' | '.join(row)} |" for row in rows)]


def answer_table(res: Results, step: int) -> list[str]:
    arms, rows = res.pmlm_arms(), []
    for label, metric, pmlm_readout, mlm_readout in COMPARISONS:
        base = res.units(MLM, step, mlm_readout, metric)
        if not base:
            continue
        cells = [label, _mean_std(base.values())]
        for arm in arms:
            mine = res.units(arm, step, pmlm_readout, metric)
            shared = sorted(set(mine) & set(base))
            if not shared:
                cells += ["–", "–"]
                continue
            test = paired_test(np.array([mine[u] for u in shared]), np.array([base[u] for u in shared]))
            cells.append(_mean_std(mine[u] for u in shared))
            cells.append(f"{test['mean_difference']:+.3f} (p {test['p']:.2g}; {test['wins']}/{test['losses']})")
        rows.append(cells)
    return _table(["read-out", MLM] + [c for a in arms for c in (a, f"{a} minus {MLM} (p; wins/losses)")], rows)


def curves_table(res: Results) -> list[str]:
    rows = []
    for (readout, metric, title), arm in itertools.product(CURVES, res.arms):
        cells = [_mean_std(res.units(arm, s, readout, metric).values()) for s in res.steps]
        if any(c != "–" for c in cells):
            rows.append([title, arm, *cells])
    return _table(["read-out", "arm"] + [f"step {s:,}" for s in res.steps], rows)


def baselines_table(res: Results) -> list[str]:
    rows = []
    for readout, metric, title in BASELINES:
        cells = [_mean_std(res.units(BASELINE_ARM, 0, readout, metric, g).values()) for g in (*res.groups, None)]
        if cells[-1] != "–":  # a study without three-body terms has no triple baselines
            rows.append([title, *cells])
    return _table(["baseline", *res.groups, "all families"], rows)


def _run_mean(res: Results, encoder: str, arm: str, step: int, metric: str) -> float:
    """Mean over seeds of one of an encoder's own rows (its cost)."""
    found = res.units(arm, step, "training", metric)
    return float(np.mean([v for (_, family), v in found.items() if family == f"{ALL}{encoder}"]))


def cost_table(res: Results) -> list[str]:
    """FLOPs per optimizer step and training seconds per step (read-outs excluded) of each arm, per encoder: process
    CPU-seconds of a run on CPUs, wall-seconds of one on a GPU (where the CPU only launches the kernels)."""
    last = res.last
    gpu = any(v == 1.0 for arm in res.arms for v in res.units(arm, last, "training", "on_gpu").values())
    metric, label = ("wall_s", "GPU wall-s per step") if gpu else ("cpu_s", "CPU-s per step")
    rows = []
    for encoder in res.encoders:
        mlm_flops = _run_mean(res, encoder, MLM, 0, "flops_per_step")
        mlm_time = _run_mean(res, encoder, MLM, last, metric) / last
        for arm in res.arms:
            flops = _run_mean(res, encoder, arm, 0, "flops_per_step")
            seconds = _run_mean(res, encoder, arm, last, metric) / last
            rows.append(
                [
                    encoder,
                    arm,
                    f"{flops / 1e9:.3f}",
                    f"{flops / mlm_flops:.2f}",
                    f"{seconds:.4f}",
                    f"{seconds / mlm_time:.2f}",
                ]
            )
    return _table(["encoder", "arm", "GFLOPs per step", "relative to MLM", label, "relative to MLM"], rows)


def group_table(res: Results, step: int) -> list[str]:
    picks = (
        ("pair_joint", "spearman_planted", "pair joint rho"),
        ("substitution", "spearman_planted", "substitution rho"),
        ("pair_mi_apc", "p_edges", "pair MI + APC, top-#edges"),
        ("jacobian_apc", "p_edges", "Jacobian + APC, top-#edges"),
    )
    rows = [
        [group, arm, *(_mean_std(res.units(arm, step, r, m, group).values()) for r, m, _ in picks)]
        for group, arm in itertools.product(res.groups, res.arms)
    ]
    return _table(["family group", "arm"] + [title for *_, title in picks], rows)


def markdown(res: Results) -> str:
    """The generated block of docs/coevolution.md (between the markers of ``write_doc``)."""
    last = res.last
    units = len(res.group)
    parts = [
        f"Seeds {', '.join(map(str, res.seeds))}; {units} (seed, family) units; family groups "
        f"{', '.join(res.groups)}; budgets {', '.join(f'{s:,}' for s in res.steps)} steps. Mean ± sample std over "
        "the units; p: two-sided sign-flip permutation test of the paired (seed, family) differences "
        "(exact over all sign patterns up to 16 units).",
        "",
        f"**The answer at {last:,} steps** (each PMLM arm minus the MLM on the same units):",
        "",
        *answer_table(res, last),
        "",
        "**The curves** (mean ± std over the units at each budget):",
        "",
        *curves_table(res),
        "",
        "**Classical baselines** (once per family, on the same held-out sequences; no training budget):",
        "",
        *baselines_table(res),
        "",
        f"**By family group at {last:,} steps:**",
        "",
        *group_table(res, last),
        "",
        "**Cost** (GFLOPs of one optimizer step, forward and backward, counted by torch's FLOP counter on a batch "
        "of each group's length; CPU-seconds (on a GPU: wall-seconds) of training alone per step, read-outs "
        "excluded, on the machine and load of the run):",
        "",
        *cost_table(res),
    ]
    return "\n".join(parts) + "\n"


def write_doc(doc: str | Path, block: str, name: str = DOC_BLOCK) -> bool:
    """Replace the text between the markers of block ``name`` in ``doc``; returns whether it changed."""
    doc = Path(doc)
    text = doc.read_text()
    begin, end = markers(name)
    if text.count(begin) != 1 or text.count(end) != 1 or text.index(begin) > text.index(end):
        raise InputError(doc, f"needs one {begin} line and one {end} line after it")
    head, rest = text.split(begin)
    _, tail = rest.split(end)
    new = f"{head}{begin}\n{block}{end}{tail}"
    if new == text:
        return False
    with atomic_output(doc) as tmp:
        Path(tmp).write_text(new)
    return True


def plot_curves(res: Results, prefix: str | Path) -> list[Path]:
    """One panel per read-out: each arm's mean over the units against the budget (± std), the baselines flat."""
    plt = pyplot()
    panels = (
        ("epistasis rho, planted pairs", "spearman_planted", ("pair_joint", "substitution"), ("plm",)),
        ("mean abs epistasis, unplanted pairs (truth 0)", "mean_abs_unplanted", ("pair_joint", "substitution"), ("plm",)),
        ("pair log-loss gap, planted pairs (nats)", "gap_planted", ("pair_joint", "chain_rule"), ("plm",)),
        ("contacts, zero-shot: top-#edges precision", "p_edges", ("pair_mi_apc", "jacobian_apc"), ("exact_couplings_apc", "plm_apc", "msa_mi_apc", "chance")),
        ("contacts, supervised and attention: top-#edges", "p_edges", ("supervised_mplus", "supervised_m", "attention_apc"), ("plm_apc", "msa_mi_apc", "chance")),
        ("contacts: long-range P@L/5", "p_l5_long", ("pair_mi_apc", "jacobian_apc", "supervised_mplus", "supervised_m"), ("exact_couplings_apc", "plm_apc", "msa_mi_apc")),
    )  # fmt: skip
    styles = ("-", "--", ":", "-.", (0, (1, 1)))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, axes = plt.subplots(2, 3, figsize=(17, 9.5))
    for ax, (title, metric, readouts, baselines) in zip(axes.ravel(), panels):
        for a, arm in enumerate(res.arms):
            for r, readout in enumerate(readouts):
                points = [(s, list(res.units(arm, s, readout, metric).values())) for s in res.steps]
                points = [(s, v) for s, v in points if v]
                if points:
                    x = [s for s, _ in points]
                    y = np.array([np.mean(v) for _, v in points])
                    err = np.array([np.std(v, ddof=1) if len(v) > 1 else 0.0 for _, v in points])
                    ax.plot(
                        x,
                        y,
                        linestyle=styles[r % len(styles)],
                        marker="o",
                        ms=3,
                        color=colours[a % len(colours)],
                        label=f"{arm}: {readout}",
                    )
                    ax.fill_between(x, y - err, y + err, color=colours[a % len(colours)], alpha=0.08)
        for b, readout in enumerate(baselines):
            found = list(res.units(BASELINE_ARM, 0, readout, metric).values())
            if found:
                ax.axhline(
                    np.mean(found),
                    color="0.2",
                    linestyle=styles[b % len(styles)],
                    linewidth=1,
                    label=f"baseline: {readout}",
                )
        ax.set_xscale("log")
        ax.set_xlabel("optimizer steps (same batch for every arm)")
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=6.5)
    fig.suptitle(
        f"Planted-coupling learning curves at equal compute: mean ± std over {len(res.group)} (seed, family) units",
        fontsize=11,
    )
    fig.tight_layout()
    return save_figure(fig, prefix, dpi=110)
