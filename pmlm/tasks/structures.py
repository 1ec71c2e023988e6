"""Protein structures for evaluation: contact maps from coordinates, DSSP 8-to-3-state
reduction, and the reader of pmlm's structure JSONL format (plain or gzip).

Structure JSONL: one JSON object per line with ``id`` (str), ``chain`` (str),
``start_resnum`` (int), ``seq`` (one-letter, residues of ``pmlm.alphabet.RESIDUES`` or X),
``dssp`` (8-state DSSP string, same length as ``seq``), ``ca`` and ``cb`` (one [x, y, z] in
Angstrom per residue; ``null`` or an entry with a NaN / null coordinate marks an unresolved
residue). Blank lines are allowed and ignored. Contacts for this format use C-beta.
"""

from __future__ import annotations

import gzip
import io
import json
import math
import os
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

from pmlm.alphabet import RESIDUES, UNKNOWN_RESIDUE
from pmlm.errors import InputError

T = TypeVar("T")

CONTACT_THRESHOLD = 8.0  # Angstrom; a pair is a contact when its distance is <= this
# Atom whose distance defines a contact, per dataset (design brief, section 3).
CONTACT_ATOMS: dict[str, str] = {
    "tape_proteinnet": "CA",  # TAPE's ProteinNet JSON/LMDB holds C-alpha coordinates only
    "raptorx": "CB",  # RaptorX / ESM: C-beta, virtual C-beta for glycine
    "structure_jsonl": "CB",  # our format ships an ideal virtual C-beta for glycine
}

# 3-state classes in TAPE's encoding (ss3 labels): H = 0, E = 1, C = 2.
SS3_STATES = "HEC"
# DSSP 8-state -> 3-state: H, G, I -> H; E, B -> E; everything else (T, S, C, P and the
# blank / '-' DSSP writes for "no structure") -> C.
DSSP_TO_SS3: dict[str, str] = {**dict.fromkeys("HGI", "H"), **dict.fromkeys("EB", "E"), **dict.fromkeys("TSCP- ", "C")}
SEQ_LETTERS = frozenset(RESIDUES + UNKNOWN_RESIDUE)  # what a task file's sequence may hold
_GZIP_MAGIC = b"\x1f\x8b"
_JSON_NUMBER_TYPES = frozenset({int, float, type(None)})
ON_ERROR_CHOICES = ("raise", "skip")


def contact_map(coords, threshold: float = CONTACT_THRESHOLD) -> tuple[np.ndarray, np.ndarray]:
    """(L, 3) coordinates, NaN rows for unresolved residues -> (contacts, valid), both (L, L) bool.

    valid[i, j]: both residues resolved; contacts[i, j]: valid and distance <= threshold
    (the diagonal included; metrics only look at i < j).
    """
    coords = np.asarray(coords, dtype=np.float64)
    if coords.ndim != 2 or coords.shape[1] != 3:
        raise ValueError(f"coords must have shape (L, 3), got {coords.shape}")
    resolved = np.isfinite(coords).all(axis=1)  # (L,)
    valid = resolved[:, None] & resolved[None, :]  # (L, L)
    filled = np.where(resolved[:, None], coords, 0.0)  # NaN-free so distances stay finite
    distances = np.sqrt(((filled[:, None, :] - filled[None, :, :]) ** 2).sum(-1))  # (L, L)
    return (distances <= threshold) & valid, valid


def dssp_to_ss3(dssp: str) -> str:
    """8-state DSSP string -> 3-state string over ``SS3_STATES``; KeyError on a foreign letter."""
    return "".join(DSSP_TO_SS3[c] for c in dssp)


def ss3_to_labels(ss3: str) -> np.ndarray:
    """3-state string -> (L,) int64 labels H=0, E=1, C=2."""
    return np.array([SS3_STATES.index(c) for c in ss3], dtype=np.int64)


