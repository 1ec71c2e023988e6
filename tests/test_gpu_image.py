"""The commands a bare GPU image runs (`python -m pmlm pretrain`, `finetune`, `evaluate`) work without the
data stage's Biopython and Snakemake, which such images lack: run here with those imports blocked."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import yaml
from tiny_models import recipe, write_structures

# `python -m pmlm ...` with every import of Bio* / snakemake* failing, as on an image without them
BLOCKED_RUNNER = textwrap.dedent(
    """
    import importlib.abc, runpy, sys

    class Absent(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("Bio", "snakemake"):
                raise ModuleNotFoundError(f"No module named {name!r} (blocked: not on the GPU image)")
            return None

    sys.meta_path.insert(0, Absent())
    sys.argv = ["pmlm", *sys.argv[1:]]
    runpy.run_module("pmlm", run_name="__main__")
    """
)


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    runner = tmp_path / "blocked_runner.py"
    runner.write_text(BLOCKED_RUNNER)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, str(runner), *args], capture_output=True, text=True, timeout=300, env=env)


def test_the_blocker_blocks(tmp_path):
    """Reading PDB coordinates needs Biopython (ingest and tokenize no longer do: their FASTA reader is our own)."""
    (tmp_path / "chains.txt").write_text("1abcA\n")
    (tmp_path / "pdb").mkdir()
    (tmp_path / "pdb" / "1abc.pdb").write_text("ATOM\n")
    done = _run(
        tmp_path,
        "contacts-from-pdb",
        "--chains",
        str(tmp_path / "chains.txt"),
        "--pdb-dir",
        str(tmp_path / "pdb"),
        "-o",
        str(tmp_path / "contacts.jsonl"),
    )
    assert done.returncode != 0 and "blocked: not on the GPU image" in done.stderr


def test_pretrain_finetune_evaluate_run_without_biopython_and_snakemake(tmp_path, shard_dir):
    train_cfg = tmp_path / "pretrain.yaml"
    train_cfg.write_text(
        yaml.safe_dump(
            {
                "model": {
                    "preset": "tiny",
                    "overrides": {"num_layers": 1, "hidden": 32, "ffn": 64, "heads": 2, "max_len": 64},
                },
                "optim": {"lr": 1e-3, "warmup_steps": 1, "total_steps": 2},
                "tokens_per_step": 512,
                "data": {"buffer_rows": 64, "num_workers": 0},
                "eval_batches": 1,
                "save_every": 0,
                "tensorboard": False,
                "device": "cpu",
            }
        )
    )
    encoder = tmp_path / "pretrain" / "model.safetensors"
    done = _run(
        tmp_path,
        "pretrain",
        "--config",
        str(train_cfg),
        "--shards",
        str(shard_dir),
        "--out",
        str(tmp_path / "pretrain-run"),
        "--final",
        str(encoder),
    )
    assert done.returncode == 0, done.stderr[-2000:]

    structures = write_structures(tmp_path / "structures.jsonl", 8, seed=1)
    ft_cfg = tmp_path / "contact.yaml"
    ft_cfg.write_text(yaml.safe_dump(recipe(optim__total_steps=2)))
    head = tmp_path / "finetune" / "head.safetensors"
    done = _run(
        tmp_path,
        "finetune",
        "--config",
        str(ft_cfg),
        "--encoder",
        str(encoder),
        "--train",
        str(structures),
        "--out",
        str(tmp_path / "finetune-run"),
        "--final",
        str(head),
    )
    assert done.returncode == 0, done.stderr[-2000:]

    table = tmp_path / "eval.tsv"
    done = _run(tmp_path, "evaluate", "--head", str(head), "--test", f"t={structures}", "--out", str(table))
    assert done.returncode == 0, done.stderr[-2000:]
    assert table.read_text().count("\n") > 1
