"""The tables and the figure of ``pmlm coevolution curves``, made from its ``curves.tsv`` alone: the answer at the
last budget (each PMLM arm minus the MLM per read-out, paired over (seed, family) with a sign-flip permutation
p-value, ``pmlm.coevolution.report.paired_test``), the curves' points, the classical baselines per family group,
each arm's cost, and the read-outs per family group. ``markdown`` is the block ``docs/coevolution.md`` carries
between its markers (``write_doc`` replaces it), so the page's numbers are the run's and a test can regenerate them.
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

import numpy as np

from pmlm.coevolution.curves import ALL, BASELINE_ARM
from pmlm.coevolution.report import paired_test
from pmlm.errors import InputError
from pmlm.figures import pyplot, save_figure
from pmlm.files import atomic_output
from pmlm.vocabulary import MLM

DOC_BLOCK = "coevolution-curves"  # docs/coevolution.md's CPU study; its GPU-length run: coevolution-curves-gpu-length


def markers(name: str = DOC_BLOCK) -> tuple[str, str]:
    """The lines around a generated block of a page."""
    return f"<!-- {name}:begin -->", f"<!-- {name}:end -->"


BEGIN, END = markers()
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


def _mean_std(values) -> str:
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return "–"
    std = f" ± {np.std(values, ddof=1):.3f}" if len(values) > 1 else ""
    return f"{np.mean(values):.3f}{std}"


def _p(value: float) -> str:
    return f"{value:.2g}"


def answer_table(res: Results, step: int) -> list[str]:
    arms = res.pmlm_arms()
    head = ["read-out", MLM] + [c for a in arms for c in (a, f"{a} minus {MLM} (p; wins/losses)")]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
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
            cells.append(f"{test['mean_difference']:+.3f} (p {_p(test['p'])}; {test['wins']}/{test['losses']})")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def curves_table(res: Results) -> list[str]:
    head = ["read-out", "arm"] + [f"step {s:,}" for s in res.steps]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for readout, metric, title in CURVES:
        for arm in res.arms:
            cells = [_mean_std(res.units(arm, s, readout, metric).values()) for s in res.steps]
            if any(c != "–" for c in cells):
                lines.append("| " + " | ".join([title, arm, *cells]) + " |")
    return lines


def baselines_table(res: Results) -> list[str]:
    head = ["baseline", *res.groups, "all families"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for readout, metric, title in BASELINES:
        cells = [_mean_std(res.units(BASELINE_ARM, 0, readout, metric, g).values()) for g in res.groups]
        cells.append(_mean_std(res.units(BASELINE_ARM, 0, readout, metric).values()))
        lines.append("| " + " | ".join([title, *cells]) + " |")
    return lines


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
    lines = [
        f"| encoder | arm | GFLOPs per step | relative to MLM | {label} | relative to MLM |",
        "|---|---|---|---|---|---|",
    ]
    for encoder in res.encoders:
        mlm_flops = _run_mean(res, encoder, MLM, 0, "flops_per_step")
        mlm_time = _run_mean(res, encoder, MLM, last, metric) / last
        for arm in res.arms:
            flops = _run_mean(res, encoder, arm, 0, "flops_per_step")
            seconds = _run_mean(res, encoder, arm, last, metric) / last
            lines.append(
                f"| {encoder} | {arm} | {flops / 1e9:.3f} | {flops / mlm_flops:.2f} | {seconds:.4f} "
                f"| {seconds / mlm_time:.2f} |"
            )
    return lines


def group_table(res: Results, step: int) -> list[str]:
    picks = (
        ("pair_joint", "spearman_planted", "pair joint rho"),
        ("substitution", "spearman_planted", "substitution rho"),
        ("pair_mi_apc", "p_edges", "pair MI + APC, top-#edges"),
        ("jacobian_apc", "p_edges", "Jacobian + APC, top-#edges"),
    )
    head = ["family group", "arm"] + [title for *_, title in picks]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for group in res.groups:
        for arm in res.arms:
            cells = [_mean_std(res.units(arm, step, r, m, group).values()) for r, m, _ in picks]
            lines.append("| " + " | ".join([group, arm, *cells]) + " |")
    return lines


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
