"""Synthetic Potts families: determinism, sampler correctness, recoverable couplings, CLI outputs."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest

from pmlm.alphabet import FIRST_RESIDUE_ID, NUM_RESIDUES, RESIDUES, encode
from pmlm.cli import main
from pmlm.errors import ConfigError, InputError
from pmlm.evaluation.metrics import chance_precision, top_k_precision
from pmlm.evaluation.unsupervised import msa_mi_apc, msa_mutual_information, mutual_information
from pmlm.outputs import MANIFEST
from pmlm.synth.gibbs import gibbs_sample
from pmlm.synth.potts import (
    PottsConfig,
    PottsModel,
    family_rng,
    generate_family,
    plant_edges,
    read_contacts,
)

SMALL = {"length": 32, "num_sequences": 256, "chains": 16, "burn_in": 20, "thinning": 2}


@pytest.fixture(scope="module")
def family():
    """One default-strength family, L = 64, 2000 sequences (about a second)."""
    return generate_family("fam", PottsConfig(length=64, num_sequences=2000), family_rng(0, 0))


def read_fasta(path: Path) -> list[tuple[str, str]]:
    lines = path.read_text().splitlines()
    assert len(lines) % 2 == 0
    return [(lines[k][1:], lines[k + 1]) for k in range(0, len(lines), 2)]


# ------------------------------------------------------------------------------------------ model


def test_same_seed_same_family_other_seed_differs():
    cfg = PottsConfig(**SMALL)
    a = generate_family("a", cfg, family_rng(7, 0))
    b = generate_family("a", cfg, family_rng(7, 0))
    c = generate_family("a", cfg, family_rng(8, 0))
    np.testing.assert_array_equal(a.sequences, b.sequences)
    np.testing.assert_array_equal(a.model.edges, b.model.edges)
    np.testing.assert_array_equal(a.model.couplings, b.model.couplings)
    assert not np.array_equal(a.sequences, c.sequences)


def test_sequences_are_standard_residue_classes(family):
    assert family.sequences.shape == (2000, 64)
    assert family.sequences.dtype == np.uint8
    assert family.sequences.max() < NUM_RESIDUES
    # every residue class shows up somewhere: the background mix keeps all residues possible
    assert len(np.unique(family.sequences)) == NUM_RESIDUES


def test_planted_edges_look_like_contacts():
    cfg = PottsConfig(length=80, edges=100, short_range_fraction=0.2, max_degree=4)
    edges = plant_edges(cfg, np.random.Generator(np.random.PCG64(3)))
    sep = edges[:, 1] - edges[:, 0]
    assert edges.shape == (100, 2)
    assert len({tuple(e) for e in edges.tolist()}) == 100
    assert (sep >= cfg.min_separation).all()
    assert ((sep < cfg.medium_separation).sum()) == 20
    assert np.bincount(edges.ravel(), minlength=80).max() <= cfg.max_degree


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        ({"length": 10}, "length"),
        ({"length": 20, "edges": 41}, "edges"),
        ({"coupling_strength": math.nan}, "coupling_strength"),
        ({"short_range_fraction": 1.5}, "short_range_fraction"),
        ({"thinning": 0}, "thinning"),
    ],
)
def test_invalid_config_is_refused(kwargs, needle):
    with pytest.raises(ConfigError, match=needle):
        PottsConfig(**kwargs)


def test_gibbs_sampler_matches_exact_distribution():
    """Three sites, two strong couplings: 20^3 states are enumerable, so compare with the truth."""
    rng = np.random.Generator(np.random.PCG64(11))
    fields = np.log(rng.dirichlet(np.full(NUM_RESIDUES, 2.0), size=3))  # (3, 20)
    couplings = 0.1 * rng.standard_normal((2, NUM_RESIDUES, NUM_RESIDUES))
    for e in range(2):
        couplings[e, rng.permutation(NUM_RESIDUES)[:6], rng.permutation(NUM_RESIDUES)[:6]] += 2.5
    model = PottsModel(fields=fields, edges=np.array([[0, 1], [1, 2]]), couplings=couplings)

    states = np.array(list(itertools.product(range(NUM_RESIDUES), repeat=3)))  # (8000, 3)
    logw = model.log_weight(states)
    p = np.exp(logw - logw.max())
    p /= p.sum()
    exact_pair = np.zeros((NUM_RESIDUES, NUM_RESIDUES))
    np.add.at(exact_pair, (states[:, 0], states[:, 1]), p)
    exact_site = exact_pair.sum(axis=1)
    exact_coupling = float(p @ couplings[0, states[:, 0], states[:, 1]])
    independent_coupling = float(exact_site @ couplings[0] @ exact_pair.sum(axis=0))
    assert exact_coupling - independent_coupling > 0.3  # the check below can tell couplings apart

    seqs, _ = gibbs_sample(model, 20000, rng, chains=200, burn_in=20, thinning=3)
    emp_pair = column_pair_frequencies(seqs, 0, 1)
    np.testing.assert_allclose(emp_pair.sum(axis=1), exact_site, atol=0.02)
    np.testing.assert_allclose(emp_pair, exact_pair, atol=0.02)
    emp_coupling = float(couplings[0, seqs[:, 0], seqs[:, 1]].mean())
    assert abs(emp_coupling - exact_coupling) < 0.05


def test_thinning_decorrelates_chains(family):
    # consecutive samples of a chain are hardly more alike than samples of different chains
    assert family.stats.identity_consecutive - family.stats.identity_between_chains < 0.02


# ------------------------------------------------------------------------------------ statistics


def column_pair_frequencies(sequences: np.ndarray, i: int, j: int) -> np.ndarray:
    """(20, 20) frequencies of (x_i, x_j) = (a, b) over the sequences, counted one by one."""
    counts = np.zeros((NUM_RESIDUES, NUM_RESIDUES))
    np.add.at(counts, (sequences[:, i], sequences[:, j]), 1)
    return counts / len(sequences)


@pytest.mark.parametrize("block", [5, 32])  # several row blocks; one
def test_msa_mutual_information_is_the_mi_of_counted_column_pairs(family, block):
    """The baseline's documented rule: the MI of each column pair's counted frequencies, mixed with the uniform
    distribution over the 400 states at the pseudocount's weight; diagonal 0."""
    seqs, pseudocount = family.sequences[:300, :12], 0.1
    mi = msa_mutual_information(seqs, pseudocount=pseudocount, block=block)
    expected = np.zeros((12, 12))
    for i, j in itertools.permutations(range(12), 2):
        f = (1 - pseudocount) * column_pair_frequencies(seqs, i, j) + pseudocount / NUM_RESIDUES**2
        expected[i, j] = mutual_information(f)
    np.testing.assert_allclose(mi, expected, rtol=1e-6, atol=1e-12)


