"""Planted-coupling study (``pmlm coevolution curves``): the read-outs' inputs (attention replay, exactly the masked
sites of every joint, the substitution rows and the chain rule), contact precision on a hand-made map, the supervised
contact head on unseen families and its folds, one set of held-out sequences for every read-out, the paired test,
and the held-out split with its input errors. A CI-sized run is tests/test_coevolution_curves.py's."""

from __future__ import annotations

import functools
import math
import operator
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from pmlm import alphabet
from pmlm.cli import main
from pmlm.coevolution import curve_readouts
from pmlm.coevolution.conditionals import (
    chain_rule_joint,
    sequence_outputs,
    substitution_epistasis,
    substitution_log_conditionals,
)
from pmlm.coevolution.curve_readouts import (
    NO_TRIPLES,
    FamilyTargets,
    contact_records,
    encoder_records,
    family_targets,
    supervised_records,
)
from pmlm.coevolution.curve_report import paired_test
from pmlm.coevolution.curves_config import CurveEvaluation
from pmlm.coevolution.heldout import FamilyData, SplitConfig, load_families, split_records
from pmlm.coevolution.readouts import attention_probabilities, dependence_map, residue_ids, sequence_tokens
from pmlm.coevolution.supervised import family_folds, family_scores, fit_contact_head, fold_heads
from pmlm.data.split import seeded_draw
from pmlm.errors import ConfigError, InputError
from pmlm.evaluation.pair_readout import all_pairs, joint_dependence, pair_dependence
from pmlm.evaluation.unsupervised import mutual_information
from pmlm.model.config import model_config
from pmlm.model.objectives import ObjectiveConfig
from pmlm.pretrained import build_model
from pmlm.synth.potts import PottsConfig, family_rng, generate_family
from pmlm.synth.synthesize import FASTA_NAME
from pmlm.vocabulary import MLM, PMLM, TMLM

RECIPE = Path(__file__).resolve().parents[1] / "config" / "train" / "coevolution_tiny.yaml"
Q = alphabet.NUM_RESIDUES


def _model(objective: str, seed: int = 0, **layers):
    torch.manual_seed(seed)
    # the study's encoder: the layers its recipe pins, unless ``layers`` are given (post-LN, an embedding norm)
    layers = layers or yaml.safe_load(RECIPE.read_text())["model"]["overrides"]
    return build_model(model_config("tiny", objective, **layers), ObjectiveConfig(name=objective)).eval()


class Recorder(torch.nn.Module):
    """Wraps a model and keeps the tokens and index tensors of every forward and every encode."""

    def __init__(self, model):
        super().__init__()
        self.model = model
        self.cfg, self.encoder = model.cfg, model.encoder
        self.token_head, self.pair_head = model.token_head, model.pair_head
        self.triple_head = getattr(model, "triple_head", None)
        self.calls = []

    def forward(self, tokens, **kwargs):
        self.calls.append((tokens.clone(), {k: v.clone() for k, v in kwargs.items() if torch.is_tensor(v)}))
        return self.model(tokens, **kwargs)

    def encode(self, tokens):
        self.calls.append((tokens.clone(), {}))
        return self.model.encode(tokens)


@pytest.fixture
def sequence():
    return np.random.default_rng(0).integers(0, Q, size=12).astype(np.int64)


# ------------------------------------------------------------------------------------------------
# Read-out mechanics


