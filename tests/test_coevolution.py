"""Planted-coupling study: read-out mechanics (masking protocol, attention replay, chain rule), the
supervised contact head and the paired test, equal averaging across read-outs, the held-out split, the
per-seed CLI and report, and a CI-sized run in which PMLM's pair head must rank the planted couplings
of a synthetic family far above chance and every supervised head scores held-out families."""

from __future__ import annotations

import functools
import json
import math
import operator
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from pmlm import alphabet
from pmlm.cli import main
from pmlm.coevolution.exact_report import exact_rows
from pmlm.coevolution.heldout import FamilyData, StudyConfig, load_families
from pmlm.coevolution.readouts import (
    CHAIN_ROWS,
    attention_probabilities,
    chain_rule_dependence,
    dependence_map,
    pair_head_dependence,
    precisions,
    sequence_tokens,
)
from pmlm.coevolution.report import load_results, paired_test, supervised_rows, table_rows
from pmlm.coevolution.study import evaluate_models, readout_costs
from pmlm.coevolution.supervised import family_folds, family_precision, fit_contact_head, fold_heads
from pmlm.data.split import seeded_draw
from pmlm.errors import ConfigError, InputError
from pmlm.evaluation.pair_readout import all_pairs
from pmlm.model.config import model_config
from pmlm.model.objectives import ObjectiveConfig
from pmlm.pretrained import build_model

RECIPE = Path(__file__).resolve().parents[1] / "config" / "train" / "coevolution_tiny.yaml"


def _model(objective: str, seed: int = 0, **layers):
    torch.manual_seed(seed)
    # the study's encoder: the layers its recipe pins, unless ``layers`` are given (post-LN, an embedding norm)
    layers = layers or yaml.safe_load(RECIPE.read_text())["model"]["overrides"]
    return build_model(model_config("tiny", objective, **layers), ObjectiveConfig(name=objective)).eval()


class Recorder(torch.nn.Module):
    """Wraps a model and keeps every batch of inputs it is called with."""

    def __init__(self, model):
        super().__init__()
        self.model = model
        self.token_head, self.pair_head = model.token_head, model.pair_head
        self.calls = []

    def forward(self, tokens, **kwargs):
        self.calls.append(tokens.clone())
        return self.model(tokens, **kwargs)


@pytest.fixture
def sequence():
    return np.random.default_rng(0).integers(0, alphabet.NUM_RESIDUES, size=12).astype(np.uint8)


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
    model = _model("pmlm", **layers)
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


def test_pair_head_readout_masks_exactly_the_pair(sequence):
    model = Recorder(_model("pmlm"))
    pairs = all_pairs(len(sequence))
    with torch.no_grad():
        out = pair_head_dependence(model, sequence, pairs, batch_pairs=7)
    assert out["kl"].shape == out["mi"].shape == (len(pairs),)
    assert np.all(out["mi"] >= -1e-6) and np.all(out["kl"] >= -1e-6)
    rows = torch.cat(model.calls)
    expected = sequence_tokens(sequence[None])[0]
    for row, (i, j) in zip(rows, pairs):
        assert (row == alphabet.MASK_ID).nonzero().flatten().tolist() == [i + 1, j + 1]
        restored = row.clone()
        restored[[i + 1, j + 1]] = expected[[i + 1, j + 1]]
        assert torch.equal(restored, expected)


def test_chain_rule_inputs_and_an_independent_model(sequence):
    """41 rows per pair: both masked, then x_i = a with j masked, then x_j = b with i masked."""
    model = Recorder(_model("mlm"))
    pairs = np.array([[0, 5], [3, 11]])
    with torch.no_grad():
        out = chain_rule_dependence(model, sequence, pairs, batch_rows=CHAIN_ROWS)  # one pair per forward
    assert out["kl"].shape == (2,) and np.all(out["kl"] >= -1e-6) and np.all(np.isfinite(out["mi"]))
    assert len(model.calls) == 2
    for rows, (i, j) in zip(model.calls, pairs):
        pi, pj = i + 1, j + 1
        assert rows.shape[0] == CHAIN_ROWS
        assert rows[0, pi] == rows[0, pj] == alphabet.MASK_ID
        letters = torch.arange(20) + alphabet.FIRST_RESIDUE_ID
        assert torch.equal(rows[1:21, pi], letters) and bool((rows[1:21, pj] == alphabet.MASK_ID).all())
        assert torch.equal(rows[21:, pj], letters) and bool((rows[21:, pi] == alphabet.MASK_ID).all())
        assert int((rows == alphabet.MASK_ID).sum()) == 2 + 2 * 20  # nothing else is hidden

    class Independent(torch.nn.Module):
        """A token head whose predictions ignore the context: its chain-rule joint is a product."""

        token_head, pair_head = True, None

        def forward(self, tokens, token_positions=None):
            logits = torch.linspace(-1, 1, 20).repeat(int(token_positions.sum()), 1)
            return {"logits": logits}

    out = chain_rule_dependence(Independent(), sequence, pairs, batch_rows=100)
    np.testing.assert_allclose(out["kl"], 0.0, atol=1e-6)
    np.testing.assert_allclose(out["mi"], 0.0, atol=1e-6)


