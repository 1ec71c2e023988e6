"""`pmlm contacts`: the pair read-out, the categorical Jacobian (against a direct computation) and a fine-tuned
head's probabilities against the engines' own functions, windows for long sequences; the rows (separation, top,
no pairs beyond the windows), TSV / NPZ / PNG in a folder and the one Parquet table; outputs that never destroy
(a folder of the user's, the working folder, a file); `pmlm.load` on a head folder moved elsewhere; one-line
refusals with no output."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from tiny_models import random_letters, recipe, tiny_encoder, write_fasta, write_structures

import pmlm
import pmlm.errors
from pmlm import alphabet
from pmlm.cli import main
from pmlm.config.finetuning import FinetuneConfig
from pmlm.evaluation.pair_readout import unsupervised_contact_scores
from pmlm.finetune.finetune import finetune
from pmlm.outputs import MANIFEST
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


def _contacts(*args, device: str = "cpu") -> int:
    return main(["contacts", *map(str, args), "--device", device])


def test_readout_maps_match_the_evaluation_readout(tmp_path, case, capsys):
    out = tmp_path / "maps"
    assert _contacts(case["encoder"], case["fasta"], "-o", out, "--png", "--structure", case["structures"]) == 0
    names = sorted(case["seqs"])
    expected = sorted(f"{n}.{ext}" for n in names for ext in ("tsv", "npz", "png"))
    assert sorted(p.name for p in out.iterdir()) == sorted([*expected, MANIFEST])
    assert json.loads((out / MANIFEST).read_text()) == {"command": "pmlm contacts", "files": expected}
    model, *_ = load_encoder(case["encoder"])
    beyond = 0
    for name, letters in case["seqs"].items():
        npz = np.load(out / f"{name}.npz")
        scores = npz["scores"]
        assert scores.shape == (len(letters),) * 2 and str(npz["score_kind"]) == "pair_kl_apc"
        assert str(npz["sequence"]) == letters
        assert json.loads(str(npz["settings"]))["min_separation"] == 6
        rows = _tsv(out / f"{name}.tsv")
        i, j = np.triu_indices(len(letters), k=6)
        held = np.isfinite(scores[i, j])
        beyond += int((~held).sum())
        # one row per pair j - i >= 6 that a window holds, highest score first, ties by (i, j)
        assert len(rows) == int(held.sum())
        values = np.array([float(r["score"]) for r in rows])
        assert np.isfinite(values).all() and np.all(np.diff(values) <= 0)
        assert all(int(r["separation"]) == int(r["j"]) - int(r["i"]) >= 6 for r in rows)
        assert all(r["contact"] in ("0", "1", "") for r in rows)  # --structure: the column for every sequence
        for r in rows:
            i, j = int(r["i"]) - 1, int(r["j"]) - 1
            assert (r["residue_i"], r["residue_j"]) == (letters[i], letters[j])
            assert np.float32(r["score"]) == scores[i, j]  # the TSV holds the NPZ's float32 value
        if name == "long":  # 4 windows of 24: pairs farther apart than any window holds have no value
            assert np.isnan(scores[0, 59]) and np.isfinite(scores[30, 40])
            assert {r["contact"] for r in rows} == {""}  # no structure
            window = unsupervised_contact_scores(model, alphabet.encode(letters[:24]), "kl")
            # residues 0..11 lie only in the first window: their pairs are that window's values
            np.testing.assert_allclose(scores[:12, :12], window[:12, :12], rtol=1e-5, atol=1e-6)
        else:
            want = unsupervised_contact_scores(model, alphabet.encode(letters), "kl")
            np.testing.assert_allclose(scores, want, rtol=1e-6, atol=1e-7)
            assert any(r["contact"] == "1" for r in rows)
    assert beyond > 0
    err = capsys.readouterr().err
    assert f"{beyond:,} pairs beyond the windows left out" in err
    assert "long range mean over 2 chains: P@L" in err and "1 without a structure" in err


def test_unknown_letters_read_as_x_or_skipped_and_counted(tmp_path, case, capsys):
    """--unknown as pmlm embed's: x reads B, Z and U as X (the pairs score as with X written out), skip leaves the
    record out; either is counted on stderr and recorded in the table's settings."""
    seqs = {"a": "MKBZTACDEFGHIKLMNPQR", "b": "ACDEFGHIKLMNPUQ", "c": "ACDEFGHIKLMN"}
    fasta = write_fasta(tmp_path / "in.fasta", seqs)
    written = write_fasta(
        tmp_path / "ref.fasta", {k: s.replace("B", "X").replace("Z", "X").replace("U", "X") for k, s in seqs.items()}
    )
    assert _contacts(case["encoder"], written, "-o", tmp_path / "ref.parquet") == 0
    assert _contacts(case["encoder"], fasta, "-o", tmp_path / "x.parquet", "--unknown", "x") == 0
    err = capsys.readouterr().err
    assert "pmlm contacts: 3 letters outside the alphabet read as X in 2 sequences\n" in err, err
    got, ref = pq.read_table(tmp_path / "x.parquet"), pq.read_table(tmp_path / "ref.parquet")
    assert got.to_pylist() == ref.to_pylist() and "X" in got.column("residue_i").to_pylist()
    assert json.loads(got.schema.metadata[b"pmlm"])["unknown"] == "x"
    assert _contacts(case["encoder"], fasta, "-o", tmp_path / "skip.parquet", "--unknown", "skip") == 0
    err = capsys.readouterr().err
    assert "pmlm contacts: 2 sequences with letters outside the alphabet skipped (3 such letters)\n" in err, err
    assert set(pq.read_table(tmp_path / "skip.parquet").column("id").to_pylist()) == {"c"}


