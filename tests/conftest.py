"""Shared fixtures and helpers (``from conftest import ...``; no test module imports another): small Parquet shard
folders in the layout `pmlm tokenize` writes; tolerances for floating-point results that differ only in the order of
their additions; Snakemake run as the tests run it; references and checks several test files share (the released
fixture's tokens, a Potts model's conditionals, a proteome through the inference workflow). What tests build and feed
to the code (encoders, recipes, input files) is in tiny_models.py. And how `make test` spreads the suite over its
workers (pytest-xdist, ``--dist loadfile`` with every SLURM test in one unit), with the time each file took at the
end of the report; every torchrun a test starts keeps its log folder under the session's temporary folder
(``PET_LOG_DIR``, torchrun's ``--log-dir``), not in the system's."""

from __future__ import annotations

import csv
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from pmlm import alphabet
from pmlm.alphabet import FIRST_RESIDUE_ID, RESIDUES
from pmlm.artefacts import SHARDS_FORMAT
from pmlm.cli import main
from pmlm.data.fasta import read_fasta
from pmlm.inference.embedding import PER_SEQUENCE_SUFFIX
from pmlm.synth.exact import local_fields
from pmlm.synth.potts import PottsModel
from pmlm.vocabulary import INFERENCE_OUTPUTS, OUTPUT_CONTACTS, OUTPUT_EMBEDDINGS, OUTPUT_SUBSTITUTIONS

# The SLURM tests share the one test cluster of a machine, which one process starts and stops
# (tests/slurm/local_cluster.py): under `make test`'s two workers they are one work unit, run by one worker one after
# the other. The scheduler sees test ids only, so it knows them by their files' names.
SLURM_FILES = "tests/test_slurm_"
SLURM_UNIT = "slurm"
# per-file times printed after the run: the slowest files, then the rest as one line
FILES_SHOWN = 25
REPO = Path(__file__).resolve().parents[1]


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


def layer_tolerance(reference: torch.Tensor, depth: int, cfg) -> float:
    """fp32 rounding, accumulated: each layer's sums run over at most C + ffn + T terms (projections, feed-forward,
    attention), each layer adds its own rounding to what it was given, so the bound grows with the depth."""
    return depth * reorder_tolerance(reference, cfg.hidden + cfg.ffn + cfg.max_len)


class LargestTensor(TorchDispatchMode):
    """Records the largest tensor any op produces while active."""

    def __init__(self):
        super().__init__()
        self.max_numel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                self.max_numel = max(self.max_numel, t.numel())
        return out


def site_log_conditionals(model: PottsModel, x: np.ndarray) -> np.ndarray:
    """log P(x_s = a | x_-s) of every site, (N, L, q), as pmlm.synth.exact's docstring defines it from
    ``local_fields``: F_s(a) - logsumexp_a F_s(a)."""
    f = local_fields(model, x)
    top = f.max(axis=-1, keepdims=True)
    return f - top - np.log(np.exp(f - top).sum(axis=-1, keepdims=True))


# -- the released fixture (tests/data/released: tiny models of the released code's families, run by fairseq) ------

RELEASED_FIXTURE = REPO / "tests" / "data" / "released"


@cache
def released_provenance() -> dict:
    """The fixture's provenance.json: the dictionaries fairseq built, the sequences it ran."""
    return json.loads((RELEASED_FIXTURE / "provenance.json").read_text())


def our_tokens(released_tokens: torch.Tensor) -> torch.Tensor:
    """The fixture's fairseq token ids as ours, symbol by symbol."""
    names = {"<s>": alphabet.CLS, "<pad>": alphabet.PAD, "</s>": alphabet.EOS}
    fairseq = released_provenance()["models"]["pmlm"]["dictionary"]
    table = torch.tensor([alphabet.TOKEN_TO_ID.get(names.get(s, s), -1) for s in fairseq])  # the gap: no token
    ours = table[released_tokens]
    assert (ours >= 0).all()
    return ours


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


def metrics_rows(out: Path, split: str = "train") -> list[dict]:
    """The rows of ``split`` in a run folder's metrics.csv."""
    with open(out / "metrics.csv", newline="") as fh:
        return [row for row in csv.DictReader(fh) if row["split"] == split]


def reversed_keys(value):
    """``value`` with the keys of every mapping, at any depth, in reverse order (lists keep theirs)."""
    if isinstance(value, dict):
        return {key: reversed_keys(value[key]) for key in reversed(list(value))}
    if isinstance(value, list):
        return [reversed_keys(v) for v in value]
    return value


# -- Snakemake, as the workflow tests run it -------------------------------------------------------------------------

SNAKEMAKE = shutil.which("snakemake", path=os.path.dirname(sys.executable)) or shutil.which("snakemake")


