"""`pmlm contacts`: the unsupervised read-out and a fine-tuned head's probabilities against the engines'
own functions, windows for long sequences, TSV / NPZ / PNG outputs and the true map; `pmlm.load` on a head
folder moved elsewhere; one-line refusals with no output."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from test_finetune import recipe, write_structures
from tiny_models import random_letters, tiny_encoder, write_fasta

import pmlm
import pmlm.errors
from pmlm import alphabet
from pmlm.cli import main
from pmlm.config.finetuning import FinetuneConfig
from pmlm.evaluation.pair_readout import unsupervised_contact_scores
from pmlm.finetune.finetune import finetune
from pmlm.pretrained import load_encoder, load_head
from pmlm.tokens import batch_tokens

# every test of this module runs torch on one thread (conftest.single_thread)
pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    root = tmp_path_factory.mktemp("contacts")
    encoder = tiny_encoder(root / "enc" / "pmlm" / "model.safetensors", max_len=26)  # window 24
    structures = write_structures(root / "chains.jsonl", 6, seed=3, lengths=(12, 20))
    cfg = FinetuneConfig.from_dict(
        recipe(
            head={"kind": "linear", "features": "M+"},
            optim__total_steps=2,
            optim__warmup_steps=0,
            save_every=0,
            data__crop=16,
        )
    )
    head = root / "heads" / "contact" / "head.safetensors"
    assert finetune(cfg, encoder, structures, root / "run", head) == 0
    chains = [json.loads(line) for line in structures.read_text().splitlines()]
    seqs = {f"{c['id']}_{c['chain']}": c["seq"] for c in chains[:2]}
    seqs["long"] = random_letters(60, seed=5)
    return {
        "encoder": encoder,
        "head": head,
        "structures": structures,
        "seqs": seqs,
        "fasta": write_fasta(root / "in.fasta", seqs),
        "mlm": tiny_encoder(root / "mlm" / "model.safetensors", objective="mlm", max_len=26),
    }


def _tsv(path) -> list[dict]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh, delimiter="\t"))


def test_readout_maps_match_the_evaluation_readout(tmp_path, case):
    out = tmp_path / "maps"
    assert (
        main(
            [
                "contacts",
                str(case["encoder"]),
                str(case["fasta"]),
                "-o",
                str(out),
                "--png",
                "--structure",
                str(case["structures"]),
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    names = sorted(case["seqs"])
    assert sorted(p.name for p in out.iterdir()) == sorted(f"{n}.{ext}" for n in names for ext in ("tsv", "npz", "png"))
    model, *_ = load_encoder(case["encoder"])
    for name, letters in case["seqs"].items():
        npz = np.load(out / f"{name}.npz")
        scores = npz["scores"]
        assert scores.shape == (len(letters),) * 2 and str(npz["score_kind"]) == "pair_kl_apc"
        assert str(npz["sequence"]) == letters
        rows = _tsv(out / f"{name}.tsv")
        assert len(rows) == len(letters) * (len(letters) - 1) // 2
        values = np.array([float(r["score"]) for r in rows])
        finite = values[np.isfinite(values)]
        assert np.all(np.diff(finite) <= 0) and np.isnan(values[len(finite) :]).all()  # highest first, NaN last
        for r in rows[:5]:
            i, j = int(r["i"]) - 1, int(r["j"]) - 1
            assert (r["residue_i"], r["residue_j"]) == (letters[i], letters[j])
            assert float(r["score"]) == pytest.approx(float(scores[i, j]), rel=1e-6)
        if name == "long":  # 4 windows of 24: pairs farther apart than any window holds have no value
            assert np.isnan(scores[0, 59]) and np.isfinite(scores[30, 40]) and "contact" not in rows[0]
            window = unsupervised_contact_scores(model, alphabet.encode(letters[:24]), "kl")
            # residues 0..11 lie only in the first window: their pairs are that window's values
            np.testing.assert_allclose(scores[:12, :12], window[:12, :12], rtol=1e-5, atol=1e-6)
        else:
            want = unsupervised_contact_scores(model, alphabet.encode(letters), "kl")
            np.testing.assert_allclose(scores, want, rtol=1e-6, atol=1e-7)
            assert {r["contact"] for r in rows} <= {"0", "1", ""} and any(r["contact"] == "1" for r in rows)


def test_head_probabilities_and_a_moved_head(tmp_path, case):
    out = tmp_path / "maps"
    assert (
        main(
            [
                "contacts",
                str(case["encoder"].parent),
                str(case["fasta"]),
                "-o",
                str(out),
                "--head",
                str(case["head"].parent),
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    task_model = load_head(case["head"]).model
    letters = next(iter(case["seqs"].values()))
    name = next(iter(case["seqs"]))
    with torch.no_grad():
        tokens = torch.from_numpy(batch_tokens([alphabet.encode(letters)]).tokens)
        want = torch.sigmoid(task_model(tokens, torch.ones(1, len(letters), dtype=torch.bool))[0]).numpy()
    npz = np.load(out / f"{name}.npz")
    assert str(npz["score_kind"]) == "probability"
    np.testing.assert_allclose(npz["scores"], want, rtol=1e-5, atol=1e-7)
    assert np.isnan(np.load(out / "long.npz")["scores"][0, 59])

    # the head and its encoder moved together: the head finds the encoder beside it, from any working directory
    moved = tmp_path / "elsewhere"
    shutil.copytree(case["head"].parents[2], moved)
    here = os.getcwd()
    try:
        os.chdir(tmp_path)
        loaded = pmlm.load(moved / "heads" / "contact")
    finally:
        os.chdir(here)
    assert loaded.head is not None and "contact head" in repr(loaded)
    # the encoder named explicitly is checked against the head's record
    named = pmlm.load(moved / "heads" / "contact", encoder=moved / "enc" / "pmlm")
    np.testing.assert_array_equal(named.contacts(letters), loaded.contacts(letters))
    with pytest.raises(pmlm.errors.InputError, match="the head was fine-tuned on an encoder with sha256"):
        pmlm.load(moved / "heads" / "contact", encoder=case["mlm"])
    np.testing.assert_allclose(loaded.contacts(letters), want, rtol=1e-5, atol=1e-7)
    encoder = pmlm.load(moved / "enc" / "pmlm")
    assert encoder.head is None and encoder.contacts(letters).shape == (len(letters),) * 2
    emb = encoder.embed([letters, "ACDE"])
    assert [e.shape for e in emb] == [(len(letters), 16), (4, 16)]
    assert encoder.embed("ACDE", mean=True).shape == (16,)


def test_import_pmlm_does_not_load_torch():
    code = "import sys, pmlm; assert callable(pmlm.load); assert 'torch' not in sys.modules, 'torch loaded'"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize(
    "problem",
    ["mlm_no_head", "other_encoder", "unknown_residue", "not_contact_head", "missing_head", "sequence_differs"],
)
def test_bad_input_is_one_line_and_leaves_nothing(tmp_path, case, capsys, problem):
    encoder, fasta, extra = case["encoder"], case["fasta"], []
    if problem == "mlm_no_head":
        encoder = case["mlm"]
        expected = f"{encoder}: this encoder has no pair head (objective mlm); pass --head"
    elif problem == "other_encoder":
        extra = ["--head", str(case["head"])]
        encoder = case["mlm"]
        expected = "the head was fine-tuned on an encoder with sha256"
    elif problem == "unknown_residue":
        fasta = write_fasta(tmp_path / "bad.fasta", {"a": "ACDEFG", "b": "AC*DE"})
        expected = f"{fasta}:3: record 'b': character '*' at position 3"
    elif problem == "not_contact_head":
        head = tmp_path / "ss3" / "head.safetensors"
        head.parent.mkdir()
        shutil.copy(case["head"], head)
        info = json.loads(case["head"].with_suffix(".json").read_text())
        info["config"]["task"] = "ss3"
        info["encoder"]["path"] = os.path.relpath(case["encoder"], head.parent)
        head.with_suffix(".json").write_text(json.dumps(info))
        extra = ["--head", str(head.parent)]
        expected = f"{head.with_suffix('.json')}: a ss3 head, not a contact head"
    elif problem == "missing_head":
        extra = ["--head", str(tmp_path / "nohead")]
        expected = f"{tmp_path / 'nohead'}: no head weights here"
    else:
        first = next(iter(case["seqs"]))
        fasta = write_fasta(tmp_path / "x.fasta", {first: "ACDEFGHIKLMN"})
        extra = ["--structure", str(case["structures"])]
        expected = f"sequence differs from FASTA record {first!r}"
    out = tmp_path / "out" / "maps"
    assert main(["contacts", str(encoder), str(fasta), "-o", str(out), "--device", "cpu", *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("pmlm contacts: error: ") and expected in err, err
    assert not out.exists() and (not out.parent.exists() or list(out.parent.iterdir()) == [])