def test_top_and_min_separation_choose_the_rows(tmp_path, case):
    fasta = write_fasta(tmp_path / "one.fasta", {"s": case["seqs"]["long"][:23]})  # one window: every pair held
    length = 23
    counts = {}
    for extra in ([], ["--top", "L/5"], ["--top", "L"], ["--top", "7"], ["--min-separation", "10"]):
        out = tmp_path / f"maps{len(counts)}"
        assert _contacts(case["encoder"], fasta, "-o", out, *extra) == 0
        rows = _tsv(out / "s.tsv")
        counts[" ".join(extra)] = len(rows)
        assert min(int(r["separation"]) for r in rows) >= (10 if "--min-separation" in extra else 6)
        if extra:
            full = _tsv(tmp_path / "maps0" / "s.tsv")
            if "--top" in extra:  # the top rows are the first rows of the full list
                assert rows == full[: len(rows)]
    pairs = lambda s: (length - s) * (length - s + 1) // 2  # noqa: E731 (pairs j - i >= s)
    assert counts == {
        "": pairs(6),
        "--top L/5": length // 5,
        "--top L": length,
        "--top 7": 7,
        "--min-separation 10": pairs(10),
    }


def test_a_parquet_table_holds_the_folders_rows(tmp_path, case):
    folder, table = tmp_path / "maps", tmp_path / "all.parquet"
    common = [case["encoder"], case["fasta"], "--structure", case["structures"], "--top", "L"]
    assert _contacts(common[0], common[1], "-o", folder, *common[2:]) == 0
    assert _contacts(common[0], common[1], "-o", table, *common[2:]) == 0
    read = pq.read_table(table)
    assert [str(t) for t in read.schema.types] == [
        "string",
        "int32",
        "int32",
        "string",
        "string",
        "int32",
        "float",
        "int8",
    ]
    assert read.column_names == ["id", "i", "j", "residue_i", "residue_j", "separation", "score", "contact"]
    settings = json.loads(read.schema.metadata[b"pmlm"])
    assert settings["score_kind"] == "pair_kl_apc" and settings["top"] == "L" and settings["min_separation"] == 6
    assert {"model_sha256", "window", "precision", "pmlm_version"} <= settings.keys() and settings["window"] == 24
    got = read.to_pylist()
    want = []
    for name in case["seqs"]:  # FASTA order, each sequence's rows as in its TSV
        for r in _tsv(folder / f"{name}.tsv"):
            row = {"id": name, **{k: int(r[k]) for k in ("i", "j", "separation")}, "contact": None}
            row |= {"residue_i": r["residue_i"], "residue_j": r["residue_j"], "score": float(np.float32(r["score"]))}
            row["contact"] = int(r["contact"]) if r["contact"] else None
            want.append(row)
    assert got == want and len(got) > 0
    assert os.stat(table).st_mode & 0o044 == 0o044


