"""`pmlm import`: released fairseq checkpoints as encoders.

The equivalence tests read tests/data/released/: tiny models of the released code's families, made and run by
fairseq with the released plugin (make_fixture.py there; README.md says how), with what they computed. The
bad-input tests write damaged or foreign checkpoints in the released layout (bench/bench_import.py's writer).
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import math
import os
import pickle
from argparse import Namespace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import RELEASED_FIXTURE as FIXTURE
from conftest import REPO, layer_tolerance, our_tokens, released_provenance
from safetensors.torch import load_file

import pmlm
from pmlm import alphabet
from pmlm.cli import main
from pmlm.errors import InputError
from pmlm.fairseq_checkpoint import import_checkpoint, load_checkpoint
from pmlm.model.config import model_config
from pmlm.model.encoder import fairseq_positions, sinusoidal_positions
from pmlm.pretrained import load_encoder

EPS = torch.finfo(torch.float32).eps


def bench_module():
    spec = importlib.util.spec_from_file_location("bench_import", REPO / "bench" / "bench_import.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TINY = {"layers": 2, "hidden": 16, "ffn": 32, "heads": 2, "positions": 24}


@pytest.fixture
def released_tiny(tmp_path) -> Path:
    """A prot_pmlm_1b-layout checkpoint with tiny dims and random weights."""
    path = tmp_path / "tiny.pt"
    bench_module().write_released_checkpoint(path, TINY)
    return path


def assert_refused(ckpt: Path, out: Path, message: str, capsys) -> None:
    """One line on stderr naming the file, exit 2, and nothing written under ``out``."""
    assert main(["import", str(ckpt), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"pmlm import: error: {ckpt}: "), err
    assert message in err, err
    assert not out.exists() or not any(out.iterdir()), list(out.iterdir())


# -- the positions of the released models ------------------------------------------------------------------


def test_fairseq_positions_are_fairseq_numbering_in_fp32():
    """Token t sits at fairseq position t + padding_idx + 1 = t + 2, sine half then cosine half."""
    dim, n = 10, 50
    table = fairseq_positions(n, dim)
    half = dim // 2
    t = np.arange(n, dtype=np.float64)[:, None] + 2
    freqs = np.exp(-np.arange(half) * math.log(10000.0) / (half - 1))
    want = np.concatenate([np.sin(t * freqs), np.cos(t * freqs)], axis=1)
    # fp32 arithmetic: the angle t * f (t <= 51) carries a relative error of a few eps, so sin / cos of it
    # differ from the float64 values by up to |angle| * few eps
    np.testing.assert_allclose(table.numpy(), want, rtol=0, atol=8 * (n + 2) * EPS)
    assert table.dtype == torch.float32 and table.shape == (n, dim)


def test_default_positions_keep_every_existing_encoder():
    cfg = model_config("tiny")
    assert cfg.positions == "pmlm"
    from pmlm.model.pmlm_model import PMLMModel

    assert torch.equal(PMLMModel(cfg).encoder.positions, sinusoidal_positions(cfg.max_len, cfg.hidden))


# -- what the released layout holds, and what is refused ---------------------------------------------------


def test_released_layout_imports_with_its_provenance(released_tiny, tmp_path):
    weights = import_checkpoint(released_tiny, tmp_path / "enc")
    info = json.loads(weights.with_suffix(".json").read_text())
    assert info["format"] == "pmlm-encoder/3"
    expected = {
        "num_layers": 2,
        "hidden": 16,
        "ffn": 32,
        "heads": 2,
        "max_len": 24,
        "norm": "post",
        "embedding_norm": False,
        "activation": "relu",
        "pair_vocab": "full",
        "positions": "fairseq",
    }
    assert {k: info["model"][k] for k in expected} == expected
    assert info["objective"]["name"] == "pmlm"
    source = info["source"]
    assert source["file"] == "tiny.pt" and source["arch"] == "prot_pmlm_1b" and source["num_updates"] == 1000000
    assert source["sha256"] == __import__("hashlib").sha256(released_tiny.read_bytes()).hexdigest()
    assert set(source["dropped"]) == {
        "encoder.sentence_encoder.embed_positions._float_tensor",
        "encoder.sentence_encoder.segment_embeddings.weight",
        "encoder.masked_lm_pooler.weight",
        "encoder.masked_lm_pooler.bias",
    }
    # the rows of the dictionary land on our token ids; the padding rows of our vocabulary stay zero
    with torch.serialization.safe_globals([Namespace]):
        state = torch.load(released_tiny, weights_only=True)
    released = state["model"]
    ours = load_file(weights)
    # torch's pre-1.6 format (a pickle, not a zip archive) is read too, into the same encoder
    legacy = tmp_path / "legacy.pt"
    torch.save(state, legacy, _use_new_zipfile_serialization=False)
    assert load_file(import_checkpoint(legacy, tmp_path / "legacy")).keys() == ours.keys()
    assert all(torch.equal(v, load_file(tmp_path / "legacy" / "model.safetensors")[k]) for k, v in ours.items())
    embed = released["encoder.sentence_encoder.embed_tokens.weight"]
    assert torch.equal(
        ours["encoder.embed.weight"][alphabet.TOKEN_TO_ID["W"]], embed[4 + "ARNDCQEGHILKMFPSTWYV".index("W")]
    )
    assert torch.equal(ours["encoder.embed.weight"][alphabet.MASK_ID], embed[26])
    assert torch.equal(ours["encoder.embed.weight"][alphabet.CLS_ID], embed[0])
    assert not ours["encoder.embed.weight"][alphabet.MASK_ID + 1 :].any()
    # q, k, v joined in that order
    q = released["encoder.sentence_encoder.layers.1.self_attn.q_proj.weight"]
    v = released["encoder.sentence_encoder.layers.1.self_attn.v_proj.weight"]
    assert torch.equal(ours["encoder.layers.1.attn.qkv.weight"][:16], q)
    assert torch.equal(ours["encoder.layers.1.attn.qkv.weight"][32:], v)


def test_the_released_file_size_is_its_fp32_parameters():
    """prot_pmlm_1b's tensors (bench_import.released_shapes, which the import test above maps name by name) are
    680,814,837 values: 4 bytes each leave 245,962 of the released 2,723,505,310 bytes for the pickle and the zip
    records, far less than one more copy (an optimiser state) or than half of them (fp16 weights) would change."""
    bench = bench_module()
    count = sum(math.prod(shape) for shape in bench.released_shapes(bench.DIMS["default"]).values())
    assert count == 680_814_837
    assert bench.RELEASED_SIZE - 4 * count == 245_962


def test_a_truncated_file_is_one_line(released_tiny, tmp_path, capsys):
    cut = tmp_path / "cut.pt"
    data = released_tiny.read_bytes()
    cut.write_bytes(data[: len(data) // 2])
    assert_refused(cut, tmp_path / "out", "truncated or not a torch checkpoint", capsys)
    empty = tmp_path / "empty.pt"
    empty.write_bytes(b"")
    assert_refused(empty, tmp_path / "out", "an empty file, not a fairseq checkpoint (.pt)", capsys)


@pytest.mark.parametrize(
    "name, content, what",
    [
        ("seqs.fasta", b">a\nMKV\n", "a FASTA file"),
        ("notes.txt", b"hello", "a text file"),
        (
            "seqs.fasta.gz",
            gzip.compress(b">a\nMKV\n", mtime=0),
            "a gzip file",
        ),  # mtime 0: the same test id on every worker
        ("blob.bin", bytes(range(200, 256)), "a binary file"),
    ],
)
def test_a_file_that_is_no_checkpoint_says_what_it_is_and_never_to_unpickle_it(tmp_path, capsys, name, content, what):
    """Not torch's advice to retry with weights_only=False (which would run the file's code): what the file is, and
    what pmlm import reads."""
    path = tmp_path / name
    path.write_bytes(content)
    assert_refused(
        path, tmp_path / "out", f"{what}, not a fairseq checkpoint (.pt) nor a transformers model folder", capsys
    )


def test_a_pickle_of_something_else_is_refused_without_torchs_advice(tmp_path, capsys):
    odd = tmp_path / "odd.pt"
    odd.write_bytes(b"\x80\x02}q\x00X\x01\x00\x00\x00aq\x01cbuiltins\nset\nq\x02)\x85q\x03Rq\x04s.")
    assert main(["import", str(odd), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "weights_only" not in err and str(odd) in err, err
    assert not (tmp_path / "out").exists()


class _RunsCode:
    """Unpickling this would call os.system (never done here: the importer must refuse it)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.mark.parametrize("container", ["torch.save", "pickle"])