def test_precisions_on_a_hand_made_map():
    length = 20
    contacts = np.zeros((length, length), dtype=bool)
    edges = [(0, 10), (2, 15), (5, 19), (1, 8)]
    for i, j in edges:
        contacts[i, j] = contacts[j, i] = True
    scores = np.zeros((length, length))
    for rank, (i, j) in enumerate([(0, 10), (2, 15), (3, 12), (5, 19)]):  # 3 of the top 4 are planted
        scores[i, j] = scores[j, i] = 10 - rank
    scores[4, 6] = scores[6, 4] = 100.0  # |i-j| < 6: never counted
    out = precisions(scores, contacts, min_separation=6, k_divisor=5)
    assert out["p_at_edges"] == pytest.approx(3 / 4)
    assert out["p_at_l5"] == pytest.approx(3 / 4)  # floor(20 / 5) = 4 pairs
    pairs_far = sum(1 for i in range(length) for j in range(i + 6, length))
    assert out["chance"] == pytest.approx(4 / pairs_far)
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


def test_contact_head_learns_a_signature_and_scores_unseen_families():
    """A head fitted on two families' planted maps ranks a third family's edges first; the encoder is frozen."""
    fams = [_family(f"f{k}", first=k, seed=k) for k in range(3)]
    encoder = PlantedEncoder({k: f.contacts for k, f in enumerate(fams)})
    cfg = StudyConfig(sequences=2, head_steps=100, head_lr=0.05)
    model = fit_contact_head(encoder, "M", fams[:2], cfg, seed=0)
    assert float(encoder.unused.abs().sum()) == 0.0 and not encoder.unused.requires_grad
    scores, ids = family_precision(model, fams[2], cfg)
    assert ids == ["f2_0", "f2_1"]  # the first `sequences` held-out sequences
    assert scores["p_at_edges"] > 0.8 > 2 * scores["chance"]
    untrained = fit_contact_head(encoder, "M", fams[:2], StudyConfig(sequences=2, head_steps=1, head_lr=1e-6), 0)
    assert family_precision(untrained, fams[2], cfg)[0]["p_at_edges"] < scores["p_at_edges"]
    assert family_folds(["c", "a", "b", "d"], seed=1) == family_folds(["a", "b", "c", "d"], seed=1)
    assert sorted(functools.reduce(operator.iadd, family_folds(["a", "b", "c"], seed=0), [])) == ["a", "b", "c"]
    assert family_folds(["a"], seed=0) == []


def test_fold_heads_score_each_family_with_heads_fitted_on_the_other_fold():
    """Both runs of the study (per seed and the curves) fit their supervised heads here: every family is scored once
    per head, by a head fitted on the other fold only; one family gives no folds."""
    fams = [_family(f"f{k}", first=k, seed=k) for k in range(4)]
    encoder = PlantedEncoder({k: f.contacts for k, f in enumerate(fams)})
    heads = (("supervised_m", "a", "M"), ("supervised_m", "b", "M"))
    cfg = StudyConfig(sequences=2, head_steps=1)
    folds = family_folds([f.name for f in fams], seed=3)
    scored = []
    for readout, name, head, score_on in fold_heads({"a": encoder, "b": encoder}, fams, cfg, 3, heads):
        assert readout == "supervised_m" and head.encoder is encoder
        assert [f.name for f in score_on] in folds
        scored += [(name, f.name) for f in score_on]
    assert sorted(scored) == sorted((name, f.name) for name in "ab" for f in fams)
    assert list(fold_heads({"a": encoder}, fams[:1], cfg, 3, heads[:1])) == []


