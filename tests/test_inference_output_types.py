"""The inference outputs as types (pmlm.inference.output_types): one per output of the vocabulary, the files each is
gathered into and the rows a record gets there, the flags each shard command takes, and the pairs contacts keeps."""

from __future__ import annotations

from pathlib import Path

from pmlm.inference.output_types import OUTPUTS, held_pairs
from pmlm.vocabulary import INFERENCE_OUTPUTS, OUTPUT_CONTACTS, OUTPUT_EMBEDDINGS, OUTPUT_SUBSTITUTIONS


def test_one_type_per_output_and_the_files_each_is_gathered_into():
    assert tuple(OUTPUTS) == INFERENCE_OUTPUTS
    assert {name: o.command for name, o in OUTPUTS.items()} == {
        OUTPUT_EMBEDDINGS: "embed", OUTPUT_SUBSTITUTIONS: "score", OUTPUT_CONTACTS: "contacts"
    }  # fmt: skip
    embeddings, contacts = OUTPUTS[OUTPUT_EMBEDDINGS], OUTPUTS[OUTPUT_CONTACTS]
    assert embeddings.gathered_paths("out/all.parquet") == [
        Path("out/all.parquet"),
        Path("out/all.per_sequence.parquet"),
    ]
    assert contacts.gathered_paths("all") == [Path("all.parquet")]
    # a record of 7 residues: 7 rows per residue, one per sequence; contacts and substitutions: any number, in order
    assert [t.rows_of(7) for t in embeddings.tables] == [7, 1] and contacts.tables[0].rows_of is None


def test_each_shard_command_takes_its_own_settings():
    section = {"layer": -1, "unknown": "x", "marginal": "masked", "contacts": {"top": "all", "min_separation": 6}}
    assert OUTPUTS[OUTPUT_EMBEDDINGS].shard_settings(section) == {"layer": -1, "unknown": "x"}
    assert OUTPUTS[OUTPUT_SUBSTITUTIONS].shard_settings(section) == {"marginal": "masked"}
    assert OUTPUTS[OUTPUT_CONTACTS].shard_settings(section) == {"min_separation": 6}  # all: the command's default
    section["contacts"]["top"] = "L/5"
    assert OUTPUTS[OUTPUT_CONTACTS].shard_settings(section) == {"top": "L/5", "min_separation": 6}


def test_the_pairs_the_windows_hold():
    # one window: i < j, j - i >= 6 among 10 residues: 4 + 3 + 2 + 1
    assert held_pairs(10, 10, 6) == 10
    # windows [0, 10) and [5, 15): residues 0-4 reach 9, residues 5-8 reach 14
    assert held_pairs(15, 10, 6) == (4 + 3 + 2 + 1 + 0) + (4 + 3 + 2 + 1)
    assert held_pairs(5, 10, 6) == 0
