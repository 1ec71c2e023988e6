"""`pmlm embed`: rows aligned to residues, values equal to the encoder's own forward pass (alone, per layer,
and averaged over overlapping windows for long sequences, a 40,000-residue one too), independent of the token
budget; input as users have it (lowercase, letters outside the alphabet read as X or skipped, counted); bad inputs
give one line naming file and line, exit 2 and no output. And the sequence reader the inference commands share
(pmlm.inference.sequences): the line of a bad letter, the counted repairs, the first pass that keeps only ids."""

from __future__ import annotations

import argparse
import gzip
import json

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch
from conftest import reorder_tolerance
from tiny_models import random_letters, tiny_encoder, write_fasta

from pmlm import alphabet
from pmlm.artefacts import write_head
from pmlm.cli import main
from pmlm.errors import InputError
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
    "problem",
    [
        "unknown_residue",
        "bad_letter_on_a_later_line",
        "not_a_letter_under_x",
        "nucleotide_record",
        "nucleotide_file",
        "short_rna",
        "empty_sequence",
        "duplicate_id",
        "no_weights",
        "a_head_folder",
        "the_sidecar_as_model",
        "bad_sidecar",
        "wrong_weights",
        "layer",
    ],
)
def test_bad_input_is_one_line_and_leaves_nothing(tmp_path, case, capsys, problem):
    fasta, encoder, extra = case["fasta"], case["encoder"], []
    if problem == "unknown_residue":
        fasta = write_fasta(tmp_path / "bad.fasta", {"a": "ACDE", "b": "ACBDE"})
        # the line of the letter (the record's header is line 3)
        expected = f"{fasta}:4: record 'b': character 'B' at position 3 is not a residue letter"
        expected += " (expected ACDEFGHIKLMNPQRSTVWY or X; --unknown x reads letters outside the alphabet as X"
    elif problem == "bad_letter_on_a_later_line":
        fasta = tmp_path / "bad.fasta"
        fasta.write_text(">a\nMKVL\n>b desc\nACDEF\nGHIK\n\nLMJNP\n")
        expected = f"{fasta}:7: record 'b': character 'J' at position 12"
    elif problem == "not_a_letter_under_x":
        fasta = write_fasta(tmp_path / "bad.fasta", {"a": "ACBDE*"})
        extra = ["--unknown", "x"]
        expected = f"{fasta}:2: record 'a': character '*' at position 6 is not a residue letter"
        expected += " (expected ACDEFGHIKLMNPQRSTVWY or X; pmlm ingest normalises sequences)"
    elif problem == "nucleotide_record":
        fasta = write_fasta(tmp_path / "bad.fasta", {"p": "MKVLA", "dna": "ACGTTGCAACGTNNACGTAGGCT"})
        expected = f"{fasta}:3: record 'dna' looks like nucleotides (100% of its 23 letters are A, C, G, T, U or N)"
    elif problem == "nucleotide_file":
        fasta = write_fasta(tmp_path / "bad.fasta", {f"r{k}": "ACGTACGT" for k in range(4)})
        expected = f"{fasta}: looks like nucleotides (100% of its 32 letters are A, C, G, T, U or N)"
    elif problem == "short_rna":
        fasta = write_fasta(tmp_path / "bad.fasta", {"p": "MKVLA", "r": "ACGUACGU"})
        expected = f"{fasta}:3: record 'r' looks like nucleotides (100% of its 8 letters are A, C, G, T, U or N)"
    elif problem == "empty_sequence":
        fasta = tmp_path / "bad.fasta"
        fasta.write_text(">a\nMKV\n>b\n>c\nMKV\n")
        expected = f"{fasta}:3: record 'b' has no residues"
    elif problem == "duplicate_id":
        fasta = write_fasta(tmp_path / "bad.fasta", {"a": "ACDE"})
        fasta.write_text(fasta.read_text() * 2)
        expected = f"{fasta}:3: duplicate id 'a' (first at line 1)"
    elif problem == "no_weights":
        encoder = tmp_path / "nowhere"
        expected = f"{encoder}: no encoder weights here"
    elif problem == "a_head_folder":
        encoder = tmp_path / "heads" / "contact"
        write_head(encoder / "head.safetensors", {"w": torch.zeros(1)}, {"config": {}, "encoder": {}}, case["encoder"])
        expected = (
            f"{encoder}: a fine-tuned head (head.safetensors), not an encoder; a head is used with its encoder: "
            f"pmlm contacts MODEL FASTA --head HEAD, MODEL being the encoder the head records, here {case['encoder']}"
        )
    elif problem == "the_sidecar_as_model":  # model.json itself is the encoder; another JSON file is not
        encoder = case["encoder"].with_name("notes.json")
        encoder.write_text(case["encoder"].with_suffix(".json").read_text())
        expected = (
            f"{encoder}: not encoder weights: MODEL is model.safetensors (with model.json beside it), its folder or "
            "its model.json"
        )
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
    assert "weights_only" not in err and "Traceback" not in err
    assert not out.parent.exists() or list(out.parent.iterdir()) == []