def test_every_readout_averages_over_the_same_heldout_sequences():
    """Each read-out, supervised heads included, reports the ids it averaged over: the same first
    `sequences` held-out ids of each family, for every read-out and model."""
    fams = [_family(f"f{k}", first=k, length=12, rows=5, seed=k) for k in range(2)]
    models = {"mlm": _model("mlm"), "pmlm": _model("pmlm")}
    cfg = StudyConfig(sequences=3, chain_rule=1, head_steps=2)
    result = evaluate_models(fams, models, cfg)
    expected = {
        "pair_head_mi_apc",
        "pair_head_kl_apc",
        "chain_rule_mi_apc",
        "attention_apc",
        "supervised_m",
        "supervised_mplus",
    }
    for fam in fams:
        used = result["sequences"][fam.name]
        assert set(used) == expected
        assert all(ids == fam.heldout_ids[:3] for ids in used.values()), used
        row = result["per_family"][fam.name]
        assert set(row["supervised_m"]) == {"mlm", "pmlm"} and set(row["supervised_mplus"]) == {"pmlm"}
    costs = readout_costs(12)
    assert costs["chain_rule_mi_apc"]["forwards_per_pair"] == CHAIN_ROWS
    assert costs["pair_head_mi_apc"]["forwards_per_pair"] == 1 and costs["attention_apc"]["forwards_per_sequence"] == 1


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


# ------------------------------------------------------------------------------------------------
# Split and inputs


def _synth(out: Path, families: int, sequences: int, seed: int, length: int = 32) -> Path:
    assert (
        main(
            [
                "synth",
                "--out",
                str(out),
                "--families",
                str(families),
                "--length",
                str(length),
                "--sequences",
                str(sequences),
                "--seed",
                str(seed),
            ]
        )
        == 0
    )
    return out


def test_split_is_per_sequence_deterministic_and_complete(tmp_path):
    synth = _synth(tmp_path / "synth", families=2, sequences=200, seed=3)
    a = [tmp_path / "a_train.fasta", tmp_path / "a_valid.fasta"]
    b = [tmp_path / "b_train.fasta", tmp_path / "b_valid.fasta"]
    for train, valid in (a, b):
        assert (
            main(
                [
                    "coevolution",
                    "split",
                    "--synth",
                    str(synth),
                    "--train",
                    str(train),
                    "--valid",
                    str(valid),
                    "--valid-fraction",
                    "0.2",
                ]
            )
            == 0
        )
    assert a[0].read_text() == b[0].read_text() and a[1].read_text() == b[1].read_text()
    headers = {
        side: [line for line in path.read_text().splitlines() if line.startswith(">")]
        for side, path in zip(("train", "valid"), a)
    }
    assert len(headers["train"]) + len(headers["valid"]) == 400
    assert 40 < len(headers["valid"]) < 120
    for line in headers["train"] + headers["valid"]:
        name, cluster, family = line[1:].split()
        assert cluster == family.replace("family=", "cluster=") and name.startswith(family[len("family=") :])
    for line in headers["valid"]:
        assert seeded_draw(line[1:].split()[0], 0) < 0.2
    families = load_families(synth, StudyConfig(valid_fraction=0.2))
    assert [len(f.heldout) for f in families] == [
        sum(h.split()[2] == f"family={f.name}" for h in headers["valid"]) for f in families
    ]
    assert all(f.train.shape[1] == f.length == 32 and f.contacts.sum() == 2 * 32 for f in families)


def test_bad_inputs_name_file_and_line(tmp_path):
    synth = _synth(tmp_path / "synth", families=1, sequences=20, seed=1)
    fasta = synth / "families.fasta"
    lines = fasta.read_text().splitlines()
    lines[2] = lines[2].split()[0]  # second record loses family=
    fasta.write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError, match=r"families.fasta:3: .*family="):
        load_families(synth, StudyConfig())
    lines[2] = ">short family=synth000"
    lines[3] = lines[3][:-1]
    fasta.write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError, match=r"families.fasta:3: .*31 residues"):
        load_families(synth, StudyConfig())
    lines[3] = "X" + lines[3]
    fasta.write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError, match=r"families.fasta:3: .*'X' at residue 1"):
        load_families(synth, StudyConfig())
    with pytest.raises(ConfigError, match="valid_fraction"):
        StudyConfig(valid_fraction=1.0)
    assert main(["coevolution", "--synth", str(synth)]) == 2  # missing --mlm / --pmlm: one line, no traceback


