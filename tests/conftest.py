"""Shared fixtures: small Parquet shard folders in the layout `pmlm tokenize` writes; the tolerance for
comparing floating-point results that differ only in the order of their additions."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from pmlm.alphabet import FIRST_RESIDUE_ID, RESIDUES
from pmlm.artefacts import SHARDS_FORMAT

# UniProt-like background residue frequencies (ACDEFGHIKLMNPQRSTVWY), so sequences look protein-like
_FREQ = np.array([8.3, 1.4, 5.5, 6.7, 3.9, 7.1, 2.3, 5.9, 5.8, 9.7, 2.4, 4.1, 4.7, 3.9, 5.3, 6.6, 5.3, 6.9, 1.1, 2.9])
_FREQ = _FREQ / _FREQ.sum()


def reorder_tolerance(reference: torch.Tensor, n_terms: int, dtype: torch.dtype = torch.float32) -> float:
    """How far two evaluations of the same arithmetic in ``dtype`` may differ when only the order of additions
    differs (chunking, blocking, the thread count): each value is a sum of up to ``n_terms`` rounded terms, and
    rounding errors of random sign add up like a random walk, sqrt(n_terms) times the machine epsilon times the
    size of the terms (n_terms times at worst). The largest |value| of ``reference`` stands for that size; the
    factor 8 covers the two evaluations compared and the tail over many values."""
    return 8.0 * math.sqrt(n_terms) * torch.finfo(dtype).eps * float(reference.detach().abs().max())


def make_sequences(n: int, seed: int, min_len: int = 8, max_len: int = 60, families: int = 6) -> list[np.ndarray]:
    """Residue token ids (uint8) of ``n`` sequences: mutated copies of a few family templates
    (so a model can learn something), lengths skewed like real proteins (log-normal, clipped)."""
    rng = np.random.default_rng(seed)
    templates = [rng.choice(len(RESIDUES), size=max_len, p=_FREQ) for _ in range(families)]
    median = np.sqrt(min_len * max_len)
    lengths = np.clip(rng.lognormal(np.log(median), 0.5, size=n), min_len, max_len).astype(int)
    out = []
    for length in lengths:
        seq = templates[rng.integers(families)][:length].copy()
        mutate = rng.random(length) < 0.1
        seq[mutate] = rng.choice(len(RESIDUES), size=int(mutate.sum()), p=_FREQ)
        out.append((seq + FIRST_RESIDUE_ID).astype(np.uint8))
    return out


def write_shards(
    root: Path, splits: dict[str, list[np.ndarray]], files: int = 2, rows_per_group: int = 16, encoding: str = "binary"
) -> Path:
    """Write ``root/<split>/part-0000i-of-0000n.parquet`` and ``root/manifest.json``.

    ``encoding``: "binary" (one byte per residue, what `pmlm tokenize` writes) or "list" (list<uint8>).
    """
    root.mkdir(parents=True, exist_ok=True)
    manifest: dict = {"format": SHARDS_FORMAT, "splits": {}}
    for split, seqs in splits.items():
        (root / split).mkdir(exist_ok=True)
        entries = []
        for f in range(files):
            part = seqs[f::files]
            rel = f"{split}/part-{f:05d}-of-{files:05d}.parquet"
            table = pa.table(
                {
                    "id": pa.array([f"{split}_{f}_{i}" for i in range(len(part))], pa.string()),
                    "cluster_id": pa.array([f"c{f}_{i // 3}" for i in range(len(part))], pa.string()),
                    "length": pa.array([len(s) for s in part], pa.int32()),
                    "tokens": (
                        pa.array([s.tobytes() for s in part], pa.binary())
                        if encoding == "binary"
                        else pa.array([s.tolist() for s in part], pa.list_(pa.uint8()))
                    ),
                }
            )
            pq.write_table(table, root / rel, row_group_size=rows_per_group)
            entries.append(
                {
                    "path": rel,
                    "rows": len(part),
                    "residues": int(sum(len(s) for s in part)),
                    "sha256": hashlib.sha256((root / rel).read_bytes()).hexdigest(),
                }
            )
        manifest["splits"][split] = {
            "files": entries,
            "rows": sum(e["rows"] for e in entries),
            "residues": sum(e["residues"] for e in entries),
        }
    (root / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return root


@pytest.fixture
def shard_dir(tmp_path: Path) -> Path:
    """A small train/valid shard folder: 256 + 64 sequences of 8-60 residues, 16 rows per row group."""
    return write_shards(
        tmp_path / "shards", {"train": make_sequences(256, seed=1), "valid": make_sequences(64, seed=2)}
    )


@pytest.fixture
def single_thread():
    """torch on one thread for the test, restored after (the modules that compare against hand references)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
