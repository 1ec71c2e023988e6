"""The exact read-outs of three-body terms: third-order epistasis and the triple log-loss of an encoder against a
Potts model's exact values (``pmlm.synth.exact``), on planted triplets and control triples no term joins.

Third-order epistasis (``a != x_i, b != x_j, c != x_k``): the alternating sum of the triple joint's log over the
8 corners; 0 for a model without a triple joint (its triples are scored from pairs at most). Log-loss: the
cross-entropy of the model's distribution over the 8,000 states with the triple masked, next to the exact
conditional's entropy; Q is the triple head's joint, a PMLM's pairwise composition ``pairs`` (exp(single scores +
the three pair epistases), normalised: what its pair head can say about a triple without a triple head), or the
product of the token head's marginals (``product``).
"""

from __future__ import annotations

import itertools

import numpy as np

from pmlm.coevolution.conditionals import Q, SequenceOutputs
from pmlm.coevolution.measures import group_losses, normalise, off_wild_type, predicted_pair_epistasis, rank_correlation
from pmlm.synth.exact import coupled_pairs, triple_difference
from pmlm.synth.potts import PottsModel


def control_triples(potts: PottsModel, count: int, min_separation: int, seed: int) -> np.ndarray:
    """``count`` site triples (i < j < k, pairwise >= min_separation apart) no term joins at all, drawn with a seed."""
    rng = np.random.default_rng(seed)
    coupled = coupled_pairs(potts)
    out: list[tuple[int, int, int]] = []
    for _ in range(1000 * max(count, 1)):
        if len(out) == count:
            break
        t = tuple(sorted(int(s) for s in rng.choice(potts.length, size=3, replace=False)))
        if (
            t[1] - t[0] >= min_separation
            and t[2] - t[1] >= min_separation
            and t not in out
            and not any(p in coupled for p in itertools.combinations(t, 2))
        ):
            out.append(t)
    return np.array(out, dtype=np.int64).reshape(-1, 3)


def pairwise_triple_composition(
    out: SequenceOutputs, sequence: np.ndarray, pairs: np.ndarray, triples: np.ndarray
) -> np.ndarray | None:
    """log Q(a, b, c) of each triple from singles and the three pair epistases (``score``), normalised,
    (T, 20, 20, 20); None without a pair joint."""
    if out.pair_joint is None:
        return None
    eps = predicted_pair_epistasis(out, sequence, pairs)["score"]
    index = {(int(a), int(b)): k for k, (a, b) in enumerate(pairs)}
    s = out.singles
    logits = []
    for i, j, k in triples:
        value = s[i][:, None, None] + s[j][None, :, None] + s[k][None, None, :]
        value = value + eps[index[(i, j)]][:, :, None] + eps[index[(i, k)]][:, None, :] + eps[index[(j, k)]][None]
        logits.append(value)
    return normalise(np.stack(logits))


def triple_epistasis_measures(outs, rows, triples, planted, exact) -> dict:
    """Rank correlation and mean |third-order epistasis| of each model's triple joint against the exact values,
    on planted triplets and control triples."""
    wild = [rows[:, triples[:, s]] for s in range(3)]  # (n, T) each
    if outs[0].triple_joint is None:
        pred = np.zeros_like(exact)
    else:
        pred = np.stack(
            [triple_difference(o.triple_joint, *(seq[triples[:, s]] for s in range(3))) for o, seq in zip(outs, rows)]
        )
    out = {}
    for group, mask in (("planted", planted), ("control", ~planted)):
        if mask.any():
            flat_p = pred[:, mask].reshape(-1, Q, Q, Q)
            flat_e = exact[:, mask].reshape(-1, Q, Q, Q)
            w = [x[:, mask].ravel() for x in wild]
            p, e = off_wild_type(flat_p, w), off_wild_type(flat_e, w)
            out[f"spearman_{group}"] = rank_correlation(p, e)
            out[f"mean_abs_{group}"] = float(np.abs(p).mean())
            out[f"exact_mean_abs_{group}"] = float(np.abs(e).mean())
    return out


def triple_logloss(outs, rows, pairs, triples, planted, exact_log) -> dict:
    """Cross-entropy, exact entropy and gap of the triple joint, the pairwise composition and the product."""
    masks = {"planted": planted, "control": ~planted}
    out = {}
    if outs[0].triple_joint is not None:
        out["joint"] = group_losses(exact_log, np.stack([o.triple_joint for o in outs]), masks)
    composed = [pairwise_triple_composition(o, seq, pairs, triples) for o, seq in zip(outs, rows)]
    if composed[0] is not None:
        out["pairs"] = group_losses(exact_log, np.stack(composed), masks)
    if outs[0].triple_marginals is not None:
        m = np.stack([o.triple_marginals for o in outs])  # (n, T, 3, 20)
        product = m[:, :, 0, :, None, None] + m[:, :, 1, None, :, None] + m[:, :, 2, None, None, :]
        out["product"] = group_losses(exact_log, product, masks)
    return out