def test_report_aggregates_over_seeds(tmp_path):
    def doc(seed, pair, chain, heads):
        metrics = lambda p: {"p_at_edges": p, "p_at_l5": p, "chance": 0.1}  # noqa: E731
        per_family = {
            f"f{k}": {
                "supervised_m": {"mlm": metrics(heads[0][k]), "pmlm": metrics(heads[1][k])},
                "supervised_mplus": {"pmlm": metrics(heads[2][k])},
            }
            for k in range(2)
        }
        return {
            "seed": seed,
            "families": {"f0": {}, "f1": {}},
            "config": {"sequences": 8},
            "costs": {
                "pair_head_mi_apc": {"forwards_per_sequence": 496.0},
                "chain_rule_mi_apc": {"forwards_per_sequence": 20336.0},
            },
            "pretraining": {"pmlm": {"acc_mlm": 0.5, "acc_pmlm": 0.3, "dacc": 0.05}, "mlm": {"acc_mlm": 0.4}},
            "summary": {
                "pair_head_mi_apc": {"pmlm": metrics(pair)},
                "chain_rule_mi_apc": {"mlm": metrics(chain)},
                "msa_mi_apc": {"msa": metrics(0.9)},
                "supervised_m": {"mlm": metrics(np.mean(heads[0])), "pmlm": metrics(np.mean(heads[1]))},
                "supervised_mplus": {"pmlm": metrics(np.mean(heads[2]))},
            },
            "per_family": per_family,
            "dependence": {
                "pair_head": {"pmlm": {"kl": {"median_planted": 2.0, "median_non_planted": 1.0, "ratio": 2.0}}}
            },
            "dependence_values": {
                "pair_head": {"pmlm": {"kl": {"planted": [1.0, 2.0], "non_planted": [0.5]}}},
                "chain_rule": {"mlm": {"kl": {"planted": [0.1], "non_planted": [0.01]}}},
            },
            "exact": {
                "summary": {
                    "epistasis": {
                        "pmlm": {
                            "score": {"spearman_planted": pair, "mean_abs_planted": 1.0, "exact_mean_abs_planted": 1.5}
                        },
                        "mlm": {
                            "score": {"spearman_planted": 0.0, "mean_abs_planted": 0.0, "exact_mean_abs_planted": 1.5}
                        },
                    },
                    "pair_logloss": {
                        "pmlm": {
                            "joint": {"planted": {"ce": 2.5, "entropy": 2.0, "gap": 0.5}},
                            "product": {"planted": {"ce": 2.7, "entropy": 2.0, "gap": 0.7}},
                        },
                        "mlm": {"product": {"planted": {"ce": 2.6, "entropy": 2.0, "gap": 0.6}}},
                    },
                }
            },
        }

    # heads per family: (MLM M, PMLM M, PMLM M+); PMLM M+ beats MLM on all 6 (seed, family) units,
    # PMLM M on 3 of 6 by as much as it loses on the others
    heads = {
        1: ([0.2, 0.3], [0.3, 0.2], [0.4, 0.5]),
        2: ([0.1, 0.2], [0.2, 0.1], [0.3, 0.3]),
        3: ([0.3, 0.3], [0.4, 0.2], [0.5, 0.4]),
    }
    paths = []
    for seed, pair, chain in ((1, 0.2, 0.5), (2, 0.4, 0.3), (3, 0.6, 0.1)):
        path = tmp_path / f"r{seed}.json"
        path.write_text(json.dumps(doc(seed, pair, chain, heads[seed])))
        paths.append(str(path))
    docs = load_results(paths)
    rows = {r["measure"]: r for r in table_rows(docs)}
    pair_row = rows["top-#edges precision: pair head, MI of the joint + APC"]
    assert pair_row["pmlm_mean"] == pytest.approx(0.4) and pair_row["pmlm_std"] == pytest.approx(0.2)
    assert pair_row["mlm_mean"] is None and pair_row["chance"] == pytest.approx(0.1)
    assert pair_row["forwards_per_sequence"] == 496 and pair_row["sequences"] == 8
    chain_row = rows["top-#edges precision: token head chain rule, MI + APC"]
    assert chain_row["mlm_mean"] == pytest.approx(0.3) and chain_row["pmlm_mean"] is None
    assert chain_row["forwards_per_sequence"] == 20336
    assert rows["dAcc = Acc_pmlm - Acc_mlm^2"]["pmlm_mean"] == pytest.approx(0.05)
    sup = {r["encoder, features"]: r for r in supervised_rows(docs)}
    assert sup["MLM, M"]["p_at_edges_mean"] == pytest.approx(0.7 / 3) and "vs_mlm_p" not in sup["MLM, M"]
    mplus = sup["PMLM, M+"]
    assert mplus["families_scored"] == 6 and mplus["vs_mlm_wins"] == "6/0/6"
    assert mplus["vs_mlm_p"] == pytest.approx(2 / 64) and mplus["vs_mlm_difference"] == pytest.approx(1 / 6)
    assert sup["PMLM, M"]["vs_mlm_difference"] == pytest.approx(0.0, abs=1e-12)
    assert sup["PMLM, M"]["vs_mlm_p"] == pytest.approx(1.0)
    assert main(["coevolution", "report", "--results", *paths, "--out-prefix", str(tmp_path / "t")]) == 0
    for name in (
        "t.csv",
        "t.md",
        "t.tex",
        "t.html",
        "t.png",
        "t.svg",
        "t_supervised.csv",
        "t_supervised.md",
        "t_supervised.tex",
        "t_supervised.html",
        "t_exact.csv",
        "t_exact.md",
        "t_exact.tex",
        "t_exact.html",
    ):
        assert (tmp_path / name).stat().st_size > 0
    exact = {r["measure"]: r for r in exact_rows(docs)}
    rho = exact["epistasis rank correlation, planted pairs (as pmlm score computes it)"]
    assert rho["pmlm_mean"] == pytest.approx(0.4) and rho["mlm_mean"] == 0.0 and rho["tmlm_mean"] is None
    size = exact["mean |epistasis|, planted pairs (as pmlm score)"]
    assert size["exact"] == pytest.approx(1.5) and size["pmlm_mean"] == pytest.approx(1.0)
    # a model's own joint where it has one, the product of its marginals where it has none
    loss = exact["pair log-loss gap to the exact entropy, planted pairs (KL, nats)"]
    assert loss["pmlm_mean"] == pytest.approx(0.5) and loss["mlm_mean"] == pytest.approx(0.6)
    assert "sign-flip" in (tmp_path / "t_supervised.md").read_text()
    with pytest.raises(InputError, match="seed 1 already"):
        load_results([paths[0], paths[0]])
    (tmp_path / "bad.json").write_text("{}")
    assert (
        main(["coevolution", "report", "--results", str(tmp_path / "bad.json"), "--out-prefix", str(tmp_path / "u")])
        == 2
    )
    assert not (tmp_path / "u.csv").exists()


