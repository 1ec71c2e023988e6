"""``pmlm split-structures``: train / valid / test split of a structure set by sequence identity.

Chains are clustered with MMseqs2 (easy-cluster, default 30 % identity); whole clusters go to one side
by a deterministic draw. Clustering alone does not bound the identity between sides, so a verification
search then drops every test (and valid) chain that still hits a training chain at or above the
threshold; the drops are counted. Lines are copied verbatim, so every field of the input survives.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

from pmlm.data.fasta import open_binary
from pmlm.data.split import SplitConfig, cluster_members, easy_search, mmseqs_binary, seeded_draw
from pmlm.errors import ConfigError
from pmlm.outputs import folder_target, writing_folder
from pmlm.tasks.structures import ReadCounts, read_structure_jsonl

SIDES = ("train", "valid", "test")
SPLIT_STRUCTURES_COMMAND = "pmlm split-structures"


def _raw_lines(path: str) -> list[str]:
    """The non-empty lines of a (gzip) JSONL file, in order."""
    with open_binary(path) as fh:
        return [line.decode("utf-8").rstrip("\n") for line in fh if line.strip()]


def _hits(exe: str, query: str, target: str, cfg: SplitConfig, workdir: str, log) -> set[int]:
    out = os.path.join(workdir, f"{Path(query).stem}_vs_{Path(target).stem}.m8")
    options = ["--min-seq-id", str(cfg.min_seq_id), "-c", str(cfg.coverage), "--cov-mode", str(cfg.cov_mode)]
    return easy_search(exe, query, target, out, options, cfg.threads, log)


def split_settings(cfg: SplitConfig, fractions) -> dict:
    """The settings of an identity split, as its stats file records them."""
    keys = ("min_seq_id", "coverage", "cov_mode", "seed", "method")
    return {**{k: getattr(cfg, k) for k in keys}, "fractions": list(fractions)}


def check_fractions(fractions, command: str) -> None:
    if len(fractions) != 3 or any(f < 0 for f in fractions) or abs(sum(fractions) - 1.0) > 1e-6:
        raise ConfigError(f"{command}: fractions must be three non-negative numbers summing to 1, got {fractions}")


def assign_sides(
    names: list[str], seqs: list[str], cfg: SplitConfig, fractions, scratch: Path, log
) -> tuple[list[str], np.ndarray, dict[str, int]]:
    """(side of each sequence: train, valid, test or dropped; its cluster representative; the held-out sequences
    dropped per side as similar to training). Whole clusters go to one side by a draw from the representative's
    name; then every valid or test sequence that still hits a training one at ``cfg.min_seq_id`` is dropped."""
    exe = mmseqs_binary(cfg.mmseqs)
    scratch.mkdir(parents=True, exist_ok=True)
    work = tempfile.mkdtemp(prefix=".mmseqs.", suffix=".tmp", dir=scratch)
    try:
        indexed = os.path.join(work, "all.fasta")
        with open(indexed, "w") as fh:
            for i, seq in enumerate(seqs):
                fh.write(f">{i}\n{seq}\n")
        rep_of = cluster_members(cfg, indexed, len(seqs), work, log)
        side_of_rep = {}
        for r in np.unique(rep_of):
            u = seeded_draw(names[r], cfg.seed)
            side_of_rep[int(r)] = (
                "train" if u < fractions[0] else ("valid" if u < fractions[0] + fractions[1] else "test")
            )
        side = [side_of_rep[int(rep_of[i])] for i in range(len(seqs))]
        # verification: no held-out sequence may still resemble a training one
        fasta = {}
        for name in SIDES:
            fasta[name] = os.path.join(work, f"{name}.fasta")
            with open(fasta[name], "w") as fh:
                for i, s in enumerate(side):
                    if s == name:
                        fh.write(f">{i}\n{seqs[i]}\n")
        dropped = {}
        for held_out in ("valid", "test"):
            has_train = any(s == "train" for s in side)
            has_held = any(s == held_out for s in side)
            hits = _hits(exe, fasta[held_out], fasta["train"], cfg, work, log) if has_train and has_held else set()
            dropped[held_out] = len(hits)
            for i in hits:
                side[i] = "dropped"
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return side, rep_of, dropped


def split_structures(
    path: str,
    out_dir: str,
    cfg: SplitConfig,
    fractions: tuple[float, float, float],
    log=None,
    *,
    overwrite: bool = False,
) -> dict:
    """train/valid/test.jsonl and structure_split_stats.json of the structure set ``path`` into the folder
    ``out_dir``, a folder of its own (pmlm.outputs: checked before any work, the files appear together)."""
    log = log or sys.stderr
    out = folder_target(out_dir, command=SPLIT_STRUCTURES_COMMAND, option="--out-dir", overwrite=overwrite)
    check_fractions(fractions, "split-structures")
    counts = ReadCounts()
    records = list(read_structure_jsonl(path, on_error="raise", counts=counts))
    lines = _raw_lines(path)
    if len(lines) != len(records):
        raise ConfigError(f"{path}: {len(lines)} lines but {len(records)} records")
    names, seqs = [r.name for r in records], [r.seq for r in records]
    side, rep_of, dropped = assign_sides(names, seqs, cfg, fractions, out.parent, log)
    reps = np.unique(rep_of)

    stats = {
        "input": path,
        "config": split_settings(cfg, fractions),
        "chains": len(records),
        "clusters": len(reps),
        "dropped_similar_to_train": dropped,
    }
    with writing_folder(out, command=SPLIT_STRUCTURES_COMMAND, option="--out-dir", overwrite=overwrite) as staged:
        for name in SIDES:
            chosen = [lines[i] for i, s in enumerate(side) if s == name]
            stats[name] = {
                "chains": len(chosen),
                "clusters": len({int(rep_of[i]) for i, s in enumerate(side) if s == name}),
            }
            (staged / f"{name}.jsonl").write_text("".join(line + "\n" for line in chosen))
        assert sum(stats[n]["chains"] for n in SIDES) + sum(dropped.values()) == len(records)
        (staged / "structure_split_stats.json").write_text(json.dumps(stats, indent=2) + "\n")
    return stats