def test_a_pickle_that_would_run_code_is_refused_and_not_run(tmp_path, capsys, container):
    marker = tmp_path / "ran"
    evil = tmp_path / "evil.pt"
    state = {"args": Namespace(arch="prot_pmlm_1b"), "model": {}, "extra_state": {"x": _RunsCode(marker)}}
    if container == "torch.save":
        torch.save(state, evil)
    else:
        evil.write_bytes(pickle.dumps(state, protocol=2))
    assert_refused(evil, tmp_path / "out", "refused: the pickle names posix.system", capsys)
    assert not marker.exists()


def _edit(path: Path, out: Path, edit) -> Path:
    state = load_checkpoint(path)
    edit(state)
    torch.save(state, out)
    return out


def test_an_unknown_architecture_or_setting_names_its_key(released_tiny, tmp_path, capsys):
    def arch(state):
        state["args"].arch = "prot_pmlmx"

    assert_refused(_edit(released_tiny, tmp_path / "a.pt", arch), tmp_path / "out", "args.arch = 'prot_pmlmx'", capsys)

    def learned(state):
        state["args"].encoder_learned_pos = True

    assert_refused(
        _edit(released_tiny, tmp_path / "b.pt", learned), tmp_path / "out", "args.encoder_learned_pos", capsys
    )

    def activation(state):
        state["args"].activation_fn = "gelu_accurate"

    assert_refused(
        _edit(released_tiny, tmp_path / "c.pt", activation),
        tmp_path / "out",
        "args.activation_fn = 'gelu_accurate'",
        capsys,
    )

    def pair_only(state):
        state["args"].pretrain_task = "pmlm"

    assert_refused(
        _edit(released_tiny, tmp_path / "d.pt", pair_only), tmp_path / "out", "args.pretrain_task = 'pmlm'", capsys
    )

    def extra_tensor(state):
        state["model"]["encoder.sentence_encoder.layers.0.self_attn.bias_k"] = torch.zeros(1, 1, 16)

    assert_refused(
        _edit(released_tiny, tmp_path / "e.pt", extra_tensor),
        tmp_path / "out",
        "tensor encoder.sentence_encoder.layers.0.self_attn.bias_k has no counterpart",
        capsys,
    )

    def wider(state):
        state["args"].encoder_embed_dim = 32

    assert_refused(
        _edit(released_tiny, tmp_path / "f.pt", wider), tmp_path / "out", "the checkpoint gives shape", capsys
    )


