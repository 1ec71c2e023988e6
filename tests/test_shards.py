"""Parquet shards: schema, cluster-to-shard assignment, manifest checksums, determinism, bad input."""

import json
import os
import random
import zlib

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from pmlm import alphabet
from pmlm.artefacts import read_manifest as load_manifest
from pmlm.cli import main
from pmlm.data.shards import tokenize
from pmlm.errors import InputError
from pmlm.files import file_digest


def make_split_fasta(path, n, seed, clusters=20):
    rng = random.Random(seed)
    with open(path, "w") as fh:
        for i in range(n):
            seq = "".join(rng.choice(alphabet.RESIDUES + "X") for _ in range(rng.randint(5, 300)))
            fh.write(f">seq{seed}_{i} cluster=c{i % clusters}\n{seq}\n")
    return str(path)


@pytest.fixture
def shards(tmp_path):
    train = make_split_fasta(tmp_path / "train.fasta", 500, seed=1)
    valid = make_split_fasta(tmp_path / "valid.fasta", 40, seed=2, clusters=3)
    out = tmp_path / "shards"
    manifest = tokenize({"train": [train], "valid": [valid]}, str(out), num_shards=4, row_group_size=64)
    return out, manifest, train


def test_layout_schema_and_pandas(shards):
    out, manifest, train = shards
    assert sorted(os.listdir(out / "train")) == [f"part-{i:05d}-of-00004.parquet" for i in range(4)]
    df = pd.read_parquet(out / "train")
    assert list(df.columns) == ["id", "cluster_id", "length", "tokens", "members", "taxon_id", "family"]
    assert df["members"].isna().all() and df["family"].isna().all()  # plain FASTA carries no annotations
    assert len(df) == 500 == manifest["splits"]["train"]["rows"]
    first = df.set_index("id").loc["seq1_0"]
    with open(train) as fh:
        fh.readline()
        seq = fh.readline().strip()
    assert first["length"] == len(seq)
    assert alphabet.decode(first["tokens"]) == seq
    assert pq.ParquetFile(out / "train" / "part-00000-of-00004.parquet").schema_arrow.field("tokens").type == "binary"
    assert np.frombuffer(first["tokens"], np.uint8).tolist() == alphabet.encode(seq).tolist()


def test_cluster_members_share_a_shard(shards):
    out, manifest, _ = shards
    for i in range(4):
        df = pd.read_parquet(out / "train" / f"part-{i:05d}-of-00004.parquet")
        # the manifest's rule, crc32(cluster_id) % num_shards, stable across processes (never Python's salted hash)
        assert all(zlib.crc32(c.encode()) % 4 == i for c in df["cluster_id"])
    assert manifest["splits"]["train"]["clusters"] == 20 and manifest["splits"]["train"]["clusters_from_header"] == 500


def test_row_groups_and_manifest(shards):
    out, manifest, _ = shards
    total_groups = 0
    for entry in manifest["splits"]["train"]["files"]:
        path = out / entry["path"]
        assert file_digest(path) == entry["sha256"]
        meta = pq.ParquetFile(path).metadata
        assert meta.num_rows == entry["rows"]
        assert all(meta.row_group(g).num_rows <= 64 for g in range(meta.num_row_groups))
        total_groups += meta.num_row_groups
    assert total_groups >= 500 // 64
    assert sum(manifest["splits"]["train"]["length_histogram"]) == 500
    counted = sum(manifest["splits"]["train"]["residue_counts"].values())
    assert counted == manifest["splits"]["train"]["residues"]
    assert load_manifest(out)["num_shards"] == 4


def test_rerun_is_byte_identical(shards, tmp_path):
    _out, manifest, train = shards
    again = tokenize({"train": [train]}, str(tmp_path / "again"), num_shards=4, row_group_size=64)
    assert [f["sha256"] for f in again["splits"]["train"]["files"]] == [
        f["sha256"] for f in manifest["splits"]["train"]["files"]
    ]


def test_unnormalised_input_fails_cleanly(tmp_path, capsys):
    src = tmp_path / "bad.fasta"
    src.write_text(">a cluster=c\nMKV\n>b cluster=c\nMKbV\n")
    with pytest.raises(InputError, match=r"bad\.fasta:3: record 'b': character 'b' at residue 3"):
        tokenize({"train": [str(src)]}, str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()
    assert [p for p in os.listdir(tmp_path) if p != "bad.fasta"] == []
    rc = main(["tokenize", "--input", f"train={src}", "--out-dir", str(tmp_path / "out")])
    assert rc == 2 and "bad.fasta:3" in capsys.readouterr().err


def test_headers_without_cluster_use_the_id(tmp_path):
    src = tmp_path / "plain.fasta"
    src.write_text(">a\nMKV\n>b\nWW\n")
    manifest = tokenize({"train": [str(src)]}, str(tmp_path / "out"), num_shards=2)
    df = pd.read_parquet(tmp_path / "out" / "train")
    assert sorted(df["cluster_id"]) == ["a", "b"] and manifest["splits"]["train"]["clusters_from_header"] == 0
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["format"] == "pmlm-shards/2"


def test_outputs_get_the_usual_file_mode(tmp_path):
    """Atomic outputs start as private temporaries; the committed file must not stay owner-only."""
    import torch
    from safetensors.torch import save_file

    from pmlm.files import atomic_output
    from pmlm.outputs import writing_folder

    umask = os.umask(0o022)
    try:
        with atomic_output(tmp_path / "w.safetensors") as tmp:
            save_file({"x": torch.zeros(2)}, tmp)
        with writing_folder(tmp_path / "d", command="pmlm demo") as staged:
            (staged / "sub").mkdir()
            (staged / "sub" / "f").write_text("x")
    finally:
        os.umask(umask)
    assert (tmp_path / "w.safetensors").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "d").stat().st_mode & 0o777 == 0o755
    assert (tmp_path / "d" / "sub").stat().st_mode & 0o777 == 0o755
    assert (tmp_path / "d" / "sub" / "f").stat().st_mode & 0o777 == 0o644


def test_source_annotations_become_columns(tmp_path):
    src = tmp_path / "train.fasta"
    src.write_text(
        ">u1 members=3 taxon=10492 cluster=u1\nMKV\n>p1/2-9 family=PF00085.19 cluster=u1\nACD\n"
        ">x cluster=x\nKK\n>y\nGG\n"
    )
    tokenize({"train": [str(src)]}, str(tmp_path / "out"), num_shards=1)
    df = pd.read_parquet(tmp_path / "out" / "train").set_index("id")
    assert df.loc["u1", "members"] == 3 and df.loc["u1", "taxon_id"] == 10492 and pd.isna(df.loc["u1", "family"])
    assert df.loc["p1/2-9", "family"] == "PF00085.19" and df.loc["p1/2-9", "cluster_id"] == "u1"
    assert df[["members", "taxon_id", "family"]].loc[["x", "y"]].isna().all().all()
    manifest = load_manifest(tmp_path / "out")
    assert manifest["splits"]["train"]["clusters"] == 3 and manifest["splits"]["train"]["clusters_from_header"] == 3
    assert set(manifest["schema"]) == {"id", "cluster_id", "length", "tokens", "members", "taxon_id", "family"}