def _embedding(path, seq_id: str) -> np.ndarray:
    table = pd.read_parquet(path)
    return np.stack(table[table["id"] == seq_id]["embedding"].to_list())


def test_lowercase_letters_are_the_same_residues(tmp_path, case):
    fasta = write_fasta(tmp_path / "in.fasta", {"upper": "MKVLACDE", "lower": "mkvlacde", "mixed": "MkVlAcDe"})
    out = tmp_path / "emb.parquet"
    assert main(["embed", str(case["encoder"]), str(fasta), "-o", str(out), "--device", "cpu"]) == 0
    table = pd.read_parquet(out)
    for name in ("lower", "mixed"):
        assert "".join(table[table["id"] == name]["residue"]) == "MKVLACDE"  # the letters the model read
        np.testing.assert_array_equal(_embedding(out, name), _embedding(out, "upper"))


def test_unknown_letters_read_as_x_or_skipped_and_counted(tmp_path, case, capsys):
    fasta = write_fasta(tmp_path / "in.fasta", {"a": "MKBZT", "b": "ACDE", "c": "uUoAC", "ref": "MKXXT"})
    out = tmp_path / "x.parquet"
    argv = ["embed", str(case["encoder"]), str(fasta), "--device", "cpu"]
    assert main([*argv, "-o", str(out), "--unknown", "x"]) == 0
    err = capsys.readouterr().err
    assert "pmlm embed: 5 letters outside the alphabet read as X in 2 sequences\n" in err, err
    table = pd.read_parquet(out)
    assert "".join(table[table["id"] == "a"]["residue"]) == "MKXXT"
    assert "".join(table[table["id"] == "c"]["residue"]) == "XXXAC"
    np.testing.assert_array_equal(_embedding(out, "a"), _embedding(out, "ref"))
    assert json.loads(pq.read_schema(out).metadata[b"pmlm"])["unknown"] == "x"

    skipped = tmp_path / "skip.parquet"
    assert main([*argv, "-o", str(skipped), "--unknown", "skip"]) == 0
    err = capsys.readouterr().err
    assert "pmlm embed: 2 sequences with letters outside the alphabet skipped (5 such letters)\n" in err, err
    assert list(pd.read_parquet(skipped)["id"].unique()) == ["b", "ref"]
    assert list(pd.read_parquet(tmp_path / "skip.per_sequence.parquet")["id"]) == ["b", "ref"]


def test_the_command_offers_the_readers_choices():
    from pmlm.commands.embed import UNKNOWN_CHOICES
    from pmlm.inference import sequences

    assert UNKNOWN_CHOICES == sequences.UNKNOWN_CHOICES


def test_every_command_reading_fasta_offers_the_same_unknown_option():
    """embed, contacts and score take one --unknown: the reader's choices, default error, the same help
    (pmlm.commands.add_unknown)."""
    from pmlm.cli import build_parser
    from pmlm.inference import sequences

    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    options = {}
    for name in ("embed", "contacts", "score"):
        action = next(a for a in commands[name]._actions if "--unknown" in a.option_strings)
        options[name] = (tuple(action.choices), action.default, action.help)
    assert options["embed"] == options["contacts"] == options["score"]
    assert options["embed"][:2] == (sequences.UNKNOWN_CHOICES, "error")