def test_another_model_family_is_refused(tmp_path, capsys):
    roberta = {f"encoder.sentence_encoder.layers.0.self_attn.{p}_proj.weight": torch.zeros(4, 4) for p in "qkv"}
    roberta["encoder.lm_head.dense.weight"] = torch.zeros(4, 4)
    plain = tmp_path / "roberta_state_dict.pt"
    torch.save(roberta, plain)
    assert_refused(plain, tmp_path / "out", "not a fairseq checkpoint: no 'args' Namespace", capsys)
    fairseq_roberta = tmp_path / "roberta.pt"
    torch.save({"args": Namespace(arch="roberta_base", task="masked_lm"), "model": roberta}, fairseq_roberta)
    assert_refused(
        fairseq_roberta,
        tmp_path / "out",
        "args.arch = 'roberta_base' is not an architecture of the released PMLM code",
        capsys,
    )


def test_the_expected_objective_is_checked(released_tiny, tmp_path):
    with pytest.raises(InputError, match="trained with objective pmlm, not mlm as expected"):
        import_checkpoint(released_tiny, tmp_path / "out", "mlm")
    assert not (tmp_path / "out").exists()


# -- equivalence with the released code run by fairseq -------------------------------------------------------

PROVENANCE = released_provenance()


def released_class_of_ours() -> list[int]:
    """For each of our 27^2 pair classes (27 * id_i + id_j over our token ids, the gap last), the released class of
    the same residue pair: the released code labels the features of (i, j) with t_j * 27 + t_i over its dictionary
    (pmlm_utils.mask_batch_target), here read from the dictionary fairseq built for the fixture."""
    names = {alphabet.CLS: "<s>", alphabet.PAD: "<pad>", alphabet.EOS: "</s>"}
    fairseq = PROVENANCE["models"]["pmlm"]["dictionary"]
    ours = [*alphabet.TOKENS[: alphabet.FULL_PAIR_SIDE - 1], alphabet.GAP]
    index = [fairseq.index(names.get(t, t)) for t in ours]
    side = len(fairseq)
    return [side * index[b] + index[a] for a in range(side) for b in range(side)]


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    root = tmp_path_factory.mktemp("released")
    return {name: import_checkpoint(FIXTURE / f"{name}_tiny.pt", root / name) for name in ("pmlm", "mlm")}