def _direct_jacobian_scores(model, letters: str) -> np.ndarray:
    """The categorical Jacobian contact map by its definition, one forward pass per substitution, loops over pairs:
    D = l_i(a | x_j = b) - l_i(a | x); J = D - D[a = w_i] (the mean over a at X); the Frobenius norm of
    (J[i, j] + J[j, i]^T) / 2; APC over the off-diagonal entries."""
    ids = alphabet.encode(letters)
    length, q = len(letters), alphabet.NUM_RESIDUES

    def log_probs(row: np.ndarray) -> np.ndarray:
        tokens = torch.from_numpy(batch_tokens([row]).tokens)
        with torch.no_grad():
            logits = model(tokens)["logits"][0, 1 : length + 1]
        return torch.log_softmax(logits.double(), dim=-1).numpy()  # (L, 20)

    wild = log_probs(ids)
    table = np.zeros((length, q, length, q))  # [j, b, i, a]
    for j in range(length):
        for b in range(q):
            row = ids.copy()
            row[j] = alphabet.FIRST_RESIDUE_ID + b
            table[j, b] = log_probs(row)
    jac = np.zeros((length, length, q, q))
    for i in range(length):
        for j in range(length):
            d = (table[j, :, i, :] - wild[i][None, :]).T  # [a, b]
            w = ids[i] - alphabet.FIRST_RESIDUE_ID
            jac[i, j] = d - (d[w] if w < q else d.mean(axis=0))[None, :]
    norms = np.zeros((length, length))
    for i in range(length):
        for j in range(length):
            if i != j:
                norms[i, j] = np.linalg.norm(0.5 * (jac[i, j] + jac[j, i].T))
    off = ~np.eye(length, dtype=bool)
    row_mean = np.array([norms[k][off[k]].mean() for k in range(length)])
    corrected = norms - np.outer(row_mean, row_mean) / norms[off].mean()
    corrected[~off] = 0.0
    return corrected


def test_the_jacobian_readout_of_an_mlm_is_its_definition(tmp_path, case):
    letters = "MKTAXYIAKQ"  # an X: its reference is the mean over the 20 residues
    fasta = write_fasta(tmp_path / "q.fasta", {"q": letters, "long": case["seqs"]["long"]})
    out = tmp_path / "maps"
    # auto: an MLM has no pair head, so the Jacobian; 5 copies of 12 tokens per forward pass
    assert _contacts(case["mlm"], fasta, "-o", out, "--tokens-per-batch", "60", "--min-separation", "1") == 0
    npz = np.load(out / "q.npz")
    scores = npz["scores"]
    assert str(npz["score_kind"]) == "jacobian_apc" and np.isfinite(scores).all()
    np.testing.assert_array_equal(scores, scores.T)
    model, *_ = load_encoder(case["mlm"])
    np.testing.assert_allclose(scores, _direct_jacobian_scores(model, letters), rtol=1e-4, atol=1e-5)
    assert len(_tsv(out / "q.tsv")) == len(letters) * (len(letters) - 1) // 2
    long = np.load(out / "long.npz")["scores"]
    assert np.isnan(long[0, 59]) and np.isfinite(long[30, 40]) and np.isfinite(np.diagonal(long)).all()
    # the same map through pmlm.load, and the Jacobian of a PMLM encoder on request
    np.testing.assert_array_equal(pmlm.load(case["mlm"]).contacts(letters).astype(np.float32), scores)
    pair_model = pmlm.load(case["encoder"])
    jac = pair_model.contacts(letters, readout="jacobian")
    np.testing.assert_allclose(jac, _direct_jacobian_scores(pair_model.encoder, letters), rtol=1e-4, atol=1e-5)
    assert not np.allclose(jac, pair_model.contacts(letters))  # auto: the pair read-out


def test_an_imported_esm_encoder_gets_the_jacobian(tmp_path):
    pytest.importorskip("transformers")
    from tiny_models import make_esm2

    source = make_esm2(tmp_path / "esm2_tiny")
    assert main(["import", str(source), "-o", str(tmp_path / "encoder"), "--objective", "mlm"]) == 0
    fasta = write_fasta(tmp_path / "q.fasta", {"q": random_letters(12, seed=2)})
    table = tmp_path / "q.parquet"
    assert _contacts(tmp_path / "encoder", fasta, "-o", table) == 0
    read = pq.read_table(table)
    assert json.loads(read.schema.metadata[b"pmlm"])["score_kind"] == "jacobian_apc"
    assert read.num_rows == (12 - 6) * (12 - 5) // 2 and np.isfinite(read.column("score").to_numpy()).all()