def test_command_flags_are_the_study_config_fields():
    """The argparse layer states no defaults of its own: every flag is a StudyConfig field of the same type."""
    from pmlm.commands.coevolution import STUDY_FLAGS

    fields = StudyConfig.__dataclass_fields__
    assert set(STUDY_FLAGS) == set(fields)
    defaults = StudyConfig()
    assert all(type(getattr(defaults, name)) is kind for name, (kind, _) in STUDY_FLAGS.items())


# ------------------------------------------------------------------------------------------------
# CI-sized study

# Measured on this study (seed 1; 2 families of 32 residues with 32 planted edges each, 1,000 sequences
# per family, the shipped recipe at 2,048 tokens per batch; every read-out over the same held-out
# sequences of each family; chance 0.091 = 32 of 351 pairs with |i-j| >= 6), top-#edges precision of
# the pair head (MI + APC), mean over the 2 families:
#   500 steps, 8 sequences: 0.266    500 steps, 16 sequences: 0.266    800 steps, 16 sequences: 0.281
# i.e. ~9 of 32 edges, about 3x chance: the bar is 2x (6 edges). At 500 steps the median MI of planted
# pairs was still below that of other pairs (0.0195 vs 0.0207); at 800 it was above, hence 800 steps.
# Supervised heads (fitted on one family, scored on the other) were 0.07-0.16 in these runs, near
# chance: checked for completeness, not for a winner.
PAIR_HEAD_OVER_CHANCE = 2.0