def test_coupled_positions_are_not_independent(family):
    # measured mean-MI ratio planted / non-planted (|i-j| >= 6), seeds 0, 1, 2: 5.1, 5.0, 4.3
    contacts = family.model.contact_map()
    mi = msa_mutual_information(family.sequences, pseudocount=0.01)
    i, j = np.triu_indices(64, k=6)
    planted = mi[i, j][contacts[i, j]]
    other = mi[i, j][~contacts[i, j]]
    assert planted.mean() > 3.0 * other.mean()


def test_mi_apc_recovers_planted_contacts(family):
    # measured top-(#edges) precision, seeds 0, 1, 2: 0.92, 0.91, 0.91; chance 0.037
    contacts = family.model.contact_map()
    k = len(family.model.edges)
    precision = top_k_precision(msa_mi_apc(family.sequences), contacts, k)
    chance = chance_precision(contacts)
    assert chance < 0.05
    assert precision > 0.6


# ------------------------------------------------------------------------------------------- CLI


def run_cli(out: Path, *extra: str) -> int:
    return main(["synth", "--out", str(out), "--length", "32", "--sequences", "100", "--chains", "10",
                 "--burn-in", "10", "--thinning", "2", *extra])  # fmt: skip


def test_cli_writes_fasta_contacts_and_params(tmp_path):
    out = tmp_path / "synth"
    assert run_cli(out, "--families", "3", "--seed", "5", "--edges", "20") == 0

    records = read_fasta(out / "families.fasta")
    assert len(records) == 300
    assert records[0][0] == "synth000_0 family=synth000"
    assert records[-1][0] == "synth002_99 family=synth002"
    for _, seq in records:
        assert len(seq) == 32 and set(seq) <= set(RESIDUES)
        ids = encode(seq)
        assert ids.min() >= FIRST_RESIDUE_ID and ids.max() < FIRST_RESIDUE_ID + NUM_RESIDUES

    params = json.loads((out / "params.json").read_text())
    assert params["seed"] == 5
    assert params["config"]["potts"]["edges"] == 20
    assert [f["name"] for f in params["families"]] == ["synth000", "synth001", "synth002"]

    # the files hold exactly what the API generates for family 1 of seed 5
    cfg = PottsConfig(length=32, num_sequences=100, edges=20, chains=10, burn_in=10, thinning=2)
    fam = generate_family("synth001", cfg, family_rng(5, 1))
    edges, strength = read_contacts(out / "contacts" / "synth001.tsv", length=32)
    np.testing.assert_array_equal(edges, fam.model.edges)
    np.testing.assert_allclose(strength, fam.model.coupling_norms(), rtol=1e-5)
    got = [seq for head, seq in records if head.endswith("family=synth001")]
    assert got == ["".join(RESIDUES[c] for c in s) for s in fam.sequences]
    assert [p.name for p in out.parent.iterdir() if p.name.startswith(".")] == []  # no temporaries left
    assert [p.name for p in out.iterdir() if p.name.startswith(".")] == [MANIFEST]  # what it wrote