def _snapshot(folder) -> dict:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_outputs_never_destroy(tmp_path, case, capsys, monkeypatch):
    keep = tmp_path / "keep"
    keep.mkdir()
    (keep / "notes.txt").write_text("mine\n")
    assert _contacts(case["encoder"], case["fasta"], "-o", keep) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "did not write (notes.txt)" in err and "--overwrite" in err, err
    assert _snapshot(keep) == {"notes.txt": b"mine\n"}

    # --overwrite: its own files beside the user's, which stay as they were
    assert _contacts(case["encoder"], case["fasta"], "-o", keep, "--overwrite") == 0
    assert (keep / "notes.txt").read_text() == "mine\n" and (keep / MANIFEST).is_file()
    own = sorted(f"{n}.{ext}" for n in case["seqs"] for ext in ("tsv", "npz"))
    assert sorted(p.name for p in keep.iterdir()) == sorted([*own, MANIFEST, "notes.txt"])
    for name in [*own, MANIFEST]:
        assert os.stat(keep / name).st_mode & 0o044 == 0o044, name  # group and others may read

    # its own folder: a rerun needs no --overwrite, and removes its own files it did not write again
    maps = tmp_path / "maps"
    assert _contacts(case["encoder"], case["fasta"], "-o", maps) == 0
    first = next(iter(case["seqs"]))
    fewer = write_fasta(tmp_path / "one.fasta", {first: case["seqs"][first]})
    assert _contacts(case["encoder"], fewer, "-o", maps) == 0
    assert sorted(p.name for p in maps.iterdir()) == sorted([f"{first}.tsv", f"{first}.npz", MANIFEST])
    capsys.readouterr()

    # the working folder, an existing file, a file-like name: refused in one line, nothing changed
    monkeypatch.chdir(keep)
    before = _snapshot(keep)
    notes = keep / "notes.txt"
    for target, message in (
        (".", "is the working folder"),
        (notes, "exists and is a file"),
        (keep / "maps.tsv", "-o DIR writes per-sequence files, -o NAME.parquet one table"),
        (notes.with_suffix(".parquet"), None),
    ):
        if message is None:  # a .parquet name holding something else than Parquet
            target.write_text("not a table\n")
            before = _snapshot(keep)
            message = "exists and is not a .parquet file"
        assert _contacts(case["encoder"], case["fasta"], "-o", target) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and message in err, err
        assert _snapshot(keep) == before


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
    [
        "mlm_no_pair_head",
        "readout_with_head",
        "bad_top",
        "png_in_a_table",
        "other_encoder",
        "unknown_residue",
        "not_contact_head",
        "missing_head",
        "sequence_differs",
    ],
)
def test_bad_input_is_one_line_and_leaves_nothing(tmp_path, case, capsys, problem):
    encoder, fasta, extra = case["encoder"], case["fasta"], []
    if problem == "mlm_no_pair_head":
        encoder, extra = case["mlm"], ["--readout", "pair"]
        expected = f"{encoder}: this encoder has no pair head; --readout jacobian (or auto) reads its token head"
    elif problem == "readout_with_head":
        extra = ["--head", str(case["head"]), "--readout", "jacobian"]
        expected = "--readout jacobian reads the encoder without a head"
    elif problem == "bad_top":
        extra = ["--top", "L/0"]
        expected = "--top 'L/0': expected L, L/K or a number of pairs N"
    elif problem == "png_in_a_table":
        extra = ["--png"]
        expected = "--png writes a PNG per sequence into a folder"
    elif problem == "other_encoder":
        extra = ["--head", str(case["head"])]
        encoder = case["mlm"]
        expected = "the head was fine-tuned on an encoder with sha256"
    elif problem == "unknown_residue":
        fasta = write_fasta(tmp_path / "bad.fasta", {"a": "ACDEFG", "b": "AC*DE"})
        expected = "record 'b': character '*' at position 3"  # named with its file and line (sequences.py)
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
    out = tmp_path / "out" / ("maps.parquet" if problem == "png_in_a_table" else "maps")
    assert main(["contacts", str(encoder), str(fasta), "-o", str(out), "--device", "cpu", *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("pmlm contacts: error: ") and expected in err, err
    if problem == "unknown_residue":
        assert err.startswith(f"pmlm contacts: error: {fasta}:"), err
    assert not out.exists() and (not out.parent.exists() or list(out.parent.iterdir()) == [])
