"""`pmlm score --saturation`: every substitution of every sequence, equal to `pmlm score`'s singles (masked
marginal) and to one unmasked forward pass by hand (wild-type marginal), across windows, padding and batch sizes;
the Parquet and TSV outputs, their columns and settings; input read as it comes; one-line refusals with nothing
written."""

from __future__ import annotations

import csv
import json

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from tiny_models import random_letters, tiny_encoder, write_fasta

from pmlm import alphabet
from pmlm.cli import main
from pmlm.files import file_digest
from pmlm.inference.saturation import saturation_scores
from pmlm.pretrained import load_encoder
from pmlm.tokens import batch_tokens, window_starts
from pmlm.version import __version__

# Saturation and `pmlm score` read a site through the same masked row and read-out; only the batching differs
# (rows per pass, shorter rows padded, the padding masked), which changes the order of the fp32 sums in the
# matmuls and attention. The logits (size ~10-100) then agree to a few fp32 ulps (2**-17 = 7.6e-6 at 100) and
# log P(mut) - log P(wt) to a few times that; the saturation score is also rounded to float32 (half an ulp of a
# score below 100: 3.8e-6). 1e-4 is over ten such ulps.
ATOL = 1e-4
WINDOW = 16  # residues of the tiny encoders' window (max_len 18)

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    """Tiny encoders and three sequences: one longer than the window, two shorter (so batches mix row widths),
    one with an X."""
    root = tmp_path_factory.mktemp("saturation")
    records = {
        "long": random_letters(40, seed=9),
        "short": random_letters(9, seed=3),
        "mid": random_letters(14, seed=5),
    }
    records["mid"] = records["mid"][:6] + "X" + records["mid"][7:]
    return {
        "root": root,
        "records": records,
        "fasta": write_fasta(root / "all.fasta", records),
        "pmlm": tiny_encoder(root / "pmlm" / "model.safetensors"),
        "pair_only": tiny_encoder(root / "pair_only" / "model.safetensors", objective="pmlm_pair_only", seed=3),
    }


def _saturate(case, encoder, out, *extra) -> int:
    return main(["score", str(case[encoder]), "--saturation", "--sequence", str(case["fasta"]), "-o", str(out), *extra])


def _tsv(path) -> list[dict]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh, delimiter="\t"))