def test_a_40000_residue_protein_is_read_in_windows_with_memory_linear_in_its_length(tmp_path, case):
    """5,000 windows of 16 residues; the values at a few residues are the mean of the windows holding them; the
    Python-side peak (numpy arrays included) stays within a small multiple of L x C (an L x L array of float32
    would be 6.4 GB)."""
    import tracemalloc

    letters = random_letters(40_000, 7)
    fasta = write_fasta(tmp_path / "long.fasta", {"titin_like": letters})
    out = tmp_path / "long.parquet"
    tracemalloc.start()
    try:
        assert main(["embed", str(case["encoder"]), str(fasta), "-o", str(out), "--device", "cpu"]) == 0
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 200 * 40_000 * 16  # about 25 MB; the embeddings themselves are 2.6 MB
    got = _embedding(out, "titin_like")
    assert got.shape == (40_000, 16) and np.isfinite(got).all()
    model, *_ = load_encoder(case["encoder"])
    starts = window_starts(40_000, 16)
    for position in (0, 7, 20_003, 39_999):
        held = [s for s in starts if s <= position < s + 16]
        want = np.mean([_alone(model, letters[s : s + 16])[position - s].numpy() for s in held], axis=0)
        np.testing.assert_allclose(got[position], want, rtol=0, atol=reorder_tolerance(torch.from_numpy(want), 16 * 18))


# -- the sequences the inference commands read (pmlm.inference.sequences) -----------------------------------------


def test_the_line_of_a_letter_is_found_as_the_parser_joins_lines(tmp_path):
    from pmlm.data.fasta import sequence_line

    text = ">a\nMK V\n\nLL\r\n>b\nQQ\n"
    plain = tmp_path / "a.fasta"
    plain.write_text(text)
    packed = tmp_path / "a.fasta.gz"
    packed.write_bytes(gzip.compress(text.encode()))
    for path in (plain, packed):
        # residues M K V (line 2), L L (line 4); the next record's header ends the search
        assert [sequence_line(path, 1, k) for k in range(1, 6)] == [2, 2, 2, 4, 4]
        assert sequence_line(path, 1, 6) == 1
        assert sequence_line(path, 5, 2) == 6


def test_check_and_repair_report_counts(tmp_path):
    from pmlm.inference.sequences import SequenceReport, check_fasta, read_fasta_sequences

    fasta = tmp_path / "in.fasta"
    fasta.write_text(">a\nMKB\nzt\n>b\nacde\n>c\nOOO\n")
    report = check_fasta(fasta, unknown="x")
    assert report == SequenceReport(
        sequences=3, residues=12, lowercase_sequences=2, unknown_letters=5, unknown_sequences=2
    )
    assert report.repairs() == ["5 letters outside the alphabet read as X in 2 sequences"]
    records = read_fasta_sequences(fasta, unknown="x")
    assert [r.letters for r in records] == ["MKXXT", "ACDE", "XXX"]
    assert records[0].residues.tolist() == [alphabet.TOKEN_TO_ID[c] for c in "MKXXT"]
    skipped = SequenceReport()
    assert [r.id for r in read_fasta_sequences(fasta, unknown="skip", report=skipped)] == ["b"]
    assert (skipped.sequences, skipped.skipped_sequences, skipped.skipped_letters) == (1, 2, 5)
    assert check_fasta(tmp_path / "in.fasta", unknown="skip").as_dict()["skipped_sequences"] == 2
    with pytest.raises(InputError, match=r"in\.fasta:2: record 'a': character 'B' at position 3 .*pmlm ingest"):
        read_fasta_sequences(fasta)  # the existing callers' form: errors, naming pmlm ingest
    fasta.write_text(">a\nMKV\nczt\n")
    with pytest.raises(InputError, match=r"in\.fasta:3: record 'a': character 'z' at position 5 "):
        read_fasta_sequences(fasta)  # the letter as written, on its line


def test_the_first_pass_streams_keeping_only_ids(tmp_path):
    """30,000 records: checking them holds the ids, not the records (tracemalloc's peaks: deterministic, about 4.5 MB
    against 17 MB for the list), so a first pass over 10^5 records holds their ids only."""
    import tracemalloc

    from pmlm.inference.sequences import check_fasta, read_fasta_sequences

    fasta = tmp_path / "many.fasta"
    rng = np.random.default_rng(0)
    letters = np.frombuffer(alphabet.RESIDUES.encode(), dtype=np.uint8)[rng.integers(20, size=(30_000, 60))]
    with open(fasta, "w") as fh:
        for k, row in enumerate(letters):
            fh.write(f">s{k}\n{row.tobytes().decode()}\n")
    peaks = []
    for read in (check_fasta, read_fasta_sequences):
        tracemalloc.start()
        try:
            result = read(fasta)
            peaks.append(tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()
        del result
    assert peaks[0] < peaks[1] / 2, peaks
