"""Exact conditionals and epistasis of a Potts model (pmlm.synth.exact) against brute force on models small
enough to enumerate every sequence (L = 5, q = 3 and q = 4), with pair couplings and a three-body term;
three-body terms in the Gibbs sampler against the exact distribution; the parameter file round trip."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
from conftest import site_log_conditionals

from pmlm.alphabet import NUM_RESIDUES, RESIDUES
from pmlm.cli import main
from pmlm.errors import InputError
from pmlm.synth.exact import (
    coupled_pairs,
    local_fields,
    pair_epistasis,
    pair_log_conditional,
    triple_epistasis,
    triple_log_conditional,
)
from pmlm.synth.gibbs import gibbs_sample
from pmlm.synth.parameters import TENSORS, read_potts
from pmlm.synth.potts import PottsConfig, PottsModel, family_rng, generate_family

# float64 sums of a handful of O(1) terms: exact up to a few ulps
ATOL = 1e-10


def small_model(q: int, triplet: bool, seed: int = 0) -> PottsModel:
    """L = 5: edges (0, 2), (1, 4), (2, 4), and (with ``triplet``) a three-body term on (0, 1, 3); every table
    random, so no entry is special."""
    rng = np.random.default_rng(seed)
    edges = np.array([[0, 2], [1, 4], [2, 4]])
    kwargs = {}
    if triplet:
        kwargs = {"triplets": np.array([[0, 1, 3]]), "triple_couplings": rng.normal(size=(1, q, q, q))}
    return PottsModel(fields=rng.normal(size=(5, q)), edges=edges, couplings=rng.normal(size=(3, q, q)), **kwargs)


def enumerate_states(model: PottsModel) -> tuple[np.ndarray, np.ndarray]:
    """Every sequence (q^L, L) and its log-probability under the full joint."""
    q, length = model.fields.shape[1], model.length
    states = np.array(list(itertools.product(range(q), repeat=length)))
    logw = model.log_weight(states)
    return states, logw - np.log(np.exp(logw - logw.max()).sum()) - logw.max()


def brute_conditional(states, logp, x, sites) -> np.ndarray:
    """log P(x_sites = y | the rest of x) by summing the enumerated joint, shape (q,) * len(sites)."""
    q = int(states.max()) + 1
    rest = [s for s in range(states.shape[1]) if s not in sites]
    keep = (states[:, rest] == x[rest]).all(axis=1)
    out = np.full((q,) * len(sites), -np.inf)
    for state, value in zip(states[keep], logp[keep]):
        out[tuple(state[list(sites)])] = value
    return out - np.log(np.exp(out).sum())


@pytest.mark.parametrize("q, triplet", [(3, False), (3, True), (4, True)])
def test_conditionals_and_epistasis_match_brute_force(q, triplet):
    model = small_model(q, triplet, seed=q)
    states, logp = enumerate_states(model)
    backgrounds = states[np.random.default_rng(1).choice(len(states), size=6, replace=False)]
    singles = site_log_conditionals(model, backgrounds)  # (N, L, q)
    for n, x in enumerate(backgrounds):
        for s in range(model.length):
            np.testing.assert_allclose(singles[n, s], brute_conditional(states, logp, x, [s]), atol=ATOL)
        for i, j in itertools.permutations(range(model.length), 2):
            joint = brute_conditional(states, logp, x, [i, j])  # [a, b] = log P(x_i = a, x_j = b | rest)
            np.testing.assert_allclose(pair_log_conditional(model, x, i, j)[0], joint, atol=ATOL)
            # epistasis = double-mutant score minus the two single-mutant scores (each site masked alone)
            double = joint - joint[x[i], x[j]]
            single_i = brute_conditional(states, logp, x, [i])
            single_j = brute_conditional(states, logp, x, [j])
            want = double - (single_i - single_i[x[i]])[:, None] - (single_j - single_j[x[j]])[None, :]
            np.testing.assert_allclose(pair_epistasis(model, x, i, j)[0], want, atol=ATOL)
        for sites in itertools.permutations(range(model.length), 3):
            joint = brute_conditional(states, logp, x, list(sites))
            np.testing.assert_allclose(triple_log_conditional(model, x, sites)[0], joint, atol=ATOL)
            wi, wj, wk = (x[s] for s in sites)
            corners = (
                joint
                - joint[:, :, [wk]]
                - joint[:, [wj], :]
                - joint[[wi], :, :]
                + joint[:, [wj]][:, :, [wk]]
                + joint[[wi]][:, :, [wk]]
                + joint[[wi]][:, [wj]]
                - joint[wi, wj, wk]
            )
            np.testing.assert_allclose(triple_epistasis(model, x, sites)[0], corners, atol=ATOL)


def test_the_closed_forms():
    """Pair: J(a,b) - J(a,x_j) - J(x_i,b) + J(x_i,x_j), zero for a pair no term joins; third order: zero without
    a three-body term, the alternating sum of K with one; the joint is not symmetric, so a transposed one fails."""
    model = small_model(3, triplet=True, seed=5)
    x = np.array([[2, 0, 1, 1, 0]])
    J = model.couplings[0]  # edge (0, 2)
    want = J - J[:, [x[0, 2]]] - J[[x[0, 0]], :] + J[x[0, 0], x[0, 2]]
    np.testing.assert_allclose(pair_epistasis(model, x, 0, 2)[0], want, atol=ATOL)
    np.testing.assert_allclose(pair_epistasis(model, x, 2, 0)[0], want.T, atol=ATOL)
    assert not np.allclose(want, want.T)  # the transposed joint is a different answer
    assert np.abs(pair_epistasis(model, x, 3, 4)).max() == 0.0  # no term joins 3 and 4
    assert np.abs(triple_epistasis(model, x, (0, 2, 4))).max() == 0.0  # pair couplings only: no third order
    K = model.triple_couplings[0]
    a, b, c = x[0, 0], x[0, 1], x[0, 3]
    k3 = (
        K
        - K[:, :, [c]]
        - K[:, [b], :]
        - K[[a], :, :]
        + K[:, [b]][:, :, [c]]
        + K[[a]][:, :, [c]]
        + K[[a]][:, [b]]
        - K[a, b, c]
    )
    np.testing.assert_allclose(triple_epistasis(model, x, (0, 1, 3))[0], k3, atol=ATOL)
    np.testing.assert_allclose(triple_epistasis(model, x, (3, 0, 1))[0], k3.transpose(2, 0, 1), atol=ATOL)
    pairwise = small_model(3, triplet=False, seed=5)
    assert np.abs(triple_epistasis(pairwise, x, (0, 1, 3))).max() == 0.0
    assert coupled_pairs(model) == {(0, 2), (1, 4), (2, 4), (0, 1), (0, 3), (1, 3)}
    # local fields hold every term of a site: summing a site's own terms reproduces the energy differences
    f = local_fields(model, x)[0]
    y = x.copy()
    y[0, 3] = 2
    assert model.log_weight(y)[0] - model.log_weight(x)[0] == pytest.approx(f[3, 2] - f[3, x[0, 3]], abs=ATOL)


def test_gibbs_sampler_with_a_three_body_term_matches_the_exact_distribution():
    """Three sites joined only by a strong three-body term: 20^3 states are enumerable."""
    rng = np.random.Generator(np.random.PCG64(4))
    q = NUM_RESIDUES
    fields = np.log(rng.dirichlet(np.full(q, 2.0), size=3))
    triple = 0.1 * rng.standard_normal((1, q, q, q))
    favoured = [rng.permutation(q)[:6] for _ in range(3)]
    triple[0, favoured[0], favoured[1], favoured[2]] += 5.0
    model = PottsModel(
        fields=fields,
        edges=np.zeros((0, 2), dtype=np.int64),
        couplings=np.zeros((0, q, q)),
        triplets=np.array([[0, 1, 2]]),
        triple_couplings=triple,
    )
    states = np.array(list(itertools.product(range(q), repeat=3)))
    logw = model.log_weight(states)
    p = np.exp(logw - logw.max())
    p /= p.sum()
    exact_term = float(p @ triple[0, states[:, 0], states[:, 1], states[:, 2]])
    seqs, _ = gibbs_sample(model, 20000, rng, chains=200, burn_in=20, thinning=3)
    empirical = float(triple[0, seqs[:, 0], seqs[:, 1], seqs[:, 2]].mean())
    marginals = [p @ (states[:, s, None] == np.arange(q)) for s in range(3)]
    independent = float(np.einsum("a,b,c,abc->", *marginals, triple[0]))
    assert exact_term - independent > 0.3  # the check can tell the term apart from independent sites
    assert abs(empirical - exact_term) < 0.05
    for s in range(3):
        np.testing.assert_allclose(np.bincount(seqs[:, s], minlength=q) / len(seqs), marginals[s], atol=0.02)


def test_planted_triplets_leave_pairwise_families_unchanged():
    small = {"length": 32, "num_sequences": 64, "chains": 8, "burn_in": 5, "thinning": 1}
    plain = generate_family("a", PottsConfig(**small), family_rng(3, 0))
    again = generate_family("a", PottsConfig(**small, triplets=0), family_rng(3, 0))
    np.testing.assert_array_equal(plain.sequences, again.sequences)
    with_triplets = generate_family("a", PottsConfig(**small, triplets=3), family_rng(3, 0))
    t = with_triplets.model.triplets
    assert t.shape == (3, 3) and len(set(t.ravel().tolist())) == 9
    assert (np.diff(t, axis=1) >= 6).all()
    np.testing.assert_array_equal(with_triplets.model.edges, plain.model.edges)
    assert with_triplets.model.triple_couplings.shape == (3, 20, 20, 20)


def test_synth_writes_each_family_model_and_reads_it_back(tmp_path):
    out = tmp_path / "synth"
    assert (
        main(
            [
                "synth",
                "--out",
                str(out),
                "--families",
                "2",
                "--length",
                "32",
                "--sequences",
                "50",
                "--chains",
                "10",
                "--burn-in",
                "5",
                "--thinning",
                "1",
                "--triplets",
                "2",
                "--seed",
                "4",
            ]
        )
        == 0
    )
    cfg = PottsConfig(length=32, num_sequences=50, chains=10, burn_in=5, thinning=1, triplets=2)
    fam = generate_family("synth001", cfg, family_rng(4, 1))
    model = read_potts(out / "params" / "synth001.safetensors")
    for name in ("fields", "edges", "couplings", "triplets", "triple_couplings"):
        np.testing.assert_array_equal(getattr(model, name), getattr(fam.model, name))
    params = json.loads((out / "params.json").read_text())
    assert params["files"]["potts"] == "params/{family}.safetensors" and params["families"][1]["triplets"] == 2
    assert main(["synth", "--out", str(out), "--families", "1", "--length", "32", "--sequences", "50"]) == 0
    assert sorted(p.name for p in (out / "params").iterdir()) == ["synth000.safetensors"]  # no stale family
    assert read_potts(out / "params" / "synth000.safetensors").triplets.shape == (0, 3)

    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"not a safetensors file")
    with pytest.raises(InputError, match="bad.safetensors: unreadable Potts parameters"):
        read_potts(bad)
    from safetensors.numpy import save_file

    save_file({"fields": np.zeros((4, 20))}, str(bad), metadata={"format": "pmlm-potts/1"})
    with pytest.raises(InputError, match="missing tensor"):
        read_potts(bad)
    tensors = {name: np.ascontiguousarray(getattr(model, name)) for name in TENSORS}
    tensors["edges"] = tensors["edges"][:, ::-1].copy()  # j < i
    save_file(tensors, str(bad), metadata={"format": "pmlm-potts/1", "residues": RESIDUES})
    with pytest.raises(InputError, match="edges need increasing positions"):
        read_potts(bad)
    with pytest.raises(InputError, match="no such file"):
        read_potts(tmp_path / "missing.safetensors")