@dataclass
class StructureRecord:
    """One chain stretch of the structure JSONL format."""

    id: str
    chain: str
    start_resnum: int
    seq: str
    dssp: str
    ca: np.ndarray  # (L, 3) float64, NaN rows = unresolved
    cb: np.ndarray  # (L, 3) float64, NaN rows = unresolved

    @property
    def name(self) -> str:
        return f"{self.id}_{self.chain}"

    @property
    def ss3(self) -> str:
        return dssp_to_ss3(self.dssp)

    def coords(self, atom: str) -> np.ndarray:
        if atom not in ("CA", "CB"):
            raise ValueError(f"atom must be 'CA' or 'CB', got {atom!r}")
        return self.ca if atom == "CA" else self.cb

    def contacts(self, atom: str = CONTACT_ATOMS["structure_jsonl"], threshold: float = CONTACT_THRESHOLD):
        """(contacts, valid), both (L, L) bool, from this record's coordinates."""
        return contact_map(self.coords(atom), threshold)


@dataclass
class ReadCounts:
    """What a reader did: records yielded, records skipped by reason, documented repairs."""

    read: int = 0
    skipped: Counter = field(default_factory=Counter)  # reason -> count (on_error="skip")
    repaired: Counter = field(default_factory=Counter)  # repair -> count (e.g. residues mapped)
    first_skip: str | None = None  # the first skipped record's error, for the log

    @property
    def n_skipped(self) -> int:
        return sum(self.skipped.values())

    def skip(self, error: InputError, reason: str) -> None:
        self.skipped[reason] += 1
        if self.first_skip is None:
            self.first_skip = str(error)

    def reject(self, error: InputError, reason: str, on_error: str) -> None:
        """A bad record: raise ``error`` (on_error="raise") or count it as skipped."""
        if on_error == "raise":
            raise error from None
        self.skip(error, reason)

    def as_dict(self) -> dict:
        return {
            "read": self.read,
            "skipped": dict(self.skipped),
            "repaired": dict(self.repaired),
            "first_skip": self.first_skip,
        }


class RecordError(ValueError):
    """A record-level problem; readers turn it into an InputError naming file and line."""

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason


def open_text(path: str | os.PathLike) -> io.TextIOBase:
    """Open a text file, transparently gunzipping when it starts with the gzip magic bytes."""
    try:
        with open(path, "rb") as fh:
            magic = fh.read(2)
    except OSError as exc:
        raise InputError(path, f"cannot open: {exc.strerror or exc}") from None
    if magic == _GZIP_MAGIC:
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8")
    return open(path, encoding="utf-8")


def parse_coords(value, length: int, key: str) -> np.ndarray:
    """JSON list of [x, y, z] / null per residue -> (L, 3) float64 with NaN rows for unresolved."""
    if not isinstance(value, list):
        raise RecordError(f"'{key}' must be a list of [x, y, z] entries", "bad coordinates")
    if len(value) != length:
        raise RecordError(f"'{key}' has {len(value)} entries but 'seq' has {length} residues", "length mismatch")
    # fast path for the common all-numeric case; the entry-by-entry parse below handles
    # null rows and produces the precise error message
    try:
        arr = np.array(value, dtype=np.float64)
    except (TypeError, ValueError):
        arr = None
    numbers = (
        arr is not None and arr.shape == (length, 3) and {type(v) for row in value for v in row} <= _JSON_NUMBER_TYPES
    )
    if numbers and not np.isinf(arr).any():
        arr[~np.isfinite(arr).all(axis=1)] = np.nan  # any missing coordinate: residue unresolved
        return arr
    return _parse_coords_entries(value, length, key)


def _parse_coords_entries(value: list, length: int, key: str) -> np.ndarray:
    out = np.full((length, 3), np.nan)
    for r, entry in enumerate(value):
        if entry is None:
            continue
        if not isinstance(entry, list) or len(entry) != 3:
            raise RecordError(f"'{key}' entry {r + 1} must be [x, y, z] or null, got {entry!r}", "bad coordinates")
        if any(v is None for v in entry):
            continue  # a partially missing atom is an unresolved residue
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in entry):
            raise RecordError(f"'{key}' entry {r + 1} must hold numbers, got {entry!r}", "bad coordinates")
        if any(math.isnan(v) for v in entry):
            continue
        if any(math.isinf(v) for v in entry):
            raise RecordError(f"'{key}' entry {r + 1} is infinite: {entry!r}", "bad coordinates")
        out[r] = entry
    return out


