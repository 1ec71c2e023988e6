"""KL / MI on pair joints, APC, and the MSA mutual-information baseline."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from pmlm.alphabet import NUM_RESIDUES
from pmlm.evaluation.unsupervised import (
    apc, contact_scores_from_joint, kl_independence, msa_mi_apc, mutual_information, sequence_weights, symmetrize,
)


def _random_marginal(rng, *shape):
    p = rng.random((*shape, NUM_RESIDUES)) + 0.05
    return p / p.sum(-1, keepdims=True)


def test_independent_joint_scores_zero():
    rng = np.random.default_rng(0)
    p_i, p_j = _random_marginal(rng, 3), _random_marginal(rng, 3)
    joint = p_i[:, :, None] * p_j[:, None, :]  # (3, 20, 20)
    assert np.allclose(kl_independence(joint), 0.0, atol=1e-12)
    assert np.allclose(kl_independence(joint, p_i, p_j), 0.0, atol=1e-12)
    assert np.allclose(mutual_information(joint), 0.0, atol=1e-12)
    # the pair head's flat 400-class layout gives the same numbers
    assert np.allclose(mutual_information(joint.reshape(3, 400)), 0.0, atol=1e-12)
    # torch in, torch out
    out = kl_independence(torch.from_numpy(joint))
    assert isinstance(out, torch.Tensor) and torch.allclose(out, torch.zeros(3, dtype=out.dtype), atol=1e-9)


def test_coupled_joint_scores_positive():
    # x_j = x_i, uniform: MI = log 20 exactly
    identical = np.eye(NUM_RESIDUES) / NUM_RESIDUES
    assert mutual_information(identical) == pytest.approx(math.log(NUM_RESIDUES))
    # half coupled, half independent: strictly positive, below the fully coupled value
    mixed = 0.5 * identical + 0.5 / NUM_RESIDUES**2
    kl = kl_independence(mixed)
    mi = mutual_information(mixed)
    assert 0 < mi < math.log(NUM_RESIDUES)
    # KL(u x u || mixed) by hand: off-diagonal q/p = (1/400)/(0.5/400) = 2, diagonal (1/400)/(0.5/20+0.5/400)
    n = NUM_RESIDUES
    q = 1 / n**2
    want = (n * n - n) * q * math.log(q / (0.5 / n**2)) + n * q * math.log(q / (0.5 / n + 0.5 / n**2))
    assert kl == pytest.approx(want)
    assert kl > 0
    # marginals that disagree with the joint also make the KL positive
    rng = np.random.default_rng(1)
    p = _random_marginal(rng)
    assert kl_independence(np.outer(p, p), p, np.full(n, 1 / n)) > 0


def test_symmetrize():
    m = np.array([[0.0, 1.0], [3.0, 0.0]])
    assert np.array_equal(symmetrize(m), [[0.0, 2.0], [2.0, 0.0]])


def test_apc_hand_matrix():
    m = np.array([[0.0, 1.0, 2.0], [1.0, 0.0, 3.0], [2.0, 3.0, 0.0]])
    # off-diagonal means: rows 1.5, 2, 2.5; overall 12 / 6 = 2
    want = np.array([[0.0, -0.5, 0.125], [-0.5, 0.0, 0.5], [0.125, 0.5, 0.0]])
    assert np.allclose(apc(m), want)
    # a diagonal value must not change the result under the default
    m_diag = m + np.diag([7.0, 8.0, 9.0])
    assert np.allclose(apc(m_diag), want)
    # sum-based form (ESM): row sums 3, 4, 5; total 12; diagonal kept
    want_sum = np.array([[-0.75, 0.0, 0.75], [0.0, -4 / 3, 3 - 20 / 12], [0.75, 3 - 20 / 12, -25 / 12]])
    assert np.allclose(apc(m, exclude_diagonal=False), want_sum)
    assert np.allclose(apc(torch.from_numpy(m)).numpy(), want)
    assert np.array_equal(apc(np.zeros((4, 4))), np.zeros((4, 4)))


def test_contact_scores_from_joint_finds_coupled_pair():
    rng = np.random.default_rng(2)
    length = 8
    p = _random_marginal(rng, length)
    joint = p[:, None, :, None] * p[None, :, None, :]  # (L, L, 20, 20) independent
    coupled = 0.7 * np.diag(p[1]) + 0.3 * np.outer(p[1], p[5])
    joint[1, 5], joint[5, 1] = coupled, coupled.T
    for measure in ("kl", "mi"):
        scores = contact_scores_from_joint(joint, p if measure == "kl" else None, measure=measure)
        assert scores.shape == (length, length)
        assert np.allclose(scores, scores.T) and np.all(np.diag(scores) == 0)
        best = np.unravel_index(np.argmax(np.triu(scores, 1)), scores.shape)
        assert tuple(int(x) for x in best) == (1, 5), measure


def test_sequence_weights_cluster_identical_sequences():
    msa = np.array([[0, 1, 2, 3, 4]] * 3 + [[5, 6, 7, 8, 9]])
    assert np.allclose(sequence_weights(msa, 0.8), [1 / 3, 1 / 3, 1 / 3, 1.0])
    # 4 of 5 columns identical = 80 %: counted as neighbours at the 0.8 threshold
    msa = np.array([[0, 1, 2, 3, 4], [0, 1, 2, 3, 9]])
    assert np.allclose(sequence_weights(msa, 0.8), [0.5, 0.5])
    assert np.allclose(sequence_weights(msa, 0.9), [1.0, 1.0])


def test_msa_mi_apc_recovers_planted_coupling():
    rng = np.random.default_rng(3)
    n_seq, length = 400, 16
    msa = rng.integers(0, NUM_RESIDUES, size=(n_seq, length))
    msa[:, 12] = (msa[:, 3] + 5) % NUM_RESIDUES  # column 12 is a function of column 3
    msa[rng.random((n_seq, length)) < 0.05] = -1  # scattered gaps
    for kwargs in ({}, {"pseudocount": 0.0, "reweight_identity": None}):
        scores = msa_mi_apc(msa, **kwargs)
        assert scores.shape == (length, length)
        assert np.allclose(scores, scores.T)
        best = np.unravel_index(np.argmax(np.triu(scores, 1)), scores.shape)
        assert tuple(int(x) for x in best) == (3, 12), kwargs
    with pytest.raises(ValueError, match="residue classes"):
        msa_mi_apc(np.full((3, 4), 25))
    with pytest.raises(ValueError, match="pseudocount"):
        msa_mi_apc(msa, pseudocount=1.0)
