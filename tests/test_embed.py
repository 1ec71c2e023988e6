"""`pmlm embed`: rows aligned to residues, values equal to the encoder's own forward pass (alone, per layer,
and averaged over overlapping windows for long sequences), independent of the token budget; bad inputs give
one line, exit 2 and no output."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch
from conftest import reorder_tolerance
from tiny_models import random_letters, tiny_encoder, write_fasta

from pmlm import alphabet
from pmlm.cli import main
from pmlm.pretrained import load_encoder
from pmlm.tokens import WindowMean, batch_tokens, window_starts

# every test of this module runs torch on one thread (conftest.single_thread)
pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    root = tmp_path_factory.mktemp("embed")
    seqs = {
        "short": random_letters(5, 1),
        "full": random_letters(16, 2),
        "long": random_letters(40, 3),
        "sp|P1|x": random_letters(9, 4),
    }
    return {
        "encoder": tiny_encoder(root / "pmlm" / "model.safetensors"),
        "fasta": write_fasta(root / "in.fasta", seqs),
        "seqs": seqs,
    }


def _alone(model, letters: str, layer: int | None = None) -> torch.Tensor:
    """(L, C) representations of one window read alone, by the encoder's own modules."""
    tokens = torch.from_numpy(batch_tokens([alphabet.encode(letters)]).tokens)
    with torch.no_grad():
        if layer is None:
            return model.encode(tokens)[0, 1:-1]
        enc = model.encoder
        x = enc.embed(tokens) + enc.positions[: tokens.shape[1]]
        for block in enc.layers[:layer]:
            x = block(x, None)
        return x[0, 1:-1]


def _reference(model, letters: str, layer: int | None = None) -> np.ndarray:
    """Windows of a long sequence, each alone, averaged per residue."""
    room = model.cfg.max_len - 2
    mean = WindowMean(len(letters), (model.cfg.hidden,))
    for start in window_starts(len(letters), room):
        mean.add(start, _alone(model, letters[start : start + room], layer).double().numpy())
    return mean.mean()


def test_rows_follow_residues_and_match_the_forward_pass(tmp_path, case):
    out = tmp_path / "emb.parquet"
    assert main(["embed", str(case["encoder"]), str(case["fasta"]), "-o", str(out), "--device", "cpu"]) == 0
    table = pd.read_parquet(out)
    seqs = case["seqs"]
    assert list(table.columns) == ["id", "position", "residue", "embedding"]
    assert list(table["id"].unique()) == list(seqs)  # input order, ids as the first header word
    assert len(table) == sum(len(s) for s in seqs.values())  # no <cls> / <eos> rows
    model, *_ = load_encoder(case["encoder"])
    per_seq = pd.read_parquet(tmp_path / "emb.per_sequence.parquet")
    assert list(per_seq.columns) == ["id", "length", "embedding"]
    for name, letters in seqs.items():
        rows = table[table["id"] == name]
        assert rows["position"].tolist() == list(range(1, len(letters) + 1))
        assert "".join(rows["residue"]) == letters
        got = np.stack(rows["embedding"].to_list())
        assert got.dtype == np.float32 and got.shape == (len(letters), 16)
        want = _reference(model, letters)
        assert (len(window_starts(len(letters), 16)) > 1) == (name == "long")  # 4 windows: 0, 8, 16, 24
        np.testing.assert_allclose(got, want, rtol=0, atol=reorder_tolerance(torch.from_numpy(want), 16 * 18))
        mean = per_seq.set_index("id").loc[name]
        assert mean["length"] == len(letters)
        np.testing.assert_allclose(mean["embedding"], got.mean(axis=0), rtol=0, atol=1e-6 * np.abs(got).max())
    settings = json.loads(pq.read_schema(out).metadata[b"pmlm"])
    assert (settings["layer"], settings["num_layers"], settings["window"]) == (2, 2, 16)


def test_layers_and_token_budget(tmp_path, case):
    model, *_ = load_encoder(case["encoder"])
    letters = case["seqs"]["long"]
    tables = {}
    for layer, budget in ((0, 8192), (1, 8192), (-3, 8192), (-1, 1), (2, 64)):
        out = tmp_path / f"l{layer}_{budget}.parquet"
        assert (
            main(
                [
                    "embed",
                    str(case["encoder"]),
                    str(case["fasta"]),
                    "-o",
                    str(out),
                    "--layer",
                    str(layer),
                    "--tokens-per-batch",
                    str(budget),
                    "--device",
                    "cpu",
                ]
            )
            == 0
        )
        table = pd.read_parquet(out)
        tables[layer, budget] = np.stack(table[table["id"] == "long"]["embedding"].to_list())
    for layer in (0, 1):
        want = _reference(model, letters, layer)
        np.testing.assert_allclose(
            tables[layer, 8192], want, rtol=0, atol=reorder_tolerance(torch.from_numpy(want), 16 * 18)
        )
    assert np.array_equal(tables[0, 8192], tables[-3, 8192])  # -3 counts from the end of 0..2
    # one window per batch, or several padded together: the same values up to the order of additions
    np.testing.assert_allclose(
        tables[-1, 1], tables[2, 64], rtol=0, atol=reorder_tolerance(torch.from_numpy(tables[2, 64]), 16 * 18)
    )
    assert not np.allclose(tables[0, 8192], tables[2, 64])


@pytest.mark.parametrize(
    "problem", ["unknown_residue", "lowercase", "duplicate_id", "no_weights", "bad_sidecar", "wrong_weights", "layer"]
)
def test_bad_input_is_one_line_and_leaves_nothing(tmp_path, case, capsys, problem):
    fasta, encoder, extra = case["fasta"], case["encoder"], []
    if problem == "unknown_residue":
        fasta = write_fasta(tmp_path / "bad.fasta", {"a": "ACDE", "b": "ACBDE"})
        expected = f"{fasta}:3: record 'b': character 'B' at position 3"
    elif problem == "lowercase":
        fasta = write_fasta(tmp_path / "bad.fasta", {"a": "acde"})
        expected = f"{fasta}:1: record 'a'"
    elif problem == "duplicate_id":
        fasta = write_fasta(tmp_path / "bad.fasta", {"a": "ACDE"})
        fasta.write_text(fasta.read_text() * 2)
        expected = f"{fasta}:3: duplicate id 'a' (first at line 1)"
    elif problem == "no_weights":
        encoder = tmp_path / "nowhere"
        expected = f"{encoder}: no encoder weights here"
    elif problem == "bad_sidecar":
        encoder = tiny_encoder(tmp_path / "m" / "model.safetensors")
        encoder.with_suffix(".json").write_text(json.dumps({"format": "pmlm-head/1", "config": {}}))
        expected = "format 'pmlm-head/1' is not the 'pmlm-encoder/3'"
    elif problem == "wrong_weights":
        encoder = tiny_encoder(tmp_path / "m" / "model.safetensors")
        info = json.loads(encoder.with_suffix(".json").read_text())
        info["model"]["hidden"] = 32  # the sidecar describes another model than the weights hold
        info["model"]["ffn"] = 64
        encoder.with_suffix(".json").write_text(json.dumps(info))
        expected = f"{encoder}: weights do not match the model"
    else:
        extra = ["--layer", "3"]
        expected = "--layer must be in [-3, 2] for this 2-layer encoder, got 3"
    out = tmp_path / "out" / "emb.parquet"
    assert main(["embed", str(encoder), str(fasta), "-o", str(out), "--device", "cpu", *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("pmlm embed: error: ") and expected in err, err
    assert not out.parent.exists() or list(out.parent.iterdir()) == []
