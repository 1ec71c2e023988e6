"""``pmlm ingest``: normalise raw FASTA into clean, uniquely named sequences plus an accounting JSON.

Every input record ends up either kept or dropped with a named reason, and every repair is
counted, so ``kept + sum(dropped) == read`` always holds in the stats file.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from collections import Counter
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from pmlm.alphabet import NONSTANDARD_MAP, RESIDUES, UNKNOWN_RESIDUE
from pmlm.data.fasta import read_fasta
from pmlm.errors import ConfigError, InputError
from pmlm.progress import Progress
from pmlm.utils import atomic_output

_STANDARD = RESIDUES + UNKNOWN_RESIDUE
_LOWER = "abcdefghijklmnopqrstuvwxyz"
_GAPS = "-."
_STOP = "*"
# str.translate tables: delete the characters a record may legitimately contain, what remains is invalid
_DELETE_STANDARD = str.maketrans("", "", _STANDARD)
_NONSTANDARD = "".join(NONSTANDARD_MAP)


@dataclass
class IngestPolicy:
    """What to do with each kind of irregular input. Defaults suit UniRef50 / Pfam pre-training."""

    case: str = "upper"  # lowercase residues: "upper" (repair, counted) | "error"
    nonstandard: str = "map"  # U->C, O->K, B/Z/J->X: "map" | "x" (all to X) | "drop" (record) | "error"
    gaps: str = "remove"  # '-' and '.' (alignment gaps): "remove" (counted) | "drop" | "error"
    stop: str = "strip"  # a trailing '*': "strip" (counted) | "error"; an internal '*' is invalid
    invalid: str = "drop"  # any other character (digits, punctuation): "drop" (record) | "error"
    min_length: int = 1  # residues after normalisation; shorter records are dropped ("too_short")
    max_length: int = 100_000  # longer records: see too_long
    too_long: str = "drop"  # "drop" (counted) | "error"
    dedup_sequences: bool = True  # drop exact duplicate sequences (first occurrence kept)
    duplicate_ids: str = "error"  # "error" | "drop" (later record) | "rename" (append _dupN, counted)

    _CHOICES = {
        "case": ("upper", "error"),
        "nonstandard": ("map", "x", "drop", "error"),
        "gaps": ("remove", "drop", "error"),
        "stop": ("strip", "error"),
        "invalid": ("drop", "error"),
        "too_long": ("drop", "error"),
        "duplicate_ids": ("error", "drop", "rename"),
    }

    def __post_init__(self):
        for key, choices in self._CHOICES.items():
            if getattr(self, key) not in choices:
                raise ConfigError(f"ingest.{key}: {getattr(self, key)!r} is not one of {', '.join(choices)}")
        if not (isinstance(self.min_length, int) and self.min_length >= 1):
            raise ConfigError(f"ingest.min_length must be an integer >= 1, got {self.min_length!r}")
        if not (isinstance(self.max_length, int) and self.max_length >= self.min_length):
            raise ConfigError(f"ingest.max_length must be an integer >= min_length, got {self.max_length!r}")

    @classmethod
    def from_dict(cls, values: dict) -> IngestPolicy:
        known = {f.name for f in fields(cls) if not f.name.startswith("_")}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"ingest: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        return cls(**values)

    def as_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if not k.startswith("_")}


class _Drop(Exception):
    def __init__(self, reason: str):
        self.reason = reason


class Normaliser:
    """Applies an IngestPolicy to one record at a time and keeps the counts."""

    def __init__(self, policy: IngestPolicy):
        self.policy = policy
        self.read = 0
        self.kept = 0
        self.residues = 0
        self.dropped: Counter[str] = Counter()
        self.repaired: Counter[str] = Counter()
        self.min_len: int | None = None
        self.max_len = 0
        self._seen_seq: set[bytes] = set()
        self._seen_ids: dict[str, int] = {}

    def _fail(self, path: str, line: int, record_id: str, message: str):
        raise InputError(path, f"record {record_id!r}: {message}", line=line)

    def sequence(self, seq: str, path: str, line: int, record_id: str) -> str:
        p = self.policy
        if seq and seq[-1] == _STOP:
            if p.stop == "error":
                self._fail(path, line, record_id, "trailing '*' (stop codon); set ingest.stop: strip to remove it")
            seq = seq.rstrip(_STOP)
            self.repaired["stop_stripped"] += 1
        if not seq.isupper() and any(c in _LOWER for c in seq):
            if p.case == "error":
                self._fail(path, line, record_id, "lowercase residues; set ingest.case: upper to convert them")
            seq = seq.upper()
            self.repaired["uppercased"] += 1
        leftover = seq.translate(_DELETE_STANDARD)
        if not leftover:
            return seq
        if any(c in _GAPS for c in leftover):
            if p.gaps == "error":
                self._fail(path, line, record_id, "alignment gap characters ('-' or '.'); set ingest.gaps: remove")
            if p.gaps == "drop":
                raise _Drop("gaps")
            seq = seq.replace("-", "").replace(".", "")
            leftover = leftover.replace("-", "").replace(".", "")
            self.repaired["gaps_removed"] += 1
        nonstandard = [c for c in leftover if c in _NONSTANDARD]
        if nonstandard:
            if p.nonstandard == "error":
                self._fail(path, line, record_id, f"non-standard residue {nonstandard[0]!r}; see ingest.nonstandard")
            if p.nonstandard == "drop":
                raise _Drop("nonstandard_residue")
            table = str.maketrans({c: (NONSTANDARD_MAP[c] if p.nonstandard == "map" else UNKNOWN_RESIDUE) for c in _NONSTANDARD})
            seq = seq.translate(table)
            leftover = "".join(c for c in leftover if c not in _NONSTANDARD)
            self.repaired["nonstandard_mapped"] += 1
        if leftover:
            bad = leftover[0]
            pos = seq.index(bad) + 1
            if p.invalid == "error" or (bad == _STOP and p.stop == "error"):
                self._fail(path, line, record_id, f"invalid character {bad!r} at residue {pos}")
            raise _Drop("invalid_character")
        return seq

    def record(self, title: str, seq: str, path: str, line: int) -> tuple[str, str] | None:
        """Return (id, clean sequence) to keep, or None when dropped (reason counted)."""
        self.read += 1
        record_id = title.split(None, 1)[0] if title.strip() else ""
        try:
            if not record_id:
                raise InputError(path, "header has no identifier ('>' followed by nothing)", line=line)
            if not seq:
                raise _Drop("empty")
            seq = self.sequence(seq, path, line, record_id)
            n = len(seq)
            if n < self.policy.min_length:
                raise _Drop("too_short" if n else "empty")
            if n > self.policy.max_length:
                if self.policy.too_long == "error":
                    self._fail(path, line, record_id, f"{n} residues exceeds ingest.max_length={self.policy.max_length}")
                raise _Drop("too_long")
            if self.policy.dedup_sequences:
                digest = hashlib.blake2b(seq.encode(), digest_size=12).digest()
                if digest in self._seen_seq:
                    raise _Drop("duplicate_sequence")
                self._seen_seq.add(digest)
            if record_id in self._seen_ids:
                first = self._seen_ids[record_id]
                if self.policy.duplicate_ids == "error":
                    self._fail(path, line, record_id, f"duplicate id (first seen at line {first}); see ingest.duplicate_ids")
                if self.policy.duplicate_ids == "drop":
                    raise _Drop("duplicate_id")
                k = 2
                while f"{record_id}_dup{k}" in self._seen_ids:
                    k += 1
                record_id = f"{record_id}_dup{k}"
                self.repaired["id_renamed"] += 1
            self._seen_ids[record_id] = line
        except _Drop as drop:
            self.dropped[drop.reason] += 1
            return None
        self.kept += 1
        self.residues += len(seq)
        self.min_len = len(seq) if self.min_len is None else min(self.min_len, len(seq))
        self.max_len = max(self.max_len, len(seq))
        return record_id, seq

    def stats(self, inputs: list[str]) -> dict:
        dropped = dict(sorted(self.dropped.items()))
        assert self.kept + sum(dropped.values()) == self.read, "ingest accounting is inconsistent"
        return {
            "inputs": inputs,
            "policy": self.policy.as_dict(),
            "read": self.read,
            "kept": self.kept,
            "dropped": dropped,
            "dropped_total": sum(dropped.values()),
            "repaired": dict(sorted(self.repaired.items())),
            "residues_kept": self.residues,
            "length_min": self.min_len,
            "length_max": self.max_len,
            "length_mean": round(self.residues / self.kept, 2) if self.kept else None,
        }


def ingest(inputs: list[str], out_fasta: str, stats_path: str, policy: IngestPolicy) -> dict:
    """Normalise ``inputs`` into ``out_fasta`` (one line per sequence); both outputs appear atomically."""
    norm = Normaliser(policy)
    progress = Progress("pmlm ingest")  # records read, a line a minute in the rule's log
    with atomic_output(out_fasta) as tmp, open(tmp, "w", buffering=1 << 20) as out:
        for path in inputs:
            for rec in read_fasta(path, repairs=norm.repaired):  # counts headers read as Latin-1
                progress.advance()
                kept = norm.record(rec.title, rec.sequence, path, rec.line)
                if kept is not None:
                    out.write(f">{kept[0]}\n{kept[1]}\n")
        progress.close()
        stats = norm.stats([str(p) for p in inputs])
        if stats["kept"] == 0:
            raise InputError(inputs[0], f"no record survived normalisation (dropped: {stats['dropped']})")
    with atomic_output(stats_path) as tmp:
        Path(tmp).write_text(json.dumps(stats, indent=2) + "\n")
    return stats


def policy_from_args(args) -> IngestPolicy:
    import yaml

    values: dict = {}
    if args.policy:
        try:
            values = yaml.safe_load(Path(args.policy).read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"{args.policy}: cannot read ingest policy ({exc})") from None
        if not isinstance(values, dict):
            raise ConfigError(f"{args.policy}: ingest policy must be a mapping")
    for item in args.set or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--set expects key=value, got {item!r}")
        values[key] = yaml.safe_load(value)
    return IngestPolicy.from_dict(values)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("inputs", nargs="+", help="FASTA or FASTA.gz files (gzip detected by content)")
    p.add_argument("-o", "--output", required=True, help="clean FASTA to write")
    p.add_argument("--stats", required=True, help="JSON accounting of read / kept / dropped-by-reason records")
    p.add_argument("--policy", help="YAML mapping of ingest policy keys (see pmlm.data.ingest.IngestPolicy)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override one policy key (repeatable)")


def run(args) -> int:
    policy = policy_from_args(args)
    for path in args.inputs:
        if not os.path.isfile(path):
            raise InputError(path, "no such file")
    stats = ingest(args.inputs, args.output, args.stats, policy)
    dropped = ", ".join(f"{k}={v}" for k, v in stats["dropped"].items()) or "none"
    print(f"ingest: read {stats['read']}, kept {stats['kept']}, dropped {stats['dropped_total']} ({dropped})", file=sys.stderr)
    return 0
