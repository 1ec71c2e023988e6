"""A FASTA file cut into shards for the workflow's inference jobs (``pmlm shard-fasta``), and the manifest that says
what each shard holds. The checks, the repairs and the cut (contiguous runs balanced by residue count, so the
gather needs no sort): docs/inference.md, "The shards".

The shards are written under temporary names and appear together with ``manifest.json`` (``pmlm.outputs``): input
path and sha256, the strategy, R, the counts, the repairs, and per shard its name, records, residues and the sha256
of its ids (one per line), which the gather checks each shard's output against.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import groupby
from pathlib import Path

from pmlm.data.fasta import FastaRecord, read_fasta
from pmlm.errors import ConfigError, InputError
from pmlm.files import file_digest
from pmlm.inference.sequences import UNKNOWN_ERROR, SequenceReport, check_sequence, iter_fasta_sequences
from pmlm.outputs import folder_target, writing_folder
from pmlm.progress import Progress

COMMAND = "pmlm shard-fasta"
MANIFEST = "manifest.json"
FORMAT = "pmlm-fasta-shards"
SUFFIX = ".fasta"
NAME_DIGITS = 5
STRATEGY = "contiguous runs balanced by residues"
OPTION = "--unknown"  # the option named in errors about letters outside the alphabet


@dataclass(frozen=True)
class Shard:
    name: str  # 00000, 00001, ...: the file <name>.fasta, the workflow's {shard}
    records: int
    residues: int
    ids_sha256: str  # sha256 of the shard's ids, each followed by a newline (ids_digest)


@dataclass(frozen=True)
class Manifest:
    folder: Path
    input: str
    input_sha256: str
    residues_per_shard: int
    records: int
    residues: int
    unknown: str
    repairs: dict[str, int]
    shards: tuple[Shard, ...]

    def fasta(self, shard: Shard) -> Path:
        return self.folder / f"{shard.name}{SUFFIX}"

    @property
    def settings(self) -> dict:
        """What the gathered outputs record of the sharding (the input, the strategy and the counts)."""
        return {"input": self.input, "input_sha256": self.input_sha256, "strategy": STRATEGY,
                "residues_per_shard": self.residues_per_shard, "shards": len(self.shards), "sequences": self.records,
                "residues": self.residues, "unknown": self.unknown, "repairs": self.repairs}  # fmt: skip


def ids_digest(ids: Iterable[str]) -> str:
    """sha256 of ids, each followed by a newline: a shard's record ids in order, or the ids of its output's rows."""
    h = hashlib.sha256()
    for seq_id in ids:
        h.update(seq_id.encode() + b"\n")
    return h.hexdigest()


def shard_count(residues: int, records: int, residues_per_shard: int) -> int:
    """N = ceil(residues / residues_per_shard), at least 1 and at most one per record."""
    return max(1, min(records, math.ceil(residues / residues_per_shard)))


def assign_shards(lengths: list[int], residues_per_shard: int) -> list[int]:
    """The shard of each record (module docstring): contiguous, balanced by residues, numbered from 0 in order."""
    total = sum(lengths)
    bins = shard_count(total, len(lengths), residues_per_shard)
    out, before, previous = [], 0, None
    for n in lengths:
        middle = min(bins - 1, (2 * before + n) * bins // (2 * total)) if total else 0  # the bin of its middle
        before += n
        out.append(out[-1] + (middle != previous) if out else 0)  # the next number when a new bin starts
        previous = middle
    return out


def shard_fasta(
    fasta: str | os.PathLike,
    out: str | os.PathLike,
    residues_per_shard: int,
    unknown: str = UNKNOWN_ERROR,
    *,
    overwrite: bool = False,
) -> Manifest:
    """Check ``fasta`` and write its shards and manifest into folder ``out`` (module docstring); returns the
    Manifest. Two passes over the input: the first checks every record (``pmlm.inference.sequences``, ``unknown``
    as the commands' ``--unknown``) and counts residues, the second writes each record as the commands read it
    (uppercase; X for a letter read as unknown; a record left out by ``unknown='skip'`` left out)."""
    if residues_per_shard < 1:
        raise ConfigError(f"--residues-per-shard must be >= 1, got {residues_per_shard}")
    out = folder_target(out, command=COMMAND, overwrite=overwrite)
    report = SequenceReport()
    lengths = []
    with Progress(COMMAND, None, unit="records", rates=("residues",)) as progress:
        for sequence in iter_fasta_sequences(fasta, unknown=unknown, report=report, repair_option=OPTION):
            lengths.append(len(sequence.letters))
            progress.advance(1, residues=report.residues)
    if not lengths:
        raise InputError(fasta, "no sequence left to shard (every record was skipped)")
    shard_of = iter(assign_shards(lengths, residues_per_shard))
    width = max(NAME_DIGITS, len(str(len(lengths))))
    shards = []
    with writing_folder(out, command=COMMAND, overwrite=overwrite) as staging:
        kept = ((next(shard_of), r, letters) for r, letters in _as_read(fasta, unknown))
        for number, group in groupby(kept, key=lambda item: item[0]):
            name, ids, residues = f"{number:0{width}d}", [], 0
            with open(staging / f"{name}{SUFFIX}", "w") as handle:
                for _, record, letters in group:
                    handle.write(f">{record.title}\n{letters}\n")
                    ids.append(record.id)
                    residues += len(letters)
            shards.append(Shard(name, len(ids), residues, ids_digest(ids)))
        repairs = {k: v for k, v in report.as_dict().items() if k not in ("sequences", "residues")}
        manifest = Manifest(
            out, os.fspath(fasta), file_digest(fasta), residues_per_shard, report.sequences, report.residues,
            unknown, repairs, tuple(shards),
        )  # fmt: skip
        (staging / MANIFEST).write_text(json.dumps(_as_json(manifest), indent=1) + "\n")
    return manifest


def _as_read(fasta: str | os.PathLike, unknown: str) -> Iterator[tuple[FastaRecord, str]]:
    """Each record of a file the first pass checked, with its letters as the commands read them; those the policy
    leaves out are left out."""
    for record in read_fasta(fasta):
        checked = check_sequence(fasta, record.id, record.sequence, record.line, unknown=unknown)
        if checked.residues is not None:
            yield record, checked.letters


def _as_json(manifest: Manifest) -> dict:
    return {"format": FORMAT, **manifest.settings, "shards": [vars(s) for s in manifest.shards]}


def read_manifest(folder: str | os.PathLike) -> Manifest:
    """The manifest of a shards folder (``pmlm shard-fasta``'s output), checked to be one."""
    path = Path(folder) / MANIFEST
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(path, "no such file: not a folder pmlm shard-fasta wrote") from None
    except ValueError as exc:
        raise InputError(path, f"not JSON ({exc})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise InputError(path, f"not a manifest of pmlm shard-fasta (format {FORMAT!r} expected)")
    try:
        shards = tuple(Shard(**s) for s in data["shards"])
        keys = ("input", "input_sha256", "residues_per_shard", "sequences", "residues", "unknown", "repairs")
        return Manifest(Path(folder), *(data[k] for k in keys), shards)
    except (KeyError, TypeError) as exc:
        raise InputError(path, f"incomplete manifest ({exc})") from None
