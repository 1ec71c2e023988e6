"""Shared fixtures: small Parquet shard folders in the layout `pmlm tokenize` writes; the tolerance for
comparing floating-point results that differ only in the order of their additions. And how `make test` spreads the
suite over its workers (pytest-xdist, ``--dist loadfile`` with every SLURM test in one unit), with the time each file
took at the end of the report; every torchrun a test starts keeps its log folder under the session's temporary
folder (``PET_LOG_DIR``, torchrun's ``--log-dir``), not in the system's."""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from pmlm.alphabet import FIRST_RESIDUE_ID, RESIDUES
from pmlm.artefacts import SHARDS_FORMAT

# The SLURM tests share the one test cluster of a machine, which one process starts and stops
# (tests/slurm/local_cluster.py): under `make test`'s two workers they are one work unit, run by one worker one after
# the other. The scheduler sees test ids only, so it knows them by their files' names.
SLURM_FILES = "tests/test_slurm_"
SLURM_UNIT = "slurm"
# per-file times printed after the run: the slowest files, then the rest as one line
FILES_SHOWN = 25


@pytest.fixture(scope="session", autouse=True)
def torchrun_logs(tmp_path_factory):
    """torchrun's log folder for every torchrun the tests start (inherited through the environment): without it each
    one leaves a torchelastic_* folder in the system's temporary folder."""
    previous = os.environ.get("PET_LOG_DIR")
    os.environ["PET_LOG_DIR"] = str(tmp_path_factory.mktemp("torchrun-logs"))
    yield
    if previous is None:
        os.environ.pop("PET_LOG_DIR", None)
    else:
        os.environ["PET_LOG_DIR"] = previous


def pytest_collection_modifyitems(config, items):
    """SLURM tests live in SLURM_FILES (the scheduler below relies on it). Under pytest-xdist (``make test``) the
    work units that take longest go out first, so that no long one starts last while the other worker idles: the
    SLURM tests, then the files with a slow test, then the rest, each tier in collection order, each file whole."""
    strays = [item.nodeid for item in items if item.get_closest_marker("slurm") and SLURM_FILES not in item.nodeid]
    if strays:
        raise pytest.UsageError(f"SLURM tests outside {SLURM_FILES}*.py (they must share one worker): {strays[:3]}")
    if not hasattr(config, "workerinput"):  # a pytest-xdist worker's collection
        return
    tiers: dict[str, int] = {}
    for item in items:
        unit = work_unit(item.nodeid)
        tier = 0 if unit == SLURM_UNIT else 1 if item.get_closest_marker("slow") else 2
        tiers[unit] = min(tier, tiers.get(unit, tier))
    items.sort(key=lambda item: tiers[work_unit(item.nodeid)])  # stable: a file's tests stay together, in order


def work_unit(nodeid: str) -> str:
    """A test's work unit under ``make test``: its file (whose module-scoped fixtures are then built once, in one
    worker), or the one unit of every SLURM test."""
    path = nodeid.split("::", 1)[0]
    return SLURM_UNIT if path.startswith(SLURM_FILES) else path


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile`` as pytest-xdist has it (a file's tests go to one worker, in order), with every SLURM test
    in one unit; the units go out in the collection's order, which the hook above sets."""
    if config.getvalue("dist") != "loadfile":
        return None
    # imported here: xdist calls this hook only when it runs; a pytest without it (the GPU image) never does
    from xdist.scheduler import LoadFileScheduling

    class FilesAndSlurm(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    config.option.loadscopereorder = False  # keep the collection's order (xdist would sort units by test count)
    return FilesAndSlurm(config, log)


def pytest_terminal_summary(terminalreporter):
    """Seconds per test file (set-up, call and tear-down of its tests, summed), slowest first: where CI's time goes."""
    seconds: dict[str, float] = {}
    for reports in terminalreporter.stats.values():
        for report in reports:
            if isinstance(report, pytest.TestReport):
                path = report.nodeid.split("::", 1)[0]
                seconds[path] = seconds.get(path, 0.0) + report.duration
    if not seconds:
        return
    ranked = sorted(seconds.items(), key=lambda kv: -kv[1])
    terminalreporter.write_sep("=", f"seconds per test file ({sum(seconds.values()):.0f} s in all)")
    for path, total in ranked[:FILES_SHOWN]:
        terminalreporter.write_line(f"{total:8.1f}s {path}")
    rest = ranked[FILES_SHOWN:]
    if rest:
        terminalreporter.write_line(f"{sum(t for _, t in rest):8.1f}s the other {len(rest)} files")


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
