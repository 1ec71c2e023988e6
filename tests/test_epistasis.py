"""The study's exact read-outs (``pmlm.coevolution.curve_readouts``) end to end with an oracle encoder whose heads
emit the Potts model's exact conditionals: rank correlation 1 and a zero log-loss gap; the same oracle with its pair
(or triple) joint transposed is caught. The training labels of pairs and triples against brute-force conditionals
of a fully enumerable model: the loss of the exact joint is the exact conditional log-loss, a transposed joint
costs more."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from conftest import site_log_conditionals
from tiny_models import masked_pair_loss, upper_pairs

from pmlm import alphabet
from pmlm.coevolution import curve_readouts
from pmlm.coevolution.conditionals import (
    chain_rule_joint,
    jacobian_epistasis,
    sequence_outputs,
    substitution_epistasis,
    substitution_log_conditionals,
)
from pmlm.coevolution.curve_readouts import encoder_records, family_targets
from pmlm.coevolution.curves_config import CurveEvaluation
from pmlm.coevolution.heldout import FamilyData
from pmlm.coevolution.measures import rank_correlation
from pmlm.model.objectives import IGNORE_INDEX
from pmlm.model.triple import triple_labels, triple_loss
from pmlm.synth.exact import pair_epistasis, pair_log_conditional, triple_log_conditional
from pmlm.synth.potts import PottsConfig, PottsModel, family_rng, generate_family

Q = alphabet.NUM_RESIDUES


class Oracle(torch.nn.Module):
    """Stands in for an encoder: its token, pair and triple heads give the exact conditionals of ``potts`` for
    whatever positions a row masks (one, two or three), read from the tokens. ``transpose`` swaps the pair
    joint's axes (class 20 b + a for (a, b)); ``rotate`` permutes the triple joint's axes."""

    def __init__(self, potts: PottsModel, transpose: bool = False, rotate: bool = False, triple: bool = True):
        super().__init__()
        self.potts, self.transpose, self.rotate = potts, transpose, rotate
        self.token_head, self.pair_head = True, True
        self.triple_head = True if triple else None

    def _conditional(self, x: np.ndarray, masked: list[int]) -> np.ndarray:
        x = x.copy()
        x[masked] = 0  # masked positions carry no value; any filler is replaced by the enumeration
        if len(masked) == 1:
            return site_log_conditionals(self.potts, x)[0, masked[0]]
        if len(masked) == 2:
            return pair_log_conditional(self.potts, x, *masked)[0]
        return triple_log_conditional(self.potts, x, tuple(masked))[0]

    def forward(self, tokens, pair_index=None, token_positions=None, triple_index=None, **_):
        classes = (tokens - alphabet.FIRST_RESIDUE_ID)[:, 1:-1].numpy()  # (B, L); <mask> out of range
        masked = [list(np.flatnonzero(tokens[b, 1:-1].numpy() == alphabet.MASK_ID)) for b in range(len(tokens))]
        out = {"logits": None, "pair_logits": None, "triple_logits": None}
        if token_positions is not None:
            rows = []
            for b, pos in token_positions.nonzero().tolist():
                sites = masked[b] or [pos - 1]  # nothing masked (the categorical Jacobian): the site's conditional
                joint = self._conditional(classes[b], sites)
                axis = sites.index(pos - 1)
                rows.append(np.log(np.exp(joint).sum(axis=tuple(a for a in range(joint.ndim) if a != axis))))
            out["logits"] = torch.tensor(np.array(rows), dtype=torch.float32)
        if pair_index is not None:
            rows = []
            for b, i, j in pair_index.tolist():
                assert masked[b] == [i - 1, j - 1]
                joint = self._conditional(classes[b], masked[b])
                rows.append((joint.T if self.transpose else joint).ravel())
            out["pair_logits"] = torch.tensor(np.array(rows), dtype=torch.float32)
        if triple_index is not None:
            rows = []
            for b, i, j, k in triple_index.tolist():
                assert masked[b] == [i - 1, j - 1, k - 1]
                joint = self._conditional(classes[b], masked[b])
                rows.append((joint.transpose(1, 2, 0) if self.rotate else joint).ravel())
            out["triple_logits"] = torch.tensor(np.array(rows), dtype=torch.float32)
        return out


@pytest.fixture(scope="module")
def family():
    cfg = PottsConfig(
        length=20,
        num_sequences=64,
        edges=12,
        triplets=2,
        chains=8,
        burn_in=20,
        thinning=2,
        coupling_strength=2.5,
        triplet_strength=3.0,
    )
    return generate_family("f", cfg, family_rng(2, 0))


def _records(model, family, monkeypatch) -> dict[tuple[str, str], float]:
    """Every read-out of ``pmlm coevolution curves`` of ``model`` on three sequences of the family, as
    {(readout, metric): value}. The oracle has no attention to replay: that read-out is left out."""
    monkeypatch.setattr(curve_readouts, "attention_contact_scores", lambda model, rows, batch: np.zeros((20, 20)))
    contacts = family.model.contact_map()
    data = FamilyData("f", family.sequences[3:], family.sequences[:3], contacts, ["a", "b", "c"], family.model)
    ev = CurveEvaluation(sequences=3, long_separation=12, batch_rows=256)
    with torch.no_grad():
        records = encoder_records(model, family_targets(data, "g", ev, seed=0), ev)
    return {(readout, metric): value for readout, metric, value in records}


# fp32 logits of size ~10 carry ~1e-6 of rounding: far below the spread of the exact values
def test_an_exact_oracle_scores_one_and_a_transposed_joint_is_caught(family, monkeypatch):
    exact = _records(Oracle(family.model), family, monkeypatch)
    for readout in ("pair_joint_score", "pair_joint", "substitution", "chain_rule", "jacobian"):
        assert exact[readout, "spearman_planted"] > 0.9999, readout
        assert exact[readout, "mean_abs_unplanted"] < 1e-4 < 0.5 < exact[readout, "mean_abs_planted"], readout
    for readout in ("pair_joint", "chain_rule"):
        assert abs(exact[readout, "gap_planted"]) < 1e-4 and abs(exact[readout, "gap_unplanted"]) < 1e-4, readout
    # the product of the exact marginals misses exactly the planted dependence
    assert exact["product", "gap_planted"] > 0.01 and abs(exact["product", "gap_unplanted"]) < 1e-4
    # the exact joint departs from independence at planted pairs only
    assert exact["pair_kl", "median_planted"] > 0.01 > 1e-4 > exact["pair_kl", "median_unplanted"]
    assert exact["triple_joint", "spearman_planted"] > 0.9999 and exact["triple_joint", "mean_abs_control"] < 1e-4
    assert exact["triple_joint", "mean_abs_planted"] > 0.5
    assert abs(exact["triple_joint", "gap_planted"]) < 1e-4 and abs(exact["triple_joint", "gap_control"]) < 1e-4
    # pairs cannot say what a three-body term adds: the pairwise composition misses it on planted triplets only
    assert exact["triple_pairs", "gap_planted"] > 0.01 and abs(exact["triple_pairs", "gap_control"]) < 1e-4
    wrong = _records(Oracle(family.model, transpose=True, rotate=True), family, monkeypatch)
    assert wrong["pair_joint", "spearman_planted"] < 0.5 and wrong["pair_joint_score", "spearman_planted"] < 0.5
    assert wrong["pair_joint", "gap_planted"] > 0.1
    assert wrong["triple_joint", "spearman_planted"] < 0.5 and wrong["triple_joint", "gap_planted"] > 0.1
    assert wrong["substitution", "spearman_planted"] > 0.9999  # the token head is still exact
    independent = Oracle(family.model, triple=False)
    independent.pair_head = None  # an MLM: no joint of its own, epistasis from the token head only
    additive = _records(independent, family, monkeypatch)
    assert not {r for r, _ in additive} & {"pair_joint", "pair_joint_score", "pair_kl"}
    assert additive["triple_joint", "spearman_planted"] == 0.0 and additive["triple_joint", "mean_abs_planted"] == 0.0
    assert additive["jacobian", "spearman_planted"] > 0.9999


def test_substitution_chain_rule_and_jacobian_of_an_exact_oracle_are_exact(family):
    """The token head's read-outs of an oracle emitting the exact conditionals: substitution epistasis and the
    categorical Jacobian equal the exact epistasis, the chain rule of the exact conditionals the exact pair joint."""
    oracle = Oracle(family.model, triple=False)
    seq = family.sequences[1].astype(np.int64)
    pairs = np.concatenate([family.model.edges[:4], [[0, 7], [3, 15]]]).astype(np.int64)
    exact_eps = np.stack([pair_epistasis(family.model, seq, i, j)[0] for i, j in pairs])
    exact_log = np.stack([pair_log_conditional(family.model, seq, i, j)[0] for i, j in pairs])
    # fp32 logits: each of the up to 8 terms of a double difference carries ~2^-24 of a log-probability > -32
    tol = 8 * 32 * float(np.finfo(np.float32).eps)
    with torch.no_grad():
        cond = substitution_log_conditionals(oracle, seq, pairs, batch_rows=64)
        marginals = sequence_outputs(oracle, seq, pairs, np.zeros((0, 3), dtype=np.int64)).pair_marginals
        jacobian = jacobian_epistasis(oracle, seq, batch_rows=64)
    np.testing.assert_allclose(substitution_epistasis(cond, seq, pairs), exact_eps, atol=tol)
    np.testing.assert_allclose(chain_rule_joint(cond, marginals), exact_log, atol=tol)
    np.testing.assert_allclose(jacobian[pairs[:, 0], pairs[:, 1]], exact_eps, atol=tol)
    np.testing.assert_allclose(jacobian[pairs[:, 1], pairs[:, 0]], exact_eps.transpose(0, 2, 1), atol=tol)
    assert np.abs(exact_eps[:4]).max() > 1.0  # planted pairs: the agreement is not of zeros
    assert np.abs(np.diagonal(jacobian)).max() == 0.0


def test_rank_correlation():
    x = np.array([1.0, 2.0, 3.0, 4.0])
    assert rank_correlation(x, x**3) == pytest.approx(1.0)
    assert rank_correlation(-x, x) == pytest.approx(-1.0)
    assert rank_correlation(np.zeros(4), x) == 0.0 and rank_correlation(x, np.zeros(4)) is None
    ties = np.array([1.0, 1.0, 2.0, 3.0])  # average ranks 1.5, 1.5, 3, 4
    r = np.array([1.5, 1.5, 3.0, 4.0]) - 2.5
    s = np.arange(1.0, 5.0) - 2.5
    assert rank_correlation(ties, x) == pytest.approx(r @ s / np.sqrt((r @ r) * (s @ s)))


def _enumerable_model() -> PottsModel:
    """L = 5, q = 3 embedded in the 20 residue classes (the other 17 impossible): every state enumerable."""
    rng = np.random.default_rng(3)
    q = 3
    fields = np.full((5, Q), -np.inf)
    fields[:, :q] = rng.normal(size=(5, q))
    couplings = np.zeros((2, Q, Q))
    couplings[:, :q, :q] = 2.0 * rng.normal(size=(2, q, q))
    triple = np.zeros((1, Q, Q, Q))
    triple[0, :q, :q, :q] = 2.0 * rng.normal(size=(q, q, q))
    return PottsModel(
        fields=fields,
        edges=np.array([[0, 3], [1, 2]]),
        couplings=couplings,
        triplets=np.array([[0, 2, 4]]),
        triple_couplings=triple,
    )


def _brute_conditional(model: PottsModel, x: np.ndarray, masked: list[int], sites: list[int]) -> np.ndarray:
    """log P(x_sites | x outside the masked set) over the 20^k classes (-inf off the 3 possible), brute force."""
    q = 3
    states = np.array(list(itertools.product(range(q), repeat=len(masked))))
    full = np.repeat(x[None], len(states), axis=0)
    full[:, masked] = states
    logw = model.log_weight(full)
    out = np.full((Q,) * len(sites), -np.inf)
    index = [masked.index(s) for s in sites]
    for state, w in zip(states, logw):
        key = tuple(state[index])
        out[key] = np.logaddexp(out[key], w)
    return out - np.logaddexp.reduce(out[np.isfinite(out)])


def test_training_labels_follow_the_exact_joint():
    """Four of five positions masked (all other residues fixed): the pair loss of the exact conditional joints,
    laid out as the mirrored head lays them out, is the exact log-loss of the true pairs; transposed, it is
    higher. Likewise for the triple labels."""
    model = _enumerable_model()
    rng = np.random.default_rng(0)
    states = np.array(list(itertools.product(range(3), repeat=5)))
    logw = model.log_weight(states)
    p = np.exp(logw - logw.max())
    samples = states[rng.choice(len(states), size=40, p=p / p.sum())]  # true sequences from the model
    masked = [0, 2, 3, 4]
    exact_total = transposed_total = triple_exact = triple_rotated = 0.0
    pair_ce = triple_ce = 0.0
    for x in samples:
        targets = torch.full((1, 7), IGNORE_INDEX)
        targets[0, [m + 1 for m in masked]] = torch.as_tensor(x[masked])
        upper = upper_pairs(targets.ne(IGNORE_INDEX))  # (6, 3) rows (0, i, j), token positions
        given, swapped, flipped = [], [], []
        for _, i, j in upper.tolist():
            joint = _brute_conditional(model, x, masked, [i - 1, j - 1])  # [x_i, x_j]
            given.append(joint.ravel())
            swapped.append(joint.T.ravel())  # the mirrored row (j, i): [x_j, x_i]
            flipped.append(joint.T.ravel())
            exact_total -= joint[x[i - 1], x[j - 1]] * 2  # both orders
        logits = torch.tensor(np.array(given + swapped), dtype=torch.float64).clamp(min=-1e4)
        ce, _n, _ = masked_pair_loss(logits, upper, targets)
        pair_ce += float(ce)
        wrong = torch.tensor(np.array(flipped + given), dtype=torch.float64).clamp(min=-1e4)
        transposed_total += float(masked_pair_loss(wrong, upper, targets)[0])
        triples = torch.tensor([[0, i + 1, j + 1, k + 1] for i, j, k in itertools.combinations(masked, 3)])
        tri = [_brute_conditional(model, x, masked, [i - 1, j - 1, k - 1]) for _, i, j, k in triples.tolist()]
        tri_logits = torch.tensor(np.array([t.ravel() for t in tri])).clamp(min=-1e4)
        triple_ce += float(triple_loss(tri_logits, triple_labels(triples, targets))[0])
        triple_exact -= sum(t[tuple(x[[i - 1, j - 1, k - 1]])] for t, (_, i, j, k) in zip(tri, triples.tolist()))
        rot = torch.tensor(np.array([t.transpose(2, 0, 1).ravel() for t in tri])).clamp(min=-1e4)
        triple_rotated += float(triple_loss(rot, triple_labels(triples, targets))[0])
    # the losses run in fp32: each of the 2 x 6 + 4 terms per sequence carries a rounding of a few eps32 times the
    # largest finite logit (a log-probability above -20 here)
    tol = 40 * 16 * 8 * float(np.finfo(np.float32).eps) * 20
    assert pair_ce == pytest.approx(exact_total, abs=tol)
    assert transposed_total > pair_ce + 1.0
    assert triple_ce == pytest.approx(triple_exact, abs=tol)
    assert triple_rotated > triple_ce + 1.0