def _parse_structure(obj: dict) -> StructureRecord:
    missing = [k for k in ("id", "chain", "start_resnum", "seq", "dssp", "ca", "cb") if k not in obj]
    if missing:
        raise RecordError(f"missing key(s) {', '.join(missing)}", "missing key")
    seq, dssp = obj["seq"], obj["dssp"]
    if not isinstance(seq, str) or not seq:
        raise RecordError("'seq' must be a non-empty string", "bad sequence")
    bad = sorted(set(seq) - SEQ_LETTERS)
    if bad:
        pos = next(i for i, c in enumerate(seq) if c in bad)
        raise RecordError(f"'seq' has non-residue letter {seq[pos]!r} at position {pos + 1}", "bad sequence")
    if not isinstance(dssp, str) or len(dssp) != len(seq):
        got = len(dssp) if isinstance(dssp, str) else type(dssp).__name__
        raise RecordError(f"'dssp' length {got} != 'seq' length {len(seq)}", "length mismatch")
    bad = sorted(set(dssp) - DSSP_TO_SS3.keys())
    if bad:
        raise RecordError(f"'dssp' has letter(s) {''.join(bad)!r} outside the 8 DSSP states", "bad dssp")
    start = obj["start_resnum"]
    if not isinstance(start, int) or isinstance(start, bool):
        raise RecordError(f"'start_resnum' must be an integer, got {start!r}", "bad field")
    return StructureRecord(
        id=str(obj["id"]),
        chain=str(obj["chain"]),
        start_resnum=start,
        seq=seq,
        dssp=dssp,
        ca=parse_coords(obj["ca"], len(seq), "ca"),
        cb=parse_coords(obj["cb"], len(seq), "cb"),
    )


def read_structure_jsonl(
    path: str | os.PathLike, *, on_error: str = "raise", counts: ReadCounts | None = None
) -> Iterator[StructureRecord]:
    """Yield the records of a structure JSONL file (plain or gzip, detected by content).

    on_error="raise": the first bad line raises InputError naming file and line.
    on_error="skip": bad lines are skipped and counted by reason in ``counts`` (pass a
    ReadCounts to see them); unreadable files (bad gzip, not UTF-8) always raise.
    """
    if on_error not in ON_ERROR_CHOICES:
        raise ValueError(f"on_error must be one of {ON_ERROR_CHOICES}, got {on_error!r}")
    counts = ReadCounts() if counts is None else counts
    yield from jsonl_records(path, lambda obj, line_no: _parse_structure(obj), on_error, counts)


def jsonl_records(
    path: str | os.PathLike, parse: Callable[[dict, int], T], on_error: str, counts: ReadCounts
) -> Iterator[T]:
    """``parse(object, line number)`` of each non-blank line of a JSONL file (plain or gzip), the task
    readers' one loop over JSON lines. A bad line (bad JSON, not an object, or a RecordError from
    ``parse``) raises InputError naming file and line, or with on_error="skip" is counted by reason in
    ``counts``; an unreadable file (bad gzip, not UTF-8) always raises."""
    line_no = 0
    try:
        with open_text(path) as fh:
            for line_no, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                try:
                    try:
                        obj = json.loads(line)
                    except json.JSONDecodeError as exc:
                        raise RecordError(f"bad JSON: {exc.msg} (column {exc.colno})", "bad JSON") from None
                    if not isinstance(obj, dict):
                        raise RecordError(f"expected a JSON object, got {type(obj).__name__}", "not an object")
                    record = parse(obj, line_no)
                except RecordError as exc:
                    counts.reject(InputError(path, str(exc), line=line_no), exc.reason, on_error)
                    continue
                counts.read += 1
                yield record
    except (EOFError, gzip.BadGzipFile, UnicodeDecodeError, OSError) as exc:
        raise InputError(path, f"unreadable after line {line_no}: {exc}", line=line_no + 1) from None
