"""`pmlm import`: released fairseq checkpoints as encoders.

The equivalence tests read tests/data/released/: tiny models of the released code's families, made and run by
fairseq with the released plugin (make_fixture.py there; README.md says how), with what they computed. The
bad-input tests write damaged or foreign checkpoints in the released layout (bench/bench_import.py's writer).
"""

from __future__ import annotations

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
from safetensors.torch import load_file

from pmlm import alphabet
from pmlm.cli import main
from pmlm.errors import InputError
from pmlm.evaluation.pretrained import load_pretrained
from pmlm.fairseq_checkpoint import import_checkpoint, load_checkpoint
from pmlm.model.config import model_config
from pmlm.model.encoder import fairseq_positions, sinusoidal_positions

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "tests" / "data" / "released"
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


def test_default_positions_keep_every_existing_encoder(tmp_path):
    cfg = model_config("tiny")
    assert cfg.positions == "pmlm"
    from pmlm.model.pmlm_model import PMLMModel
    assert torch.equal(PMLMModel(cfg).encoder.positions, sinusoidal_positions(cfg.max_len, cfg.hidden))
    # a version-2 sidecar, written before the field existed, loads as the encoder it describes
    from pmlm.artefacts import save_weights
    from pmlm.model.objectives import ObjectiveConfig, build_model
    model = build_model(cfg, ObjectiveConfig())
    section = {k: v for k, v in cfg.to_dict().items() if k != "positions"}
    path = tmp_path / "model.safetensors"
    save_weights(path, model.state_dict(), {"format": "pmlm-encoder/2", "model": section, "objective": {"name": "pmlm"}})
    loaded, _ = load_pretrained(path)
    assert loaded.cfg.positions == "pmlm"


# -- what the released layout holds, and what is refused ---------------------------------------------------

def test_released_layout_imports_with_its_provenance(released_tiny, tmp_path):
    weights = import_checkpoint(released_tiny, tmp_path / "enc")
    info = json.loads(weights.with_suffix(".json").read_text())
    assert info["format"] == "pmlm-encoder/3"
    expected = {"num_layers": 2, "hidden": 16, "ffn": 32, "heads": 2, "max_len": 24, "norm": "post",
                "embedding_norm": False, "activation": "relu", "pair_vocab": "full", "positions": "fairseq"}
    assert {k: info["model"][k] for k in expected} == expected
    assert info["objective"]["name"] == "pmlm"
    source = info["source"]
    assert source["file"] == "tiny.pt" and source["arch"] == "prot_pmlm_1b" and source["num_updates"] == 1000000
    assert source["sha256"] == __import__("hashlib").sha256(released_tiny.read_bytes()).hexdigest()
    assert set(source["dropped"]) == {"encoder.sentence_encoder.embed_positions._float_tensor",
                                      "encoder.sentence_encoder.segment_embeddings.weight",
                                      "encoder.masked_lm_pooler.weight", "encoder.masked_lm_pooler.bias"}
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
    assert torch.equal(ours["encoder.embed.weight"][alphabet.TOKEN_TO_ID["W"]], embed[4 + "ARNDCQEGHILKMFPSTWYV".index("W")])
    assert torch.equal(ours["encoder.embed.weight"][alphabet.MASK_ID], embed[26])
    assert torch.equal(ours["encoder.embed.weight"][alphabet.CLS_ID], embed[0])
    assert not ours["encoder.embed.weight"][alphabet.MASK_ID + 1:].any()
    # q, k, v joined in that order
    q = released["encoder.sentence_encoder.layers.1.self_attn.q_proj.weight"]
    v = released["encoder.sentence_encoder.layers.1.self_attn.v_proj.weight"]
    assert torch.equal(ours["encoder.layers.1.attn.qkv.weight"][:16], q)
    assert torch.equal(ours["encoder.layers.1.attn.qkv.weight"][32:], v)


def test_a_truncated_file_is_one_line(released_tiny, tmp_path, capsys):
    cut = tmp_path / "cut.pt"
    data = released_tiny.read_bytes()
    cut.write_bytes(data[: len(data) // 2])
    assert_refused(cut, tmp_path / "out", "truncated or not a torch checkpoint", capsys)
    empty = tmp_path / "empty.pt"
    empty.write_bytes(b"")
    assert_refused(empty, tmp_path / "out", "truncated or not a torch checkpoint", capsys)


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

    assert_refused(_edit(released_tiny, tmp_path / "b.pt", learned), tmp_path / "out", "args.encoder_learned_pos",
                   capsys)

    def activation(state):
        state["args"].activation_fn = "gelu_accurate"

    assert_refused(_edit(released_tiny, tmp_path / "c.pt", activation), tmp_path / "out",
                   "args.activation_fn = 'gelu_accurate'", capsys)

    def pair_only(state):
        state["args"].pretrain_task = "pmlm"

    assert_refused(_edit(released_tiny, tmp_path / "d.pt", pair_only), tmp_path / "out", "args.pretrain_task = 'pmlm'",
                   capsys)

    def extra_tensor(state):
        state["model"]["encoder.sentence_encoder.layers.0.self_attn.bias_k"] = torch.zeros(1, 1, 16)

    assert_refused(_edit(released_tiny, tmp_path / "e.pt", extra_tensor), tmp_path / "out",
                   "tensor encoder.sentence_encoder.layers.0.self_attn.bias_k has no counterpart", capsys)

    def wider(state):
        state["args"].encoder_embed_dim = 32

    assert_refused(_edit(released_tiny, tmp_path / "f.pt", wider), tmp_path / "out", "the checkpoint gives shape",
                   capsys)


def test_another_model_family_is_refused(tmp_path, capsys):
    roberta = {f"encoder.sentence_encoder.layers.0.self_attn.{p}_proj.weight": torch.zeros(4, 4) for p in "qkv"}
    roberta["encoder.lm_head.dense.weight"] = torch.zeros(4, 4)
    plain = tmp_path / "roberta_state_dict.pt"
    torch.save(roberta, plain)
    assert_refused(plain, tmp_path / "out", "not a fairseq checkpoint: no 'args' Namespace", capsys)
    fairseq_roberta = tmp_path / "roberta.pt"
    torch.save({"args": Namespace(arch="roberta_base", task="masked_lm"), "model": roberta}, fairseq_roberta)
    assert_refused(fairseq_roberta, tmp_path / "out", "args.arch = 'roberta_base' is not an architecture of the "
                                                      "released PMLM code", capsys)


def test_the_expected_objective_is_checked(released_tiny, tmp_path):
    with pytest.raises(InputError, match="trained with objective pmlm, not mlm as expected"):
        import_checkpoint(released_tiny, tmp_path / "out", "mlm")
    assert not (tmp_path / "out").exists()