@pytest.mark.parametrize("encoder", ["pmlm", "pair_only"])
def test_masked_saturation_equals_pmlm_score_singles(tmp_path, case, encoder):
    """19 rows per known residue in file order; each score equal to `pmlm score`'s single of the same mutant, for a
    sequence longer than the window too, with batches that mix padded rows of different sequences."""
    out = tmp_path / "sat.parquet"
    assert _saturate(case, encoder, out, "--tokens-per-batch", "100") == 0
    table = pq.read_table(out).to_pylist()
    records = case["records"]
    expected = [
        (seq_id, f"{wt}{p + 1}{mut}", p + 1, wt, mut)
        for seq_id, letters in records.items()
        for p, wt in enumerate(letters)
        if wt != "X"
        for mut in alphabet.RESIDUES
        if mut != wt
    ]
    assert [(r["id"], r["mutant"], r["position"], r["wt"], r["mut"]) for r in table] == expected
    for seq_id, letters in records.items():
        fasta = write_fasta(tmp_path / f"{seq_id}.fasta", {seq_id: letters})
        rows = [r for r in table if r["id"] == seq_id]
        chosen = rows[:: max(1, len(rows) // 60)]  # some of every site's mutants, the first and last sites among them
        chosen = [*chosen, rows[-1]]
        csv_path = tmp_path / f"{seq_id}.csv"
        csv_path.write_text("mutant\n" + "".join(f"{r['mutant']}\n" for r in chosen))
        scores = tmp_path / f"{seq_id}.tsv"
        assert (
            main(
                ["score", str(case[encoder]), "--sequence", str(fasta), "--mutations", str(csv_path), "-o", str(scores)]
            )
            == 0
        )
        singles = {r["mutant"]: float(r["score"]) for r in _tsv(scores)}
        got = np.array([r["score"] for r in chosen])
        want = np.array([singles[r["mutant"]] for r in chosen])
        assert np.abs(got - want).max() <= ATOL, (seq_id, np.abs(got - want).max())


def test_wildtype_marginal_is_one_unmasked_pass_per_window(tmp_path, case):
    """Every site of every sequence from one unmasked forward pass, by hand: log P(mut) - log P(wt) of the token
    head's softmax, a long sequence's site from the window of pmlm.tokens.window_starts in which it is most
    central."""
    out = tmp_path / "sat.tsv"
    assert _saturate(case, "pmlm", out, "--marginal", "wildtype", "--tokens-per-batch", "40") == 0
    rows = _tsv(out)
    model, _, _ = load_encoder(case["pmlm"], "cpu")
    for seq_id, letters in case["records"].items():
        residues = alphabet.encode(letters)
        starts = window_starts(len(letters), WINDOW)
        centres = [s + (min(WINDOW, len(letters) - s) - 1) / 2 for s in starts]
        by_hand = {}
        for p, wt in enumerate(letters):
            if wt == "X":
                continue
            start = starts[int(np.argmin([abs(p - c) for c in centres]))]
            tokens = torch.from_numpy(batch_tokens([residues], [start], max_residues=WINDOW).tokens)
            with torch.no_grad():
                log_p = torch.log_softmax(model(tokens)["logits"][0, p - start + 1].double(), dim=-1)
            for k, mut in enumerate(alphabet.RESIDUES):
                if mut != wt:
                    by_hand[f"{wt}{p + 1}{mut}"] = float(log_p[k] - log_p[alphabet.RESIDUES.index(wt)])
        got = {r["mutant"]: float(r["score"]) for r in rows if r["id"] == seq_id}
        assert got.keys() == by_hand.keys()
        assert max(abs(got[m] - by_hand[m]) for m in got) <= ATOL
    assert len(window_starts(len(case["records"]["long"]), WINDOW)) == 4  # the long sequence took several windows


def test_parquet_settings_and_the_tsv_hold_the_same_values(tmp_path, case, capsys):
    parquet, tsv = tmp_path / "sat.parquet", tmp_path / "sat.tsv"
    assert _saturate(case, "pmlm", parquet) == 0
    err = capsys.readouterr().err
    assert "pmlm score: 3/3 sequences (100%)" in err  # the progress line
    assert "pmlm score: 3 sequences, 63 residues, 1,178 substitutions (masked marginal, fp32)" in err
    assert _saturate(case, "pmlm", tsv) == 0
    table = pq.read_table(parquet)
    assert [(f.name, str(f.type)) for f in table.schema] == [
        ("id", "string"),
        ("mutant", "string"),
        ("position", "int32"),
        ("wt", "string"),
        ("mut", "string"),
        ("score", "float"),
    ]
    settings = json.loads(table.schema.metadata[b"pmlm"])
    assert settings == {
        "model": str(case["pmlm"]),
        "model_sha256": file_digest(case["pmlm"]),
        "objective": "pmlm",
        "window": WINDOW,
        "marginal": "masked",
        "precision": "fp32",
        "unknown": "error",
        "pmlm_version": __version__,
    }
    rows = _tsv(tsv)
    assert list(rows[0]) == table.column_names
    assert [(r["id"], r["mutant"], int(r["position"])) for r in rows] == [
        (r["id"], r["mutant"], r["position"]) for r in table.to_pylist()
    ]
    # the TSV writes the float32 value exactly: read back as float64 it is the Parquet value
    assert [float(r["score"]) for r in rows] == table.column("score").to_numpy().astype(np.float64).tolist()


def test_sequences_are_read_as_the_scores_are_written(case):
    """The engine takes its sequences a chunk at a time: the first scores come before the last sequence is read
    (here a chunk is one sequence: 16 tokens per batch x 16 batches is less than any sequence's rows)."""
    model, _, _ = load_encoder(case["pmlm"], "cpu")
    pulled = []

    def sequences():
        for letters in case["records"].values():
            pulled.append(letters)
            yield alphabet.encode(letters)

    scores = saturation_scores(model, sequences(), tokens_per_batch=16)
    k, values = next(scores)
    assert k == 0 and values.shape == (40, 20) and len(pulled) == 1
    assert [k for k, _ in scores] == [1, 2] and len(pulled) == 3


def test_unknown_letters_read_as_x_or_skipped_and_counted(tmp_path, case, capsys):
    """--unknown as pmlm embed's: x reads B and Z as X (no rows at them; the other sites score as with X written
    out), skip leaves the record out; either is counted on stderr and recorded in the settings."""
    fasta = write_fasta(tmp_path / "in.fasta", {"a": "MKBZTACDE", "b": "ACDEFG"})
    written = write_fasta(tmp_path / "ref.fasta", {"a": "MKXXTACDE", "b": "ACDEFG"})
    argv = ["score", str(case["pmlm"]), "--saturation", "-o"]
    assert main([*argv, str(tmp_path / "ref.parquet"), "--sequence", str(written)]) == 0
    assert main([*argv, str(tmp_path / "x.parquet"), "--sequence", str(fasta), "--unknown", "x"]) == 0
    err = capsys.readouterr().err
    assert "pmlm score: 2 letters outside the alphabet read as X in 1 sequence\n" in err, err
    got, ref = pq.read_table(tmp_path / "x.parquet"), pq.read_table(tmp_path / "ref.parquet")
    assert got.drop(["score"]).equals(ref.drop(["score"])) and got.num_rows == (7 + 6) * 19
    np.testing.assert_array_equal(got.column("score").to_numpy(), ref.column("score").to_numpy())
    assert json.loads(got.schema.metadata[b"pmlm"])["unknown"] == "x"
    assert main([*argv, str(tmp_path / "skip.tsv"), "--sequence", str(fasta), "--unknown", "skip"]) == 0
    err = capsys.readouterr().err
    assert "pmlm score: 1 sequence with letters outside the alphabet skipped (2 such letters)\n" in err, err
    assert {r["id"] for r in _tsv(tmp_path / "skip.tsv")} == {"b"}
    assert main([*argv, str(tmp_path / "error.tsv"), "--sequence", str(fasta)]) == 2
    err = capsys.readouterr().err
    assert f"{fasta}:2: record 'a': character 'B' at position 3" in err and "--unknown x reads" in err, err


@pytest.mark.parametrize("problem", ["duplicate_id", "empty_sequence", "not_a_residue", "with_mutations", "fasta_out"])
def test_bad_input_is_one_line_and_leaves_nothing(tmp_path, case, capsys, problem):
    fasta = tmp_path / "in.fasta"
    out, extra = tmp_path / "out" / "sat.parquet", []
    if problem == "duplicate_id":
        fasta.write_text(">a\nACDE\n>b\nKLM\n>a\nPQ\n")
        expected = f"{fasta}:5: duplicate id 'a' (first at line 1)"
    elif problem == "empty_sequence":
        fasta.write_text(">a\nACDE\n>b\n>c\nKLM\n")
        expected = f"{fasta}:3: record 'b' has no residues"
    elif problem == "not_a_residue":
        fasta.write_text(">a\nACDE\n>b\nKL*M\n")
        expected = f"{fasta}:4: "
    elif problem == "with_mutations":
        fasta.write_text(">a\nACDE\n")
        extra = ["--mutations", str(tmp_path / "m.csv")]
        expected = "--saturation scores every substitution: give --mutations or --saturation, not both"
    else:
        fasta.write_text(">a\nACDE\n")
        out = tmp_path / "out" / "sat.fasta"
        expected = f"-o {out}: the saturation scores is written as .parquet or .tsv; name it so"
    rc = main(["score", str(case["pmlm"]), "--saturation", "--sequence", str(fasta), "-o", str(out), *extra])
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"pmlm score: error: {expected}"), err
    assert not out.parent.exists()