@pytest.mark.parametrize("name", ["pmlm", "mlm"])
@pytest.mark.parametrize("attention", ["padded", "packed"])
def test_imported_model_computes_what_the_released_one_computes(imported, name, attention):
    """Every layer's hidden states and the token logits at every real position, and (PMLM) the pair logits of the
    ordered pairs of the marked positions, against fairseq running the released plugin (tests/data/released)."""
    model, _info, _ = load_encoder(imported[name])
    model.encoder.attention = attention
    cfg = model.cfg
    ref = load_file(FIXTURE / f"{name}_tiny_reference.safetensors")
    tokens = our_tokens(ref["src_tokens"])
    real = tokens.ne(alphabet.PAD_ID)
    states = []
    model.encoder.dropout.register_forward_hook(lambda m, i, o: states.append(o))
    for layer in model.encoder.layers:
        layer.register_forward_hook(lambda m, i, o: states.append(o))
    with torch.no_grad():
        out = model(tokens)
    if attention == "packed":  # the packed layout's layers see (T, C) rows of the real tokens
        states = [torch.zeros(*tokens.shape, cfg.hidden).masked_scatter(real[..., None], s) for s in states]
    assert len(states) == cfg.num_layers + 1 == ref["hidden_states"].shape[0]
    for depth, (ours, theirs) in enumerate(zip(states, ref["hidden_states"])):
        np.testing.assert_allclose(ours[real], theirs[real], rtol=0, atol=layer_tolerance(theirs, depth + 1, cfg))
    fairseq = PROVENANCE["models"][name]["dictionary"]
    residues = [fairseq.index(r) for r in alphabet.RESIDUES]
    theirs = ref["token_logits"][..., residues]  # our 20 classes: the released logits of the residues
    np.testing.assert_allclose(
        out["logits"][real], theirs[real], rtol=0, atol=layer_tolerance(theirs, cfg.num_layers + 2, cfg)
    )
    if name == "pmlm":
        marked = ref["marked"]
        pairs = torch.tensor(
            [
                (b, i, j)
                for b in range(marked.shape[0])
                for i in marked[b].nonzero().flatten().tolist()
                for j in marked[b].nonzero().flatten().tolist()
                if i != j
            ]
        )  # row-major, as released
        with torch.no_grad():
            pair_logits = model(tokens, pair_index=pairs)["pair_logits"]
        theirs = ref["pair_logits"][:, released_class_of_ours()]
        assert pair_logits.shape == theirs.shape == (len(pairs), 27 * 27)
        np.testing.assert_allclose(pair_logits, theirs, rtol=0, atol=layer_tolerance(theirs, cfg.num_layers + 2, cfg))
        np.testing.assert_allclose(
            out["logits"][marked],
            ref["marked_token_logits"][:, residues],
            rtol=0,
            atol=layer_tolerance(theirs, cfg.num_layers + 2, cfg),
        )


