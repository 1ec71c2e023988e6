"""MMseqs2 clustering, decontamination and the cluster-level split, with the real mmseqs binary."""

import gzip
import json
import os
import random
import shutil

import pytest

from pmlm.data.fasta import read_fasta
from pmlm.data.split import SplitConfig, split
from pmlm.errors import ConfigError

if shutil.which("mmseqs") is None:
    if os.environ.get("CI"):
        raise RuntimeError("mmseqs not on PATH in CI: scripts/setup.sh should have installed it")
    pytest.skip("MMseqs2 (mmseqs) is not installed; run scripts/setup.sh", allow_module_level=True)

AA = "ACDEFGHIKLMNPQRSTVWY"


def mutate(seq, rate, rng):
    return "".join(rng.choice(AA) if rng.random() < rate else c for c in seq)


@pytest.fixture(scope="module")
def families(tmp_path_factory):
    """30 families of 6 members each at ~90 % identity to their ancestor; families unrelated."""
    rng = random.Random(7)
    path = tmp_path_factory.mktemp("fam") / "clean.fasta"
    ancestors = ["".join(rng.choice(AA) for _ in range(rng.randint(80, 200))) for _ in range(30)]
    with open(path, "w") as fh:
        for f, anc in enumerate(ancestors):
            for m in range(6):
                # UniProt-style ids: MMseqs2 would rewrite these if it saw them
                fh.write(f">tr|F{f}M{m}|F{f}M{m}_HUMAN\n{mutate(anc, 0.05, rng)}\n")
    return str(path), ancestors


def family_of(record_id):
    return record_id.split("|")[1].split("M")[0]


def test_clusters_respect_families_and_split_is_cluster_level(families, tmp_path):
    path, _ = families
    stats = split(path, str(tmp_path), SplitConfig(valid_fraction=0.2, seed=3, threads=2))
    sides = {}
    for side in ("train", "valid"):
        for rec in read_fasta(tmp_path / f"{side}.fasta"):
            cluster = rec.title.split("cluster=")[1]
            assert family_of(cluster) == family_of(rec.id)  # no cluster mixes families
            sides.setdefault(cluster, set()).add(side)
    assert all(len(s) == 1 for s in sides.values())  # no cluster on both sides
    assert stats["sequences_in"] == 180 and stats["train"]["sequences"] + stats["valid"]["sequences"] == 180
    assert 0 < stats["valid"]["clusters"] < stats["clusters"]
    assert json.loads((tmp_path / "split_stats.json").read_text())["clusters"] == stats["clusters"]


def test_split_is_deterministic_and_seed_dependent(families, tmp_path):
    path, _ = families
    a = split(path, str(tmp_path / "a"), SplitConfig(valid_fraction=0.3, seed=1))
    b = split(path, str(tmp_path / "b"), SplitConfig(valid_fraction=0.3, seed=1))
    split(path, str(tmp_path / "c"), SplitConfig(valid_fraction=0.3, seed=2))

    def read(d):
        return (tmp_path / d / "valid.fasta").read_text()

    assert read("a") == read("b") and a["valid"] == b["valid"]
    assert read("a") != read("c")


def test_decontamination_removes_similar_training_sequences(families, tmp_path):
    path, ancestors = families
    rng = random.Random(11)
    refs = tmp_path / "eval.jsonl.gz"
    with gzip.open(refs, "wt") as fh:  # structure-JSONL evaluation set: two families' ancestors, lightly mutated
        for f in (4, 17):
            fh.write(json.dumps({"id": f"E{f}", "seq": mutate(ancestors[f], 0.1, rng)}) + "\n")
    stats = split(
        path, str(tmp_path / "out"), SplitConfig(valid_fraction=0.1, decontam_min_seq_id=0.5), references=[str(refs)]
    )
    assert stats["decontamination"]["removed_sequences"] == 12
    kept = [r.id for side in ("train", "valid") for r in read_fasta(tmp_path / "out" / f"{side}.fasta")]
    assert len(kept) == 168 and not any(family_of(k) in ("F4", "F17") for k in kept)


def test_config_validation():
    with pytest.raises(ConfigError, match="min_seq_id"):
        SplitConfig(min_seq_id=50)
    with pytest.raises(ConfigError, match="method"):
        SplitConfig(method="cdhit")
    with pytest.raises(ConfigError, match="not found on PATH"):
        split(__file__, "/tmp/never", SplitConfig(mmseqs="mmseqs-does-not-exist"))
