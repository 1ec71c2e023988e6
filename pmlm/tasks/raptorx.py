"""Reader for RaptorX / ESM-style contact test sets: per-protein sequence plus C-beta
coordinates, a C-beta distance matrix or a contact map, in a small documented format.

The real RaptorX-Contact test set (Wang et al. 2017) is distributed by its authors as
per-target PDB and FASTA files; ESM evaluates it (and its SCOPe structural split) from
per-domain pickles holding ``seq``, ``ssp``, ``dist`` (C-beta distances, NaN where a C-beta
is missing) and ``coords``. Convert such sources to one of these inputs (contacts always
from C-beta, virtual C-beta for glycine, distance <= 8 A):

- a directory of ``<id>.npz`` files, or one ``.npz``: ``seq`` (0-d string array) and one
  of ``cb`` (L, 3) float with NaN rows for unresolved residues, ``distances`` (L, L) float
  with NaN where unknown, ``contacts`` (L, L) int with -1 where unknown; optional ``id``.
  Loaded with ``allow_pickle=False``.
- ``.pkl`` files in ESM's layout (``seq`` plus ``dist``), decoded with an allow-list
  unpickler so no code runs on load.
- ``.pkl`` files as RaptorX distributes its data sets (Python 2 cPickle; see its
  ``DL4DistancePrediction2/DataProcessor.py`` and ``config.py``): a list of dicts, one per
  protein, with ``name``, ``sequence`` and ``atomDistMatrix`` (a dict of (L, L) matrices by atom
  pair; ``CbCb`` is read, -1 marks an unknown distance). RaptorX's ``CbCb`` uses C-alpha for
  glycine where pmlm's own files use a virtual C-beta; the matrices are used as published.
- a JSONL file (plain or gzip), one object a line: ``id``, ``seq`` and ``cb`` (a list of
  [x, y, z] or null per residue).
"""

from __future__ import annotations

import os
import pickle
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pmlm.errors import InputError
from pmlm.tasks.pickles import safe_unpickle
from pmlm.tasks.structures import (
    CONTACT_THRESHOLD,
    ON_ERROR_CHOICES,
    SEQ_LETTERS,
    ReadCounts,
    RecordError,
    contact_map,
    jsonl_records,
    parse_coords,
)

PER_PROTEIN_SUFFIXES = (".npz", ".pkl")


@dataclass
class ContactRecord:
    id: str
    seq: str
    contacts: np.ndarray  # (L, L) bool, C-beta distance <= threshold and both resolved
    valid: np.ndarray  # (L, L) bool, both residues resolved / distance known


def _check_seq(seq) -> str:
    if isinstance(seq, np.ndarray):
        seq = seq.item() if seq.shape == () else None
    if isinstance(seq, bytes):
        seq = seq.decode("ascii", "replace")
    if not isinstance(seq, str) or not seq:
        raise RecordError("'seq' must be a non-empty amino-acid string", "bad sequence")
    bad = next((i for i, c in enumerate(seq) if c not in SEQ_LETTERS), None)
    if bad is not None:
        raise RecordError(f"'seq' has non-residue letter {seq[bad]!r} at position {bad + 1}", "bad sequence")
    return seq


def _square(value, length: int, key: str) -> np.ndarray:
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise RecordError(f"'{key}' must be a numeric (L, L) matrix", "bad field") from None
    if arr.shape != (length, length):
        raise RecordError(
            f"'{key}' has shape {arr.shape}, expected ({length}, {length}) to match 'seq'", "length mismatch"
        )
    return arr


def _from_coords(value, length: int, key: str, threshold: float) -> tuple[np.ndarray, np.ndarray]:
    if isinstance(value, np.ndarray):
        coords = value.astype(np.float64)
        if coords.shape != (length, 3):
            raise RecordError(
                f"'{key}' has shape {coords.shape}, expected ({length}, 3) to match 'seq'", "length mismatch"
            )
    else:
        coords = parse_coords(value, length, key)
    return contact_map(coords, threshold)


def _from_distances(value, length: int, key: str, threshold: float) -> tuple[np.ndarray, np.ndarray]:
    dist = _square(value, length, key)
    valid = np.isfinite(dist)
    with np.errstate(invalid="ignore"):
        return (dist <= threshold) & valid, valid


def _from_labels(value, length: int, key: str, threshold: float) -> tuple[np.ndarray, np.ndarray]:
    labels = _square(value, length, key)
    if not np.isin(labels, (-1, 0, 1)).all():
        raise RecordError(f"'{key}' values must be 1 (contact), 0 (none) or -1 (unknown)", "bad field")
    return labels == 1, labels >= 0


# Which field defines the contacts when several are present, first wins. ESM's pickles hold
# both ``dist`` and ``coords``; the distance matrix is the one its evaluation reads.
_BUILDERS = {
    "cb": _from_coords,
    "distances": _from_distances,
    "dist": _from_distances,
    "coords": _from_coords,
    "contacts": _from_labels,
}