def test_cli_rerun_is_identical_and_drops_stale_families(tmp_path):
    out = tmp_path / "synth"
    assert run_cli(out, "--families", "3") == 0
    first = (out / "families.fasta").read_bytes(), (out / "params.json").read_bytes()
    assert run_cli(out, "--families", "3") == 0
    assert ((out / "families.fasta").read_bytes(), (out / "params.json").read_bytes()) == first
    assert run_cli(out, "--families", "2") == 0
    assert sorted(p.name for p in (out / "contacts").iterdir()) == ["synth000.tsv", "synth001.tsv"]
    # a family does not depend on how many were requested
    fasta = (out / "families.fasta").read_text()
    assert fasta == first[0].decode().split(">synth002_0")[0]


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--length", "5"], "--length"),
        (["--families", "0"], "--families"),
        (["--edges", "1000"], "--edges"),
        (["--coupling-strength", "nan"], "--coupling-strength"),
        (["--seed", "-1"], "--seed"),
        (["--prefix", "a b"], "--prefix"),
    ],
)
def test_cli_invalid_arguments_exit_2_with_one_line(tmp_path, capsys, args, needle):
    assert run_cli(tmp_path / "out", *args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("pmlm synth: error:") and needle in err[0]
    assert not (tmp_path / "out" / "families.fasta").exists()


def test_cli_out_is_a_file(tmp_path, capsys):
    target = tmp_path / "file"
    target.write_text("x")
    assert run_cli(target) == 2
    assert "--out " + str(target) + ": exists and is a file" in capsys.readouterr().err


def test_cli_malformed_number_exits_2(tmp_path):
    with pytest.raises(SystemExit) as exc:
        run_cli(tmp_path / "out", "--length", "abc")
    assert exc.value.code == 2


def test_read_contacts_names_the_bad_line(tmp_path):
    path = tmp_path / "c.tsv"
    path.write_text("i\tj\tstrength\n0\t7\t1.5\n3\tx\t2.0\n")
    with pytest.raises(InputError, match=r"c\.tsv:3"):
        read_contacts(path)
    path.write_text("i\tj\tstrength\n0\t40\t1.5\n")
    with pytest.raises(InputError, match=r"c\.tsv:2: need 0 <= i < j < 32"):
        read_contacts(path, length=32)