def test_ci_study_pair_head_ranks_planted_couplings_above_chance(tmp_path):
    seed, steps = 1, 800
    root = tmp_path
    _synth(root / "synth", families=2, sequences=1000, seed=seed)
    assert (
        main(
            [
                "coevolution",
                "split",
                "--synth",
                str(root / "synth"),
                "--train",
                str(root / "train.fasta"),
                "--valid",
                str(root / "valid.fasta"),
            ]
        )
        == 0
    )
    assert (
        main(
            [
                "tokenize",
                "--input",
                f"train={root / 'train.fasta'}",
                "--input",
                f"valid={root / 'valid.fasta'}",
                "--out-dir",
                str(root / "shards"),
                "--num-shards",
                "2",
                "--row-group-size",
                "32",
            ]
        )
        == 0
    )
    for objective in ("pmlm", "mlm"):
        sets = [
            f"objective.name={objective}",
            f"seed={seed}",
            f"optim.total_steps={steps}",
            f"optim.warmup_steps={steps // 10}",
            "tokens_per_step=2048",
            "save_every=0",
            "eval_batches=10",
        ]
        args = [
            "pretrain",
            "--config",
            str(RECIPE),
            "--shards",
            str(root / "shards"),
            "--out",
            str(root / objective),
            "--final",
            str(root / f"{objective}.safetensors"),
        ]
        for item in sets:
            args += ["--set", item]
        assert main(args) == 0
    assert (
        main(
            [
                "coevolution",
                "--synth",
                str(root / "synth"),
                "--mlm",
                str(root / "mlm.safetensors"),
                "--pmlm",
                str(root / "pmlm.safetensors"),
                "--seed",
                str(seed),
                "--out-prefix",
                str(root / "seed1"),
                "--sequences",
                "16",
                "--chain-rule",
                "0",
                "--head-steps",
                "200",
            ]
        )
        == 0
    )
    result = json.loads((root / "seed1.json").read_text())
    summary = result["summary"]
    pair = summary["pair_head_mi_apc"]["pmlm"]
    chance = pair["chance"]
    heads = {
        f"{r}/{m}": summary[r][m]["p_at_edges"]
        for r, m in (("supervised_m", "mlm"), ("supervised_m", "pmlm"), ("supervised_mplus", "pmlm"))
    }
    print(
        f"CI study: pair head P@#edges {pair['p_at_edges']:.3f} P@L/5 {pair['p_at_l5']:.3f}; "
        f"attention MLM {summary['attention_apc']['mlm']['p_at_edges']:.3f} "
        f"PMLM {summary['attention_apc']['pmlm']['p_at_edges']:.3f}; supervised "
        + ", ".join(f"{k} {v:.3f}" for k, v in heads.items())
        + f"; MSA {summary['msa_mi_apc']['msa']['p_at_edges']:.3f}; chance {chance:.3f}; "
        f"dAcc {result['pretraining']['pmlm']['dacc']:.4f}"
    )
    assert 0 < chance < 0.2
    assert pair["p_at_edges"] >= PAIR_HEAD_OVER_CHANCE * chance
    assert summary["msa_mi_apc"]["msa"]["p_at_edges"] > 0.6  # the couplings are there to be found
    mi = result["dependence"]["pair_head"]["pmlm"]["mi"]
    assert mi["median_planted"] > mi["median_non_planted"]
    # both families scored by every supervised head fitted on the other; one set of sequences throughout
    assert sorted(functools.reduce(operator.iadd, result["folds"], [])) == sorted(result["families"])
    for _family, used in result["sequences"].items():
        assert len({tuple(ids) for ids in used.values()}) == 1 and len(used["pair_head_mi_apc"]) == 16
        assert "supervised_mplus" in used and "chain_rule_mi_apc" not in used
    assert all(0.0 <= v <= 1.0 for v in heads.values())
    assert result["costs"]["chain_rule_mi_apc"]["forwards_per_sequence"] == CHAIN_ROWS * 32 * 31 // 2
    assert (root / "seed1.tsv").read_text().startswith("family\treadout\tmodel\t")
    assert not math.isnan(result["pretraining"]["pmlm"]["dacc"])
