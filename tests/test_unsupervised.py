"""KL / MI on pair joints, APC, and the MSA mutual-information baseline."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from pmlm.alphabet import NUM_RESIDUES
from pmlm.evaluation.unsupervised import (
    apc,
    kl_independence,
    msa_mi_apc,
    msa_mutual_information,
    mutual_information,
)
from pmlm.model.symmetry import symmetrize


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


def test_mutual_information_hand_cases():
    x = np.array([[0, 0, 0], [0, 0, 1], [1, 1, 0], [1, 1, 1]])
    mi = msa_mutual_information(x, pseudocount=0.0, block=2)
    np.testing.assert_allclose(mi[0, 1], math.log(2))  # identical balanced columns
    np.testing.assert_allclose(mi[0, 2], 0.0, atol=1e-12)  # independent columns
    np.testing.assert_allclose(mi, mi.T)
    assert (np.diag(mi) == 0).all()


def test_msa_baseline_rejects_non_residue_classes():
    with pytest.raises(ValueError, match="residue classes"):
        msa_mi_apc(np.full((3, 4), 25))