def test_fixture_models_are_the_released_families(imported):
    pmlm_info = json.loads(imported["pmlm"].with_suffix(".json").read_text())
    mlm_info = json.loads(imported["mlm"].with_suffix(".json").read_text())
    assert (pmlm_info["source"]["arch"], pmlm_info["objective"]["name"]) == ("prot_pmlm_1b", "pmlm")
    assert (pmlm_info["model"]["activation"], pmlm_info["model"]["embedding_norm"]) == ("relu", False)
    assert (mlm_info["source"]["arch"], mlm_info["objective"]["name"]) == ("prot_mlm_base", "mlm")
    assert (mlm_info["model"]["activation"], mlm_info["model"]["embedding_norm"]) == ("gelu", True)
    assert mlm_info["source"]["share_encoder_input_output_embed"] is True
    # the MLM checkpoint carries an Adam state, as fairseq saves it by default; it is read past, not imported
    assert "encoder.sentence_projection_layer.weight" in mlm_info["source"]["dropped"]


# -- using an imported model ------------------------------------------------------------------------------


def test_embed_contacts_score_and_load_on_an_imported_model(imported, tmp_path):
    model_dir = imported["pmlm"].parent
    seqs = {"first": PROVENANCE["sequences"][0], "third": PROVENANCE["sequences"][2]}
    fasta = tmp_path / "seqs.fasta"
    fasta.write_text("".join(f">{k}\n{v}\n" for k, v in seqs.items()))
    assert main(["embed", str(model_dir), str(fasta), "-o", str(tmp_path / "emb.parquet"), "--device", "cpu"]) == 0
    emb = pd.read_parquet(tmp_path / "emb.parquet")
    ref = load_file(FIXTURE / "pmlm_tiny_reference.safetensors")["hidden_states"][-1]  # the released final layer
    for b, (name, seq) in zip((0, 2), seqs.items()):
        rows = np.stack(emb[emb["id"] == name]["embedding"].to_numpy())
        np.testing.assert_allclose(
            rows, ref[b, 1 : len(seq) + 1], rtol=0, atol=layer_tolerance(ref, 4, load_encoder(imported["pmlm"])[0].cfg)
        )
    assert main(["contacts", str(model_dir), str(fasta), "-o", str(tmp_path / "maps"), "--device", "cpu"]) == 0
    scores = np.load(tmp_path / "maps" / "third.npz")["scores"]
    assert (
        scores.shape == (len(seqs["third"]),) * 2 and np.isfinite(scores[np.triu_indices(len(seqs["third"]), 1)]).all()
    )
    wt = tmp_path / "wt.fasta"
    wt.write_text(f">wt\n{seqs['third']}\n")
    (tmp_path / "muts.csv").write_text("mutant\nM1A\nA2G\nM1A:A2G\nD3E:K22R\n")
    assert (
        main(
            [
                "score",
                str(model_dir),
                "--sequence",
                str(wt),
                "--mutations",
                str(tmp_path / "muts.csv"),
                "-o",
                str(tmp_path / "scores.tsv"),
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    table = pd.read_csv(tmp_path / "scores.tsv", sep="\t")
    assert list(table["kind"]) == ["single", "single", "double", "double"]
    assert list(table["double_from"].fillna("-"))[2:] == ["pair_joint", "pair_joint"]
    assert np.isfinite(table["score"]).all()
    loaded = pmlm.load(model_dir)
    np.testing.assert_allclose(
        loaded.embed(seqs["first"]),
        ref[0, 1 : len(seqs["first"]) + 1],
        rtol=0,
        atol=layer_tolerance(ref, 4, loaded.encoder.cfg),
    )
    np.testing.assert_allclose(loaded.contacts(seqs["third"]), scores, rtol=0, atol=1e-5, equal_nan=True)
    rows = loaded.score(seqs["third"], ["M1A", "M1A:A2G"])
    np.testing.assert_allclose([r["score"] for r in rows], table["score"].iloc[[0, 2]], rtol=0, atol=1e-5)
