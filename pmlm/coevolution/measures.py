"""How an encoder's epistasis and conditionals are scored against a Potts model's exact values: Spearman's rank
correlation over the double mutants of each pair, mean |epistasis|, and the conditional log-loss with its gap to
the exact entropy (``pmlm.coevolution.curve_readouts`` reports them).

Pair epistasis of (i:a, j:b), a != x_i, b != x_j, as ``pmlm score`` computes it (``score``): the pair joint's
log P(a, b) - log P(x_i, x_j) minus the two single scores; an encoder without a pair head scores doubles
additively, so its epistasis is 0. ``joint`` is the joint's own double difference
log P(a,b) - log P(a,x_j) - log P(x_i,b) + log P(x_i,x_j); both equal the exact ``e_ij`` for the true model.

Rank correlation is Spearman's (average ranks for ties). A constant prediction (an MLM's 0) has none to offer
and is given 0; where the exact values are constant (pairs no term joins: exactly 0) it is undefined (None),
and the measure there is how large the predicted values are (``mean_abs``).

Conditional log-loss: with the pair masked and the rest fixed to x, the cross-entropy ``-sum_y P_exact(y) log
Q(y)`` of the model's distribution Q over the 400 states, next to the exact conditional's entropy; their
difference, ``gap``, is KL(P_exact || Q) >= 0.
"""

from __future__ import annotations

import math

import numpy as np

from pmlm.coevolution.conditionals import Q, SequenceOutputs
from pmlm.synth.exact import coupled_pairs, double_difference, pair_epistasis, pair_log_conditional
from pmlm.synth.potts import PottsModel


def rank_correlation(predicted: np.ndarray, exact: np.ndarray) -> float | None:
    """Spearman's rank correlation; 0 for a constant prediction, None where the exact values are constant."""
    predicted, exact = np.ravel(predicted), np.ravel(exact)
    if exact.size < 2 or np.ptp(exact) == 0:
        return None
    if np.ptp(predicted) == 0:
        return 0.0
    rp, re = _ranks(predicted), _ranks(exact)
    rp, re = rp - rp.mean(), re - re.mean()
    return float((rp @ re) / math.sqrt((rp @ rp) * (re @ re)))


def _ranks(values: np.ndarray) -> np.ndarray:
    """Average ranks (ties share the mean of their positions)."""
    _, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    starts = np.cumsum(counts) - counts
    return (starts + (counts - 1) / 2.0)[inverse]


def cross_entropy(exact_log: np.ndarray, model_log: np.ndarray) -> np.ndarray:
    """-sum_y P_exact(y) log Q(y) per row; rows are flattened states, (n,)."""
    p = np.exp(exact_log.reshape(len(exact_log), -1))
    return -(p * model_log.reshape(len(model_log), -1)).sum(axis=1)


def normalise(log_values: np.ndarray) -> np.ndarray:
    """Log-values (n, ...) shifted so that each row's probabilities sum to 1."""
    flat = log_values.reshape(len(log_values), -1)
    top = flat.max(axis=1, keepdims=True)
    return (flat - top - np.log(np.exp(flat - top).sum(axis=1, keepdims=True))).reshape(log_values.shape)


def off_wild_type(values: np.ndarray, wild: list[np.ndarray]) -> np.ndarray:
    """Entries (n, q, ..., q) with every axis away from the row's wild type, flattened per row into one array."""
    keep = np.ones(values.shape, dtype=bool)
    n = np.arange(len(values))
    for axis, w in enumerate(wild, start=1):
        index = [slice(None)] * values.ndim
        index[0], index[axis] = n, w
        keep[tuple(index)] = False
    return values[keep]


def pair_groups(potts: PottsModel, pairs: np.ndarray) -> dict[str, np.ndarray]:
    """Masks (P,) of planted edges, pairs inside a triplet (not planted edges), and pairs no term joins."""
    edges = {(int(i), int(j)) for i, j in potts.edges}
    coupled = coupled_pairs(potts)
    keys = [(int(i), int(j)) for i, j in pairs]
    planted = np.array([k in edges for k in keys], dtype=bool)
    joined = np.array([k in coupled for k in keys], dtype=bool)
    return {"planted": planted, "in_triplet": joined & ~planted, "unplanted": ~joined}


