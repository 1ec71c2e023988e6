"""Structure split by sequence identity, checked with an independent MMseqs2 search."""

import gzip
import json
import os
import random
import shutil
import subprocess

import pytest

from pmlm.cli import main
from pmlm.data.split import SplitConfig
from pmlm.data.structsplit import split_structures
from pmlm.errors import ConfigError

if shutil.which("mmseqs") is None:
    if os.environ.get("CI"):
        raise RuntimeError("mmseqs not on PATH in CI: scripts/setup.sh should have installed it")
    pytest.skip("MMseqs2 (mmseqs) is not installed; run scripts/setup.sh", allow_module_level=True)

AA = "ACDEFGHIKLMNPQRSTVWY"


@pytest.fixture(scope="module")
def structures(tmp_path_factory):
    """20 families x 4 chains at ~75 % identity to their ancestor, each with (fake) coordinates."""
    rng = random.Random(5)
    path = tmp_path_factory.mktemp("st") / "chains.jsonl.gz"
    with gzip.open(path, "wt") as fh:
        for f in range(20):
            anc = "".join(rng.choice(AA) for _ in range(rng.randint(60, 140)))
            for m in range(4):
                seq = "".join(rng.choice(AA) if rng.random() < 0.25 else c for c in anc)
                xyz = [[3.8 * k, 0.0, 0.0] for k in range(len(seq))]
                fh.write(
                    json.dumps(
                        {
                            "id": f"F{f}",
                            "chain": chr(65 + m),
                            "start_resnum": 1,
                            "seq": seq,
                            "dssp": "C" * len(seq),
                            "ca": xyz,
                            "cb": xyz,
                        }
                    )
                    + "\n"
                )
    return str(path)


def sequences(path):
    with open(path) as fh:
        return [json.loads(line) for line in fh]


CFG = SplitConfig(method="cluster", min_seq_id=0.3, coverage=0.5, seed=2, threads=2, valid_fraction=0.0)


@pytest.fixture(scope="module")
def split_once(structures, tmp_path_factory):
    out = tmp_path_factory.mktemp("split")
    return out, split_structures(structures, str(out), CFG, (0.6, 0.2, 0.2))


def test_families_stay_together_and_held_out_chains_are_far_from_train(split_once, tmp_path):
    out, stats = split_once
    sides = {name: sequences(out / f"{name}.jsonl") for name in ("train", "valid", "test")}
    family_side = {}
    for name, recs in sides.items():
        for r in recs:
            family_side.setdefault(r["id"], set()).add(name)
    assert all(len(s) == 1 for s in family_side.values()), family_side
    assert sum(len(r) for r in sides.values()) + sum(stats["dropped_similar_to_train"].values()) == 80
    assert all(stats[n]["chains"] > 0 for n in sides)
    # independent check of the guarantee: no held-out chain >= 30 % identical to a training chain (one search of
    # the valid and test chains against the training chains)
    with open(tmp_path / "held_out.fa", "w") as fh:
        fh.writelines(f">{name}{i}\n{r['seq']}\n" for name in ("valid", "test") for i, r in enumerate(sides[name]))
    with open(tmp_path / "train.fa", "w") as fh:
        fh.writelines(f">{i}\n{r['seq']}\n" for i, r in enumerate(sides["train"]))
    hits = tmp_path / "held_out.m8"
    subprocess.run(
        [
            "mmseqs",
            "easy-search",
            str(tmp_path / "held_out.fa"),
            str(tmp_path / "train.fa"),
            str(hits),
            str(tmp_path / "tmp"),
            "--min-seq-id",
            "0.3",
            "-c",
            "0.5",
            "-v",
            "1",
        ],
        check=True,
    )
    assert hits.read_text().strip() == ""


def test_deterministic_and_lines_copied_verbatim(structures, split_once, tmp_path):
    out, _ = split_once
    split_structures(structures, str(tmp_path), CFG, (0.6, 0.2, 0.2))
    for name in ("train", "valid", "test"):
        assert (tmp_path / f"{name}.jsonl").read_bytes() == (out / f"{name}.jsonl").read_bytes()
    with gzip.open(structures, "rt") as fh:
        originals = {line.rstrip("\n") for line in fh}
    assert set((out / "train.jsonl").read_text().splitlines()) <= originals


def test_bad_fractions_and_cli(structures, tmp_path, capsys):
    with pytest.raises(ConfigError, match="fractions"):
        split_structures(structures, str(tmp_path), SplitConfig(valid_fraction=0.0), (0.5, 0.5, 0.5))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "x"}\nnot json\n')
    rc = main(["split-structures", str(bad), "--out-dir", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "bad.jsonl:1" in err[0]