def record_from_fields(fields: dict, default_id: str, threshold: float = CONTACT_THRESHOLD) -> ContactRecord:
    """Build a ContactRecord from ``seq`` plus the first present of ``cb``, ``distances``,
    ``dist``, ``coords`` (C-beta) or ``contacts``."""
    seq = _check_seq(fields.get("seq"))
    raw_id = fields.get("id", default_id)
    if isinstance(raw_id, np.ndarray):
        raw_id = raw_id.item()
    rec_id = raw_id.decode() if isinstance(raw_id, bytes) else str(raw_id)
    for key in _BUILDERS:
        if fields.get(key) is not None:
            contacts, valid = _BUILDERS[key](fields[key], len(seq), key, threshold)
            return ContactRecord(rec_id, seq, contacts, valid)
    raise RecordError(f"needs one of {', '.join(repr(k) for k in _BUILDERS)}", "missing key")


def _raptorx_fields(item) -> dict:
    """RaptorX's per-protein dict -> the fields read here (C-beta distances, NaN where unknown)."""
    if not isinstance(item, dict) or "sequence" not in item:
        raise RecordError(
            "expected RaptorX's per-protein dict with 'name', 'sequence', 'atomDistMatrix'", "not an object"
        )
    matrices = item.get("atomDistMatrix")
    if not isinstance(matrices, dict) or matrices.get("CbCb") is None:
        raise RecordError("no atomDistMatrix['CbCb'] (C-beta distances) for this protein", "missing key")
    try:
        dist = np.array(matrices["CbCb"], dtype=np.float64)
    except (TypeError, ValueError):
        raise RecordError("atomDistMatrix['CbCb'] must be a numeric (L, L) matrix", "bad field") from None
    dist[dist < 0] = np.nan  # RaptorX writes -1 where a residue has no coordinates
    return {"id": item.get("name"), "seq": item["sequence"], "distances": dist}


def _load_per_protein(path: Path) -> list[dict]:
    """The protein(s) of one file: an NPZ or an ESM pickle hold one, a RaptorX pickle a list."""
    if path.suffix == ".pkl":
        try:
            obj = safe_unpickle(path.read_bytes())
        except (pickle.UnpicklingError, EOFError, ValueError, TypeError, UnicodeDecodeError) as exc:
            raise RecordError(f"cannot decode pickle: {exc}", "unreadable") from None
        if isinstance(obj, list):
            return obj
        if not isinstance(obj, dict):
            raise RecordError(f"expected a dict or RaptorX's list of dicts, got {type(obj).__name__}", "not an object")
        return [obj]
    try:
        with np.load(path, allow_pickle=False) as npz:
            return [{key: npz[key] for key in npz.files}]
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise RecordError(f"cannot read NPZ: {exc}", "unreadable") from None


def _per_protein_records(
    paths: list[Path], threshold: float, on_error: str, counts: ReadCounts
) -> Iterator[ContactRecord]:
    for path in paths:
        try:
            items = _load_per_protein(path)
        except RecordError as exc:
            counts.reject(InputError(path, str(exc)), exc.reason, on_error)
            continue
        listed = len(items) > 1 or (items and isinstance(items[0], dict) and "atomDistMatrix" in items[0])
        for index, item in enumerate(items):
            try:
                fields = _raptorx_fields(item) if listed else item
                record = record_from_fields(fields, f"{path.stem}:{index}" if listed else path.stem, threshold)
            except RecordError as exc:
                counts.reject(InputError(path, f"protein {index}: {exc}" if listed else str(exc)), exc.reason, on_error)
                continue
            counts.read += 1
            yield record


def read_contact_set(
    path: str | os.PathLike,
    *,
    threshold: float = CONTACT_THRESHOLD,
    on_error: str = "raise",
    counts: ReadCounts | None = None,
) -> Iterator[ContactRecord]:
    """Yield ContactRecords from a directory of .npz/.pkl files (sorted by name), one such
    file, or a JSONL file. Bad records raise InputError naming file (and line), or with
    on_error="skip" are counted by reason in ``counts``."""
    if on_error not in ON_ERROR_CHOICES:
        raise ValueError(f"on_error must be one of {ON_ERROR_CHOICES}, got {on_error!r}")
    path = Path(path)
    counts = ReadCounts() if counts is None else counts
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix in PER_PROTEIN_SUFFIXES)
        if not files:
            raise InputError(path, f"directory holds no {' or '.join(PER_PROTEIN_SUFFIXES)} files")
        return _per_protein_records(files, threshold, on_error, counts)
    if not path.exists():
        raise InputError(path, "no such file or directory")
    if path.suffix in PER_PROTEIN_SUFFIXES:
        return _per_protein_records([path], threshold, on_error, counts)
    return jsonl_records(
        path, lambda obj, line_no: record_from_fields(obj, f"{path.name}:{line_no}", threshold), on_error, counts
    )