def predicted_pair_epistasis(out: SequenceOutputs, sequence: np.ndarray, pairs: np.ndarray) -> dict[str, np.ndarray]:
    """``score`` and ``joint`` epistasis (P, 20, 20) of one sequence (zeros without a pair joint)."""
    wi, wj = sequence[pairs[:, 0]], sequence[pairs[:, 1]]
    if out.pair_joint is None:
        zero = np.zeros((len(pairs), Q, Q))
        return {"score": zero, "joint": zero}
    n = np.arange(len(pairs))
    single_i = out.singles[pairs[:, 0]] - out.singles[pairs[:, 0], wi][:, None]  # (P, 20)
    single_j = out.singles[pairs[:, 1]] - out.singles[pairs[:, 1], wj][:, None]
    double = out.pair_joint - out.pair_joint[n, wi, wj][:, None, None]
    return {
        "score": double - single_i[:, :, None] - single_j[:, None, :],
        "joint": double_difference(out.pair_joint, wi, wj),
    }


def epistasis_measures(
    values: np.ndarray, rows: np.ndarray, pairs: np.ndarray, groups: dict, exact: np.ndarray, every: bool = True
) -> dict:
    """Rank correlation and mean |epistasis| of predicted values (n, P, 20, 20) against exact ones, per group (and
    over every pair with ``every``)."""
    wild = [rows[:, pairs[:, 0]], rows[:, pairs[:, 1]]]  # (n, P) each

    def off_wt(table: np.ndarray, mask: np.ndarray) -> np.ndarray:
        flat = table[:, mask].reshape(-1, Q, Q)
        return off_wild_type(flat, [w[:, mask].ravel() for w in wild])

    m = {}
    if every:
        everything = np.ones(len(pairs), dtype=bool)
        m["spearman_all"] = rank_correlation(off_wt(values, everything), off_wt(exact, everything))
    for group, mask in groups.items():
        if not mask.any():
            continue
        p, e = off_wt(values, mask), off_wt(exact, mask)
        m[f"spearman_{group}"] = rank_correlation(p, e)
        m[f"mean_abs_{group}"] = float(np.abs(p).mean())
        m[f"exact_mean_abs_{group}"] = float(np.abs(e).mean())
    return m


def group_losses(exact_log: np.ndarray, model_log: np.ndarray, masks: dict[str, np.ndarray]) -> dict:
    """Mean CE, exact entropy and gap per group of (n, P, ...) distributions."""
    n, count = exact_log.shape[:2]
    flat_exact = exact_log.reshape(n * count, -1)
    ce = cross_entropy(flat_exact, model_log.reshape(n * count, -1)).reshape(n, count)
    entropy = cross_entropy(flat_exact, flat_exact).reshape(n, count)
    out = {}
    for group, mask in masks.items():
        if mask.any():
            out[group] = {
                "ce": float(ce[:, mask].mean()),
                "entropy": float(entropy[:, mask].mean()),
                "gap": float((ce - entropy)[:, mask].mean()),
            }
    return out


def product_log_joint(marginals: np.ndarray) -> np.ndarray:
    """log P(x_i = a) + log P(x_j = b), (..., 20, 20), of marginals (..., 2, 20): the independent joint."""
    return marginals[..., 0, :, None] + marginals[..., 1, None, :]


def exact_pair_values(potts: PottsModel, rows: np.ndarray, pairs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The exact epistasis and pair log-conditional of every pair on every evaluation row, (n, P, 20, 20) each."""
    rows = np.asarray(rows, dtype=np.int64)
    eps = np.stack([pair_epistasis(potts, rows, a, b) for a, b in pairs], axis=1)
    log = np.stack([pair_log_conditional(potts, rows, a, b) for a, b in pairs], axis=1)
    return eps, log


def substitution_index(groups: dict[str, np.ndarray], seed: int) -> np.ndarray:
    """Indices (sorted) of the pairs the 40-forwards-per-pair read-outs score: every planted pair and as many pairs
    no term joins, drawn with ``seed``."""
    unplanted = np.flatnonzero(groups["unplanted"])
    sampled = np.random.default_rng(seed).choice(
        unplanted, size=min(len(unplanted), int(groups["planted"].sum())), replace=False
    )
    return np.sort(np.concatenate([np.flatnonzero(groups["planted"]), sampled]))