@pytest.mark.parametrize(
    "layers",
    [{}, {"norm": "post", "embedding_norm": True}, {"norm": "post", "embedding_norm": False}],
    ids=["recipe", "post-ln-embedding-norm", "post-ln"],
)
def test_attention_replay_matches_the_encoder(layers):
    """Recomputed probabilities reproduce each layer's attention output, and the final states match encode(), for
    the study's pre-LN layers and the post-LN encoders of the workflow's other runs (the demo's: no final norm)."""
    model = _model(PMLM, **layers)
    tokens = sequence_tokens(np.random.default_rng(1).integers(0, 20, size=(3, 10)))
    tokens[2, 6:] = alphabet.PAD_ID  # a padded row exercises the key-padding mask
    probs, final = attention_probabilities(model, tokens)
    assert probs.shape == (3, model.cfg.num_layers, model.cfg.heads, 12, 12)
    torch.testing.assert_close(probs.sum(-1), torch.ones(3, model.cfg.num_layers, model.cfg.heads, 12))
    assert float(probs[2, ..., 6:].abs().max()) == 0.0  # nothing attends to <pad>
    torch.testing.assert_close(final, model.encode(tokens))
    # each layer's attention = probs @ V, projected: the same numbers SDPA produced inside the model
    enc = model.encoder
    x = enc.embed(tokens) + enc.positions[: tokens.shape[1]]
    x = x if enc.embed_norm is None else enc.embed_norm(x)
    keep = tokens.ne(alphabet.PAD_ID)
    keep[:, 0] = True
    mask = keep[:, None, None, :]
    for layer_index, layer in enumerate(enc.layers):
        h = x if layer.post_norm else layer.attn_norm(x)
        B, T, C = h.shape
        v = layer.attn.qkv(h).view(B, T, 3, layer.attn.heads, C // layer.attn.heads)[:, :, 2].transpose(1, 2)
        mine = layer.attn.proj((probs[:, layer_index] @ v).transpose(1, 2).reshape(B, T, C))
        torch.testing.assert_close(mine, layer.attn(h, mask), atol=1e-5, rtol=1e-5)
        x = layer(x, mask)


def test_every_joint_row_masks_exactly_its_sites(sequence):
    """sequence_outputs (the study's singles, pair and triple joints): one row per site, pair and triple with exactly
    those sites masked and the rest the sequence, each head read at those sites; the pair head's dependence from it is
    what ``pmlm contacts`` reads (pair_dependence)."""
    model = Recorder(_model(TMLM))
    pairs = all_pairs(len(sequence))
    triples = np.array([[0, 4, 9], [2, 3, 11]])
    out = sequence_outputs(model, sequence, pairs, triples, batch_rows=7)
    assert out.singles.shape == (12, Q) and out.pair_joint.shape == (len(pairs), Q, Q)
    assert out.pair_marginals.shape == (len(pairs), 2, Q) and out.triple_joint.shape == (2, Q, Q, Q)
    for joint, axes in ((out.pair_joint, (1, 2)), (out.triple_joint, (1, 2, 3)), (out.pair_marginals, (2,))):
        np.testing.assert_allclose(np.exp(joint).sum(axis=axes), 1.0, atol=1e-5)
    expected = sequence_tokens(sequence[None])[0]
    rows = [(tokens[b], kwargs, b) for tokens, kwargs in model.calls for b in range(len(tokens))]
    site_sets = [[s] for s in range(12)] + pairs.tolist() + triples.tolist()
    assert len(rows) == len(site_sets)
    for (row, kwargs, b), sites in zip(rows, site_sets):
        pos = [s + 1 for s in sites]
        assert (row == alphabet.MASK_ID).nonzero().flatten().tolist() == pos
        restored = row.clone()
        restored[pos] = expected[pos]
        assert torch.equal(restored, expected)
        assert kwargs["token_positions"][b].nonzero().flatten().tolist() == pos
        for k, name in ((2, "pair_index"), (3, "triple_index")):
            if len(sites) == k:
                index = kwargs[name]
                assert index[index[:, 0] == b, 1:].tolist() == [pos]
            else:
                assert name not in kwargs
    reference = pair_dependence(model.model, residue_ids(sequence), pairs)
    mine = joint_dependence(
        torch.from_numpy(np.exp(out.pair_joint)), *torch.from_numpy(np.exp(out.pair_marginals)).unbind(1)
    )
    for key in ("kl", "mi"):
        torch.testing.assert_close(mine[key].float(), reference[key], atol=1e-5, rtol=1e-4)


def test_substitution_rows_and_the_chain_rule_of_a_context_free_head(sequence):
    """40 rows per pair: i masked with x_j set to each residue, then j masked with x_i set to each, nothing else
    changed. A token head that ignores the context (its logits depend on the site only) has zero epistasis, and its
    chain-rule joint is the product of its two marginals, (i, j) in that order."""
    model = Recorder(_model(MLM))
    pairs = np.array([[0, 5], [3, 11]])
    cond = substitution_log_conditionals(model, sequence, pairs, batch_rows=2 * Q)  # one pair per forward
    assert cond.shape == (2, 2, Q, Q) and len(model.calls) == 2
    np.testing.assert_allclose(np.exp(cond).sum(-1), 1.0, atol=1e-5)
    expected = sequence_tokens(sequence[None])[0]
    letters = torch.arange(Q) + alphabet.FIRST_RESIDUE_ID
    for (rows, kwargs), (i, j) in zip(model.calls, pairs):
        pi, pj = i + 1, j + 1
        assert rows.shape[0] == 2 * Q
        assert bool((rows[:Q, pi] == alphabet.MASK_ID).all()) and torch.equal(rows[:Q, pj], letters)
        assert bool((rows[Q:, pj] == alphabet.MASK_ID).all()) and torch.equal(rows[Q:, pi], letters)
        rest = torch.ones(rows.shape[1], dtype=torch.bool)
        rest[[pi, pj]] = False
        assert torch.equal(rows[:, rest], expected[rest].expand(2 * Q, -1))
        read = kwargs["token_positions"].nonzero()
        assert read[:, 0].tolist() == list(range(2 * Q)) and read[:, 1].tolist() == [pi] * Q + [pj] * Q

    site_logits = torch.from_numpy(np.random.default_rng(2).normal(size=(len(sequence) + 2, Q))).float()

    class ContextFree(torch.nn.Module):
        token_head, pair_head = True, None

        def forward(self, tokens, token_positions=None, **_):
            return {"logits": site_logits[token_positions.nonzero()[:, 1]]}

    cond = substitution_log_conditionals(ContextFree(), sequence, pairs)
    marginals = sequence_outputs(ContextFree(), sequence, pairs, NO_TRIPLES).pair_marginals
    np.testing.assert_allclose(substitution_epistasis(cond, sequence, pairs), 0.0, atol=1e-6)
    p = torch.softmax(site_logits.double(), dim=-1).numpy()
    product = p[pairs[:, 0] + 1, :, None] * p[pairs[:, 1] + 1, None, :]  # (P, 20, 20) [a, b]
    joint = np.exp(chain_rule_joint(cond, marginals))
    np.testing.assert_allclose(joint, product, atol=1e-6)
    np.testing.assert_allclose(mutual_information(joint), 0.0, atol=1e-6)


def _targets(family: FamilyData, ev: CurveEvaluation) -> FamilyTargets:
    """Targets for the contact read-outs alone (no Potts model: no exact values)."""
    rows, ids = family.evaluation_rows(ev)
    none = np.zeros(0)
    return FamilyTargets(family, "g", rows.astype(np.int64), ids, np.zeros((0, 2), int), {}, none, none, none)


def test_contact_records_on_a_hand_made_map():
    length = 20
    contacts = np.zeros((length, length), dtype=bool)
    for i, j in [(0, 10), (2, 15), (5, 19), (1, 8)]:  # two of them |i-j| >= 12, the long range here
        contacts[i, j] = contacts[j, i] = True
    scores = np.zeros((length, length))
    for rank, (i, j) in enumerate([(0, 10), (2, 15), (3, 12), (5, 19), (0, 18)]):  # 3 of the top 4 are planted
        scores[i, j] = scores[j, i] = 10 - rank
    scores[4, 6] = scores[6, 4] = 100.0  # |i-j| < 6: never counted
    rows = np.zeros((1, length), dtype=np.uint8)
    family = FamilyData("f", rows, rows, contacts, ["f_0"])
    ev = CurveEvaluation(min_separation=6, long_separation=12, k_divisor=5)
    out = {metric: value for _, metric, value in contact_records("r", scores, _targets(family, ev), ev)}
    assert out["p_edges"] == pytest.approx(3 / 4)  # top 4 of |i-j| >= 6
    assert out["p_l5"] == pytest.approx(3 / 4)  # floor(20 / 5) = 4 pairs
    assert out["p_edges_long"] == pytest.approx(1.0)  # top 2 of |i-j| >= 12: (2, 15), (5, 19)
    assert out["p_l5_long"] == pytest.approx(2 / 4)  # then (0, 18) and an unscored pair
    values = dependence_map(np.arange(3.0), np.array([[0, 1], [0, 2], [1, 2]]), 3)
    np.testing.assert_array_equal(values, values.T)


class PlantedEncoder(torch.nn.Module):
    """An encoder stand-in whose outputs carry a family's contacts: the two residues of a planted edge
    share one random vector, every other residue has its own, so h_i . h_j is large exactly at the
    edges, the same signature in every family (what a head must find to generalise)."""

    def __init__(self, families: dict[int, np.ndarray], hidden: int = 16):
        super().__init__()
        self.cfg = type("Cfg", (), {"hidden": hidden})()
        self.pair_head = None
        self.unused = torch.nn.Parameter(torch.zeros(1))  # must stay untouched by the head's fit
        self.reps = {}
        for key, contacts in families.items():
            r = np.random.default_rng(key)
            reps = r.normal(size=(len(contacts), hidden)) / math.sqrt(hidden)
            for i, j in zip(*np.nonzero(np.triu(contacts))):
                reps[i] = reps[j] = 3 * r.normal(size=hidden) / math.sqrt(hidden)
            self.reps[key] = torch.from_numpy(reps).float()

    def encode(self, tokens):
        key = int(tokens[0, 1]) - alphabet.FIRST_RESIDUE_ID  # each family's sequences start with their own residue
        out = self.reps[key].expand(tokens.shape[0], -1, -1)  # (B, L, C)
        edge = torch.zeros(tokens.shape[0], 1, out.shape[-1])
        return torch.cat([edge, out, edge], dim=1) + 0.01 * tokens[..., None].float()  # (B, L + 2, C)


def _family(name: str, first: int, length: int = 24, rows: int = 4, seed: int = 0) -> FamilyData:
    """A family of ``rows`` held-out sequences starting with residue ``first`` and a planted matching."""
    r = np.random.default_rng(seed)
    contacts = np.zeros((length, length), dtype=bool)
    free = list(r.permutation(length))
    while len(free) >= 2 and contacts.sum() < 16:
        i, j = sorted((free.pop(), free.pop()))
        if j - i >= 6:
            contacts[i, j] = contacts[j, i] = True
    seqs = r.integers(0, 20, size=(rows, length)).astype(np.uint8)
    seqs[:, 0] = first
    return FamilyData(name, seqs, seqs.copy(), contacts, [f"{name}_{k}" for k in range(rows)])


def _mean_precision(model, family: FamilyData, ev: CurveEvaluation) -> tuple[float, list[str]]:
    """Top-#edges precision of a head's scores per evaluation sequence, averaged, and the sequences' ids."""
    scores, ids = family_scores(model, family, ev)
    t = _targets(family, ev)
    per_sequence = [{m: v for _, m, v in contact_records("supervised_m", s, t, ev)}["p_edges"] for s in scores]
    return float(np.mean(per_sequence)), ids


def test_contact_head_learns_a_signature_and_scores_unseen_families():
    """A head fitted on two families' planted maps ranks a third family's edges first; the encoder is frozen."""
    fams = [_family(f"f{k}", first=k, seed=k) for k in range(3)]
    encoder = PlantedEncoder({k: f.contacts for k, f in enumerate(fams)})
    ev = CurveEvaluation(sequences=2, head_steps=100, head_lr=0.05, long_separation=12)
    model = fit_contact_head(encoder, "M", fams[:2], ev, seed=0)
    assert float(encoder.unused.abs().sum()) == 0.0 and not encoder.unused.requires_grad
    precision, ids = _mean_precision(model, fams[2], ev)
    assert ids == ["f2_0", "f2_1"]  # the first `sequences` held-out sequences
    chance = float(np.triu(fams[2].contacts, 6).sum()) / len(np.triu_indices(24, 6)[0])
    assert precision > 0.8 > 2 * chance
    untrained = fit_contact_head(encoder, "M", fams[:2], CurveEvaluation(sequences=2, head_steps=1, head_lr=1e-6), 0)
    assert _mean_precision(untrained, fams[2], ev)[0] < precision
    assert family_folds(["c", "a", "b", "d"], seed=1) == family_folds(["a", "b", "c", "d"], seed=1)
    assert sorted(functools.reduce(operator.iadd, family_folds(["a", "b", "c"], seed=0), [])) == ["a", "b", "c"]
    assert family_folds(["a"], seed=0) == []


def test_fold_heads_score_each_family_with_heads_fitted_on_the_other_fold():
    """The supervised heads are fitted here: every family is scored once per head, by a head fitted on the other
    fold only; one family gives no folds."""
    fams = [_family(f"f{k}", first=k, seed=k) for k in range(4)]
    encoder = PlantedEncoder({k: f.contacts for k, f in enumerate(fams)})
    heads = (("supervised_m", "a", "M"), ("supervised_m", "b", "M"))
    ev = CurveEvaluation(sequences=2, head_steps=1)
    folds = family_folds([f.name for f in fams], seed=3)
    scored = []
    for readout, name, head, score_on in fold_heads({"a": encoder, "b": encoder}, fams, ev, 3, heads):
        assert readout == "supervised_m" and head.encoder is encoder
        assert [f.name for f in score_on] in folds
        scored += [(name, f.name) for f in score_on]
    assert sorted(scored) == sorted((name, f.name) for name in "ab" for f in fams)
    assert list(fold_heads({"a": encoder}, fams[:1], ev, 3, heads[:1])) == []


def test_every_readout_reads_the_same_heldout_sequences(monkeypatch):
    """family_targets keeps the first `evaluate.sequences` held-out rows and ids of each family; every forward of
    every zero-shot read-out is one of those rows with at most three sites masked or set (attention: the rows
    themselves), each of them read; the supervised heads are fitted and scored on exactly those rows."""
    ev = CurveEvaluation(sequences=3, long_separation=12, head_steps=2, batch_rows=256)
    length = 20
    families = []
    for k in range(2):
        sampled = generate_family(
            f"f{k}", PottsConfig(length=length, num_sequences=4, chains=4, burn_in=2), family_rng(k, 0)
        )
        heldout = np.random.default_rng(k).integers(0, Q, size=(5, length)).astype(np.uint8)  # 5 far-apart rows
        ids = [f"f{k}_{n}" for n in range(5)]
        potts = sampled.model
        families.append(FamilyData(f"f{k}", sampled.sequences, heldout, potts.contact_map(), ids, potts))
    targets = [family_targets(f, "g", ev, seed=0) for f in families]
    for t, f in zip(targets, families):
        assert t.ids == f.heldout_ids[:3] and np.array_equal(t.rows, f.heldout[:3])
    attention_rows, attention_scores = [], curve_readouts.attention_contact_scores

    def attention(model, rows, batch):
        attention_rows.append(rows.copy())
        return attention_scores(model, rows, batch)

    monkeypatch.setattr(curve_readouts, "attention_contact_scores", attention)
    for objective in (MLM, PMLM):
        model = Recorder(_model(objective))
        for t in targets:
            model.calls.clear()
            records = encoder_records(model, t, ev)
            assert {r for r, _, _ in records} >= {"attention_apc", "jacobian", "substitution"}
            evaluation = sequence_tokens(t.rows)  # (3, L + 2)
            read = set()
            for tokens, _ in model.calls:
                changed = (tokens[:, None, :] != evaluation[None]).sum(-1)  # (B, 3) sites changed from each row
                nearest = changed.min(dim=1)
                assert int(nearest.values.max()) <= 3
                read |= set(nearest.indices.tolist())
            assert read == {0, 1, 2}
            assert len(attention_rows) == 1 and np.array_equal(attention_rows.pop(), t.rows)
        model.calls.clear()
        supervised = supervised_records(model, targets, ev, seed=0)
        expected = {"supervised_m"} | ({"supervised_mplus"} if objective == PMLM else set())
        assert all({r for r, _, _ in supervised[t.family.name]} == expected for t in targets)
        every = torch.cat([sequence_tokens(t.rows) for t in targets])
        for tokens, _ in model.calls:
            assert len(tokens) == 3 and any(torch.equal(tokens, every[k : k + 3]) for k in (0, 3))
        assert len(model.calls) >= 2 * len(expected)  # each head's fit and score
    for f in families:
        assert family_scores(fit_contact_head(_model(MLM), "M", [f], ev, 0), f, ev)[1] == f.heldout_ids[:3]


def test_paired_test_exact_and_sampled():
    a, b = np.array([0.5, 0.6, 0.7, 0.4, 0.9]), np.array([0.4, 0.5, 0.5, 0.3, 0.6])
    out = paired_test(a, b)
    assert out["p"] == pytest.approx(2 / 32)  # only all-positive and all-negative are as extreme
    d = a - b
    assert out["t"] == pytest.approx(d.mean() / (d.std(ddof=1) / math.sqrt(5)))
    assert out["wins"] == 5 and out["losses"] == 0 and out["pairs"] == 5
    assert paired_test(a, a)["p"] == pytest.approx(1.0) and paired_test(a, a)["t"] is None
    mixed = paired_test(np.array([1.0, 0.0, 1.0, 0.0]), np.array([0.0, 1.0, 0.0, 1.0]))
    assert mixed["p"] == pytest.approx(1.0) and mixed["mean_difference"] == 0.0
    many = paired_test(np.ones(30), np.zeros(30))
    assert many["p"] < 1e-3 and "random" in many["p_method"]
    assert paired_test(np.array([]), np.array([]))["p"] is None


# ------------------------------------------------------------------------------------------------
# Split and inputs


def _synth(out: Path, families: int, sequences: int, seed: int, length: int = 32) -> Path:
    args = ["synth", "--out", str(out), "--families", str(families), "--length", str(length)]
    assert main([*args, "--sequences", str(sequences), "--seed", str(seed)]) == 0
    return out


def test_split_is_per_sequence_deterministic_and_complete(tmp_path):
    synth = _synth(tmp_path / "synth", families=2, sequences=200, seed=3)
    fasta = synth / FASTA_NAME
    cfg = SplitConfig(valid_fraction=0.2)
    records = list(split_records(fasta, cfg))
    assert records == list(split_records(fasta, cfg))
    held = {seq_id: h for seq_id, _, _, _, h in records}
    assert len(held) == 400 and 40 < sum(held.values()) < 120
    assert all(h == (seeded_draw(seq_id, 0) < 0.2) for seq_id, h in held.items())
    # per sequence: the records in another order are held out alike; another split seed holds out others
    lines = fasta.read_text().splitlines()
    shuffled = tmp_path / "shuffled.fasta"
    shuffled.write_text("".join(f"{h}\n{s}\n" for h, s in reversed(list(zip(lines[::2], lines[1::2])))))
    assert {r[0]: r[4] for r in split_records(shuffled, cfg)} == held
    assert {r[0]: r[4] for r in split_records(fasta, SplitConfig(valid_fraction=0.2, split_seed=1))} != held
    families = load_families(synth, cfg)
    assert [f.name for f in families] == sorted({family for _, family, *_ in records})
    for f in families:
        mine = [(seq_id, seq, h) for seq_id, family, seq, _, h in records if family == f.name]
        assert f.heldout_ids == [seq_id for seq_id, _, h in mine if h]  # file order
        assert ["".join(alphabet.RESIDUES[c] for c in row) for row in f.heldout] == [s for _, s, h in mine if h]
        assert len(f.train) + len(f.heldout) == len(mine) == 200
        assert f.train.shape[1] == f.length == 32 and f.contacts.sum() == 2 * 32 and f.potts.length == 32
        assert f.evaluation_rows(CurveEvaluation(sequences=3))[1] == f.heldout_ids[:3]


def test_bad_inputs_name_file_and_line(tmp_path):
    synth = _synth(tmp_path / "synth", families=1, sequences=20, seed=1)
    fasta = synth / FASTA_NAME
    lines = fasta.read_text().splitlines()
    lines[2] = lines[2].split()[0]  # second record loses family=
    fasta.write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError, match=r"families.fasta:3: .*family="):
        load_families(synth, SplitConfig())
    lines[2] = ">short family=synth000"
    lines[3] = lines[3][:-1]
    fasta.write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError, match=r"families.fasta:3: .*31 residues"):
        load_families(synth, SplitConfig())
    lines[3] = "X" + lines[3]
    fasta.write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError, match=r"families.fasta:3: .*'X' at residue 1"):
        load_families(synth, SplitConfig())
    with pytest.raises(ConfigError, match="valid_fraction"):
        SplitConfig(valid_fraction=1.0)
    small = _synth(tmp_path / "small", families=1, sequences=20, seed=1)
    with pytest.raises(ConfigError, match="no held-out sequences at valid_fraction 0.001"):
        load_families(small, SplitConfig(valid_fraction=0.001))
