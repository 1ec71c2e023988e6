"""Contact precision, Q3 and top-1 accuracy on hand-computed cases."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from pmlm.evaluation.metrics import (
    CONTACT_RANGES,
    chance_precision,
    contact_metrics,
    contact_precision,
    q3_accuracy,
    top1_accuracy,
    top_k_precision,
)


def _single_pair(length: int, i: int, j: int, *, contact: bool = True):
    """Scores with one clearly best pair (i, j) and a contact map holding only that pair."""
    scores = np.zeros((length, length))
    scores[i, j] = scores[j, i] = 1.0
    contacts = np.zeros((length, length), dtype=bool)
    contacts[i, j] = contacts[j, i] = contact
    return scores, contacts, np.ones(length, dtype=bool)


def test_top_one_of_five_residues():
    # L = 5, k = floor(5/5) = 1: only the best pair counts
    scores = np.zeros((5, 5))
    scores[0, 3], scores[1, 4] = 0.9, 0.8
    contacts = np.zeros((5, 5), dtype=bool)
    contacts[0, 3] = True
    valid = np.ones(5, dtype=bool)
    assert contact_precision(scores, contacts, valid, min_sep=1, k_divisor=5) == 1.0
    contacts[0, 3], contacts[1, 4] = False, True
    assert contact_precision(scores, contacts, valid, min_sep=1, k_divisor=5) == 0.0
    # k = floor(5/2) = 2: both pairs taken, one of them a contact
    assert contact_precision(scores, contacts, valid, min_sep=1, k_divisor=2) == 0.5


def test_ties_break_by_i_then_j():
    scores = np.full((5, 5), 0.5)
    contacts = np.zeros((5, 5), dtype=bool)
    valid = np.ones(5, dtype=bool)
    contacts[0, 1] = True
    assert contact_precision(scores, contacts, valid, min_sep=1, k_divisor=5) == 1.0
    contacts[0, 1], contacts[0, 2] = False, True
    assert contact_precision(scores, contacts, valid, min_sep=1, k_divisor=5) == 0.0
    # with min_sep = 2 the first pair in (i, j) order is (0, 2)
    assert contact_precision(scores, contacts, valid, min_sep=2, k_divisor=5) == 1.0
    # a tie between (1, 3) and (0, 4) goes to (0, 4)
    scores = np.zeros((5, 5))
    scores[1, 3] = scores[0, 4] = 1.0
    contacts = np.zeros((5, 5), dtype=bool)
    contacts[1, 3] = True
    assert contact_precision(scores, contacts, valid, min_sep=1, k_divisor=5) == 0.0


def test_short_sequence_is_nan():
    scores, contacts, valid = _single_pair(4, 0, 3)
    assert math.isnan(contact_precision(scores, contacts, valid, min_sep=1, k_divisor=5))
    assert contact_precision(scores, contacts, valid, min_sep=1, k_divisor=4) == 1.0


def test_masked_residues_and_denominator_stays_floor_l_over_k():
    length = 10
    scores = np.arange(length * length, dtype=float).reshape(length, length)[::-1].copy()
    contacts = np.ones((length, length), dtype=bool)
    valid = np.ones(length, dtype=bool)
    # s >= 6 in L = 10: 10 pairs, all contacts, k = 10
    assert contact_precision(scores, contacts, valid, min_sep=6, k_divisor=1) == 1.0
    # residue 0 unresolved: 6 pairs left, all taken, still divided by k = 10
    valid[0] = False
    assert contact_precision(scores, contacts, valid, min_sep=6, k_divisor=1) == pytest.approx(0.6)
    # the best-scoring pair (a non-contact) touches a masked residue and must not be taken
    scores, contacts, valid = _single_pair(length, 0, 7, contact=False)
    contacts[2, 9] = True
    scores[2, 9] = 0.5
    valid[0] = False
    assert contact_precision(scores, contacts, valid, min_sep=6, k_divisor=10) == 1.0
    # a (L, L) pair mask behaves like the per-residue one
    pair_valid = valid[:, None] & valid[None, :]
    assert contact_precision(scores, contacts, pair_valid, min_sep=6, k_divisor=10) == 1.0


@pytest.mark.parametrize(
    "sep, members",
    [
        (5, set()),
        (6, {"short", "tape_all"}),
        (11, {"short", "tape_all"}),
        (12, {"medium", "medium_long", "tape_all"}),
        (23, {"medium", "medium_long", "tape_all"}),
        (24, {"long", "medium_long", "tape_all"}),
    ],
)
def test_range_boundaries_lower_inclusive_upper_exclusive(sep, members):
    length = 30
    scores, contacts, valid = _single_pair(length, 2, 2 + sep)
    for name, (min_sep, max_sep) in CONTACT_RANGES.items():
        p = contact_precision(scores, contacts, valid, min_sep=min_sep, max_sep=max_sep, k_divisor=length)
        assert p == (1.0 if name in members else 0.0), name


def test_unknown_labels_are_not_contacts():
    # TAPE-style maps mark unknown pairs with -1; they must not count as true contacts
    scores, _, valid = _single_pair(6, 0, 5)
    labels = np.full((6, 6), -1)
    assert contact_precision(scores, labels, valid, min_sep=1, k_divisor=6) == 0.0


def _reference_precision(scores, contacts, resolved, min_sep, max_sep, k_div):
    """Direct transcription of the definition, for cross-checking on random inputs."""
    length = len(scores)
    pairs = [
        (-scores[i][j], i, j)
        for i in range(length)
        for j in range(i + 1, length)
        if resolved[i] and resolved[j] and j - i >= min_sep and (max_sep is None or j - i < max_sep)
    ]
    k = length // k_div
    if k == 0:
        return math.nan
    top = sorted(pairs)[:k]
    return sum(bool(contacts[i][j]) for _, i, j in top) / k


def test_matches_reference_on_random_proteins_with_ties():
    rng = np.random.default_rng(0)
    for _ in range(20):
        length = int(rng.integers(3, 60))
        scores = rng.integers(0, 4, size=(length, length)).astype(float)  # many ties
        contacts = rng.random((length, length)) < 0.3
        resolved = rng.random(length) < 0.8
        for min_sep, max_sep in CONTACT_RANGES.values():
            for k_div in (1, 2, 5):
                got = contact_precision(scores, contacts, resolved, min_sep=min_sep, max_sep=max_sep, k_divisor=k_div)
                want = _reference_precision(scores, contacts, resolved, min_sep, max_sep, k_div)
                assert got == pytest.approx(want, nan_ok=True)


def test_per_protein_mean_and_pooled():
    ranges = {"any": (1, None)}
    divisors = {"L/5": 5}
    # A: L = 10, k = 2, one of the two best pairs is a contact -> 0.5
    a_scores = np.zeros((10, 10))
    a_scores[0, 1], a_scores[2, 3] = 0.9, 0.8
    a_contacts = np.zeros((10, 10), dtype=bool)
    a_contacts[0, 1] = True
    # B: L = 5, k = 1, right -> 1.0;  C: L = 3, k = 0 -> excluded
    b = _single_pair(5, 0, 4)
    c = _single_pair(3, 0, 2)
    proteins = [(a_scores, a_contacts, np.ones(10, bool)), b, c]
    cell = contact_metrics(proteins, ranges, divisors)["any"]["L/5"]
    assert cell.mean == pytest.approx(0.75)
    assert cell.pooled == pytest.approx(2 / 3)
    assert (cell.n_proteins, cell.n_excluded) == (2, 1)


def test_contact_metrics_default_table_and_torch_input():
    scores, contacts, valid = _single_pair(40, 3, 30)
    result = contact_metrics([(torch.from_numpy(scores).float(), torch.from_numpy(contacts), torch.from_numpy(valid))])
    assert set(result) == set(CONTACT_RANGES)
    assert result["long"]["L/5"].mean == pytest.approx(1 / 8)  # one hit in k = 8
    assert result["medium_long"]["L/5"].mean == pytest.approx(1 / 8)
    assert result["short"]["L"].mean == 0.0


def test_nan_scores_rejected():
    scores, contacts, valid = _single_pair(6, 0, 5)
    scores[1, 4] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        contact_precision(scores, contacts, valid, min_sep=1, k_divisor=1)
    with pytest.raises(ValueError, match="shape"):
        contact_precision(scores, contacts[:5, :5], valid, min_sep=1, k_divisor=1)


def test_q3_pooled_and_per_protein():
    preds = [np.array([0, 1, 2, 2]), np.array([[0.1, 0.2, 3.0], [5.0, 0.0, 0.0]])]  # classes, logits
    targets = [np.array([0, 1, 1, 2]), np.array([2, -1])]  # -1 = not scored
    acc = q3_accuracy(preds, targets)
    assert acc.pooled == pytest.approx(4 / 5)
    assert acc.per_protein_mean == pytest.approx((3 / 4 + 1.0) / 2)
    assert (acc.n_residues, acc.n_proteins) == (5, 2)
    masks = [np.array([True, True, False, True]), np.array([False, False])]
    acc = q3_accuracy(preds, targets, masks)
    assert acc.pooled == 1.0 and acc.n_proteins == 1 and acc.n_residues == 3


def test_top1_accuracy():
    logits = np.array([[0.0, 2.0, 1.0], [3.0, 0.0, 0.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
    assert top1_accuracy(logits, np.array([1, 0, 0, -1])) == pytest.approx(2 / 3)
    assert top1_accuracy(np.array([2, 2]), np.array([2, 1])) == 0.5
    assert math.isnan(top1_accuracy(np.array([1]), np.array([-1])))


def test_top_k_precision_and_chance_hand_case():
    contacts = np.zeros((10, 10), dtype=bool)
    contacts[0, 6] = contacts[6, 0] = contacts[1, 9] = contacts[9, 1] = True
    scores = np.zeros((10, 10))
    scores[0, 3] = 9.0  # |i-j| = 3: outside the range, must be ignored
    scores[0, 6] = 5.0
    scores[2, 8] = 4.0
    assert top_k_precision(scores, contacts, k=2) == 0.5
    assert top_k_precision(scores, contacts, k=1) == 1.0
    assert chance_precision(contacts) == pytest.approx(2 / 10)  # 10 pairs with |i-j| >= 6
