"""Evaluation metrics with exact, documented definitions: contact precision at L/k by
separation range, 3-state secondary-structure accuracy (Q3) and top-1 accuracy.

Contact precision at L/k (design brief, section 3), for one protein of sequence length L:

1. Candidates are the pairs (i, j) with i < j, both residues resolved (``valid``), and
   ``min_sep <= j - i < max_sep`` (lower bound inclusive, upper exclusive; ``max_sep=None``
   means no upper bound).
2. Candidates are ranked by score, highest first. Ties are broken deterministically by
   (i, j) ascending: a stable sort of the row-major candidate list on descending score.
3. The top ``k = floor(L / k_divisor)`` candidates are taken, L being the *sequence length*
   (not the number of resolved residues), and precision = true contacts among them / k.
   When fewer than k candidates exist, every candidate is taken and the denominator stays
   k: the missing predictions count as wrong (as the brief's definition says; TAPE's code
   then picks masked-out pairs, ranked at probability zero, and sums their labels as they
   are, 0 or its -1 for unknown).
4. ``k == 0`` (L < k_divisor) gives NaN; such proteins are excluded from averages and
   counted (``n_excluded``).

Scores are read from the upper triangle only (i < j); symmetrise an asymmetric prediction
first. TAPE's own P@L/5 (songlab-cal/tape ``PairwiseContactPredictionHead.compute_precision_at_l5``,
``tape/models/modeling_utils.py`` l.871-887) ranks the same way: one triangle, ``j - i >= 6``
(``(y_ind - x_ind) >= 6`` over an ``ij`` meshgrid), pairs with an unknown label zeroed but kept at
the bottom of the ranking, top ``L // 5`` with L the protein's length (our ``tape_all`` range). It
differs in the average: it pools the hits of a batch's proteins (hits / picks over the batch) and
averages those batch values, so it equals our per-protein mean only with one protein per batch;
our ``_pooled`` variants pool over the whole test set.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

# name -> (min_sep inclusive, max_sep exclusive or None); separation s = j - i
CONTACT_RANGES: dict[str, tuple[int, int | None]] = {
    "short": (6, 12),
    "medium": (12, 24),
    "long": (24, None),
    "medium_long": (12, None),  # the paper's TAPE-Contact metric (s >= 12)
    "tape_all": (6, None),  # what TAPE's own code counts (s >= 6)
}

# name -> k_divisor: P@L, P@L/2, P@L/5
TOP_K_DIVISORS: dict[str, int] = {"L": 1, "L/2": 2, "L/5": 5}

# TAPE pads per-residue labels with -1; the same value marks "no label" here.
IGNORE_LABEL = -1


def _as_numpy(x) -> np.ndarray:
    """Accept numpy arrays, nested lists or (CPU or GPU) torch tensors without importing torch."""
    if hasattr(x, "detach"):
        x = x.detach().float().cpu().numpy() if x.is_floating_point() else x.detach().cpu().numpy()
    return np.asarray(x)


def _pair_validity(valid, length: int) -> np.ndarray:
    """(L,) per-residue mask or (L, L) pair mask -> (L, L) bool pair mask."""
    valid = _as_numpy(valid).astype(bool)
    if valid.shape == (length,):
        return valid[:, None] & valid[None, :]  # (L, L)
    if valid.shape == (length, length):
        return valid
    raise ValueError(f"valid must have shape ({length},) or ({length}, {length}), got {valid.shape}")


def _ranked_candidates(scores, contacts, valid) -> tuple[int, np.ndarray, np.ndarray]:
    """Upper-triangle candidates of one protein, ranked best first.

    Returns (L, separation (P,), is_contact (P,)) for the P valid pairs i < j, ordered by
    descending score with ties broken by (i, j) ascending.
    """
    scores = _as_numpy(scores).astype(np.float64)
    if scores.ndim != 2 or scores.shape[0] != scores.shape[1]:
        raise ValueError(f"scores must be a square (L, L) matrix, got shape {scores.shape}")
    length = scores.shape[0]
    contacts = _as_numpy(contacts)
    if contacts.shape != (length, length):
        raise ValueError(f"contacts must have shape ({length}, {length}), got {contacts.shape}")
    pair_valid = _pair_validity(valid, length)
    # row-major order of np.nonzero is (i, j) ascending, which the stable sort keeps for ties
    i, j = np.nonzero(np.triu(pair_valid, k=1))  # (P,), (P,)
    cand_scores = scores[i, j]
    if np.isnan(cand_scores).any():
        raise ValueError("scores contain NaN at valid pairs; a score is needed for every resolved pair")
    order = np.argsort(-cand_scores, kind="stable")
    # > 0 rather than a cast: TAPE-style maps mark unknown pairs with -1, which is not a contact
    return length, (j - i)[order], (contacts[i, j] > 0)[order]


def _hits(
    sep: np.ndarray, is_contact: np.ndarray, length: int, min_sep: int, max_sep: int | None, k_divisor: int
) -> tuple[int, int]:
    """(true contacts among the top k in range, k) for already ranked candidates."""
    k = length // k_divisor
    in_range = sep >= min_sep
    if max_sep is not None:
        in_range &= sep < max_sep
    top = is_contact[in_range][:k]
    return int(top.sum()), k


def _check_range(min_sep: int, max_sep: int | None, k_divisor: int) -> None:
    if min_sep < 1:
        raise ValueError(f"min_sep must be >= 1 (pairs i < j), got {min_sep}")
    if max_sep is not None and max_sep <= min_sep:
        raise ValueError(f"max_sep ({max_sep}) must be greater than min_sep ({min_sep}) or None")
    if k_divisor < 1:
        raise ValueError(f"k_divisor must be a positive integer, got {k_divisor}")


def contact_precision(scores, contacts, valid, *, min_sep: int, max_sep: int | None = None, k_divisor: int) -> float:
    """Precision of the top floor(L / k_divisor) pairs in a separation range; NaN if that is 0.

    scores: (L, L) float, higher = more likely a contact; contacts: (L, L) bool;
    valid: (L,) resolved-residue mask or (L, L) pair mask. See the module docstring for the
    exact rule (tie order, denominator when few candidates exist).
    """
    _check_range(min_sep, max_sep, k_divisor)
    length, sep, is_contact = _ranked_candidates(scores, contacts, valid)
    correct, k = _hits(sep, is_contact, length, min_sep, max_sep, k_divisor)
    return correct / k if k > 0 else math.nan


def top_k_precision(scores, contacts, k: int, min_separation: int = 6) -> float:
    """Fraction of true contacts among the k highest-scoring pairs with j - i >= min_separation,
    every pair valid, ranked and tie-broken as :func:`contact_precision` (used with k = the number
    of planted couplings of a synthetic family)."""
    length = _as_numpy(scores).shape[0]
    _, sep, is_contact = _ranked_candidates(scores, contacts, np.ones(length, dtype=bool))
    in_range = is_contact[sep >= min_separation]
    if k < 1 or k > in_range.size:
        raise ValueError(f"k must be in [1, {in_range.size}] for length {length}, got {k}")
    return float(in_range[:k].mean())


def chance_precision(contacts, min_separation: int = 6) -> float:
    """Expected precision of random scores: contacts / pairs with j - i >= min_separation."""
    contacts = _as_numpy(contacts)
    i, j = np.triu_indices(contacts.shape[0], k=min_separation)
    return float((contacts[i, j] > 0).mean())


@dataclass
class PrecisionSummary:
    """One cell of a contact table: a separation range at one L/k over a set of proteins."""

    mean: float  # mean over proteins of per-protein precision (the reported number)
    pooled: float  # total true contacts / total k over the same proteins
    n_proteins: int  # proteins that entered the averages
    n_excluded: int  # proteins with floor(L/k) == 0 (NaN), left out and counted here


def contact_metrics(
    proteins: Iterable[tuple],
    ranges: dict[str, tuple[int, int | None]] | None = None,
    divisors: dict[str, int] | None = None,
) -> dict[str, dict[str, PrecisionSummary]]:
    """Contact precision for every range x L/k over a set of proteins.

    proteins yields (scores (L, L), contacts (L, L), valid (L,) or (L, L)). Returns
    ``result[range_name][divisor_name]`` -> PrecisionSummary; e.g.
    ``result["medium_long"]["L/5"].mean`` is the TAPE-Contact number and
    ``result["long"]["L"].mean`` the RaptorX-Contact one.
    """
    ranges = CONTACT_RANGES if ranges is None else ranges
    divisors = TOP_K_DIVISORS if divisors is None else divisors
    for min_sep, max_sep in ranges.values():
        for k_div in divisors.values():
            _check_range(min_sep, max_sep, k_div)
    keys = [(r, d) for r in ranges for d in divisors]
    per_protein: dict[tuple[str, str], list[float]] = {key: [] for key in keys}
    correct_sum = dict.fromkeys(keys, 0)
    k_sum = dict.fromkeys(keys, 0)
    excluded = dict.fromkeys(keys, 0)
    for scores, contacts, valid in proteins:
        # rank once per protein; every range and L/k reads the same ordering
        length, sep, is_contact = _ranked_candidates(scores, contacts, valid)
        for r_name, d_name in keys:
            min_sep, max_sep = ranges[r_name]
            correct, k = _hits(sep, is_contact, length, min_sep, max_sep, divisors[d_name])
            if k == 0:
                excluded[(r_name, d_name)] += 1
                continue
            per_protein[(r_name, d_name)].append(correct / k)
            correct_sum[(r_name, d_name)] += correct
            k_sum[(r_name, d_name)] += k
    result: dict[str, dict[str, PrecisionSummary]] = {r: {} for r in ranges}
    for key in keys:
        values = per_protein[key]
        result[key[0]][key[1]] = PrecisionSummary(
            mean=float(np.mean(values)) if values else math.nan,
            pooled=correct_sum[key] / k_sum[key] if k_sum[key] else math.nan,
            n_proteins=len(values),
            n_excluded=excluded[key],
        )
    return result


def _class_predictions(pred) -> np.ndarray:
    """Logits (..., C) float -> argmax classes (...); integer predictions pass through."""
    pred = _as_numpy(pred)
    if np.issubdtype(pred.dtype, np.floating):
        return pred.argmax(axis=-1)
    return pred.astype(np.int64)


@dataclass
class AccuracySummary:
    """Per-residue accuracy over a set of proteins, both ways of averaging."""

    pooled: float  # correct residues / scored residues over the whole set (what TAPE reports)
    per_protein_mean: float  # mean of each protein's accuracy (proteins with no scored residue left out)
    n_residues: int
    n_proteins: int


def q3_accuracy(preds: Sequence, targets: Sequence, masks: Sequence | None = None) -> AccuracySummary:
    """3-state secondary-structure accuracy over a set of proteins.

    preds[p]: (L,) predicted classes or (L, 3) logits; targets[p]: (L,) classes 0..2
    (H=0, E=1, C=2 as in TAPE), ``IGNORE_LABEL`` (-1) = not scored; masks[p]: optional (L,)
    bool, False = not scored. A padded batch (B, L[, 3]) works too, one row per protein.
    """
    if masks is not None and len(masks) != len(targets):
        raise ValueError(f"got {len(targets)} targets but {len(masks)} masks")
    if len(preds) != len(targets):
        raise ValueError(f"got {len(preds)} predictions but {len(targets)} targets")
    correct_total = scored_total = 0
    per_protein: list[float] = []
    for p, (pred, target) in enumerate(zip(preds, targets)):
        pred = _class_predictions(pred)
        target = _as_numpy(target).astype(np.int64)
        if pred.shape != target.shape:
            raise ValueError(f"protein {p}: prediction shape {pred.shape} != target shape {target.shape}")
        scored = target != IGNORE_LABEL
        if masks is not None:
            scored &= _as_numpy(masks[p]).astype(bool)
        n = int(scored.sum())
        if n == 0:
            continue
        correct = int((pred[scored] == target[scored]).sum())
        correct_total += correct
        scored_total += n
        per_protein.append(correct / n)
    return AccuracySummary(
        pooled=correct_total / scored_total if scored_total else math.nan,
        per_protein_mean=float(np.mean(per_protein)) if per_protein else math.nan,
        n_residues=scored_total,
        n_proteins=len(per_protein),
    )


def top1_accuracy(pred, labels) -> float:
    """Fraction of examples whose top-1 class equals the label (remote homology).

    pred: (N, C) logits or (N,) classes; labels: (N,), ``IGNORE_LABEL`` entries not scored.
    NaN when nothing is scored.
    """
    pred = _class_predictions(pred)
    labels = _as_numpy(labels).astype(np.int64)
    if pred.shape != labels.shape:
        raise ValueError(f"prediction shape {pred.shape} != label shape {labels.shape}")
    scored = labels != IGNORE_LABEL
    n = int(scored.sum())
    return float((pred[scored] == labels[scored]).sum() / n) if n else math.nan