def snakemake(*args, cwd=REPO, timeout=1800):
    """``snakemake *args`` in ``cwd`` with this Python's scripts first on PATH; its output captured."""
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    return subprocess.run([SNAKEMAKE, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def job_counts(output: str) -> dict[str, int]:
    """Rule -> jobs of the "Job stats" table a dry run prints (and "total")."""
    counts, in_table = {}, False
    for line in output.splitlines():
        if line.startswith("job ") and "count" in line:
            in_table = True
            continue
        if in_table:
            parts = line.split()
            if len(parts) == 2 and parts[1].isdigit():
                counts[parts[0]] = int(parts[1])
            elif parts and not set(line.strip()) <= {"-", " "}:
                break
    return counts


# -- a proteome through the inference workflow (tests/test_inference_workflow.py, and through SLURM
#    tests/test_slurm_inference.py): the gathered files against the single commands' outputs ------------------------

DEMO_FASTA = REPO / "data" / "demo" / "uniprot_sample.fasta.gz"
# the tiny encoder's positions: windows of 32 residues, so the longer sequences below are read as two windows
PROTEOME_MAX_LEN = 34
PROTEOME_RUN = "proteome"  # the workflow config's run
# float tolerance between a shard's batches and the whole file's (other batch shapes, other summation order)
SHARDS_ATOL = 1e-4


def proteome(n: int) -> dict[str, str]:
    """``n`` sequences of the demo's UniProt sample (data/demo), cut to 20-69 residues (the longer ones span two of
    the tiny encoder's windows); every tenth in lowercase, as files from other tools have them."""
    out = {}
    for k, record in enumerate(read_fasta(DEMO_FASTA)):
        if k == n:
            break
        letters = record.sequence[: 20 + k % 50]
        out[record.id] = letters.lower() if k % 10 == 3 else letters
    return out


def inference_config(fasta: Path, encoder: Path, residues_per_shard: int, **settings) -> dict:
    """A workflow config with an inference section only: every output of one tiny encoder."""
    section = {
        "fasta": str(fasta),
        "encoders": {"tiny": str(encoder)},
        "outputs": list(INFERENCE_OUTPUTS),
        "residues_per_shard": residues_per_shard,
        # every pair within the windows: no cut at the L-th score, where near ties could fall either way
        "contacts": {"top": "all"},
        **settings,
    }
    return {"run": PROTEOME_RUN, "inference": section}


def gathered(workdir: Path, output: str, suffix: str = ".parquet") -> Path:
    return workdir / "results" / PROTEOME_RUN / "inference" / "tiny" / f"{output}{suffix}"


def single_commands(model: Path, fasta: Path, out: Path, *unknown: str) -> dict[str, Path]:
    """Each output of the whole FASTA by its command, as a user runs it on one machine (in this process)."""
    out.mkdir(parents=True, exist_ok=True)
    files = {
        OUTPUT_EMBEDDINGS: out / "embeddings.parquet",
        OUTPUT_SUBSTITUTIONS: out / "substitutions.parquet",
        OUTPUT_CONTACTS: out / "contacts.parquet",
    }
    commands = {
        OUTPUT_EMBEDDINGS: ["embed", str(model), str(fasta), "-o", str(files[OUTPUT_EMBEDDINGS]), *unknown],
        OUTPUT_SUBSTITUTIONS: ["score", str(model), "--saturation", "--sequence", str(fasta), "-o",
                               str(files[OUTPUT_SUBSTITUTIONS])],
        OUTPUT_CONTACTS: ["contacts", str(model), str(fasta), "-o", str(files[OUTPUT_CONTACTS])],
    }  # fmt: skip
    for output, argv in commands.items():
        assert main(argv) == 0, output
    return files


def assert_same_rows(got: Path, want: Path, sort: tuple[str, ...] = ()) -> None:
    """The same columns and rows (float columns within SHARDS_ATOL); ``sort``: compare in that order (rows whose
    order the command sets by score, which near ties may swap)."""
    a, b = pq.read_table(got), pq.read_table(want)
    assert a.schema.remove_metadata() == b.schema.remove_metadata(), (got, a.schema, b.schema)
    a, b = a.to_pandas(), b.to_pandas()
    if sort:
        a, b = (t.sort_values(list(sort), kind="stable").reset_index(drop=True) for t in (a, b))
    assert len(a) == len(b), (got, len(a), len(b))
    for column in a.columns:
        x, y = a[column].to_numpy(), b[column].to_numpy()
        if column == "embedding":
            np.testing.assert_allclose(np.stack(x), np.stack(y), atol=SHARDS_ATOL, err_msg=f"{got}: {column}")
        elif x.dtype.kind == "f":
            np.testing.assert_allclose(x, y, atol=SHARDS_ATOL, err_msg=f"{got}: {column}")
        else:
            assert (x == y).all(), f"{got}: column {column} differs"


def assert_equals_single_commands(workdir: Path, reference: dict[str, Path], ids: list[str]) -> None:
    """Every gathered file equals the command's output on the whole FASTA, row for row; the rows are in input order
    (each sequence's rows together, sequences as in the FASTA)."""
    assert_same_rows(gathered(workdir, OUTPUT_EMBEDDINGS), reference[OUTPUT_EMBEDDINGS])
    per_sequence = Path(str(reference[OUTPUT_EMBEDDINGS]).removesuffix(".parquet") + PER_SEQUENCE_SUFFIX)
    assert_same_rows(gathered(workdir, OUTPUT_EMBEDDINGS, PER_SEQUENCE_SUFFIX), per_sequence)
    assert_same_rows(gathered(workdir, OUTPUT_SUBSTITUTIONS), reference[OUTPUT_SUBSTITUTIONS])
    assert_same_rows(gathered(workdir, OUTPUT_CONTACTS), reference[OUTPUT_CONTACTS], sort=("id", "i", "j"))
    for output in INFERENCE_OUTPUTS:
        column = pq.read_table(gathered(workdir, output), columns=["id"]).column("id").to_pylist()
        runs = [seq_id for k, seq_id in enumerate(column) if k == 0 or column[k - 1] != seq_id]
        assert runs == [i for i in ids if i in set(runs)], f"{output}: rows not in input order"
