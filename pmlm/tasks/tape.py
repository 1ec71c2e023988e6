"""Readers for TAPE's task data (ProteinNet contacts, secondary structure, remote homology, fluorescence, stability)
from its JSON archives, or from its LMDB files when the optional ``lmdb`` package is installed.

Layout (TAPE's archives unpack to one folder per task)::

    <root>/<task>/<task>_<split>.json    a single JSON list of record objects
    <root>/<task>/<task>_<split>.lmdb    LMDB: b"num_examples" and b"0".. b"N-1" -> pickled dict

Record keys read (others, e.g. ``evolutionary``, are ignored):

- proteinnet: ``primary`` (str), ``tertiary`` C-alpha coordinates in Angstrom, (L, 3)
  (aliases accepted: a flat list of 3L numbers; (L, 3, 3) per-residue N/CA/C or (3L, 3)
  interleaved N/CA/C rows, from which CA is taken), ``valid_mask`` (L booleans / 0-1;
  absent = all resolved). Contacts use C-alpha at distance <= 8 A (the design's rule and
  TAPE's TensorFlow parser; TAPE's PyTorch loader uses < 8.0, which differs only for
  distances of exactly 8.0). Units are checked through the median
  spacing of consecutive resolved C-alpha atoms (~3.8 A): coordinates in ProteinNet's raw
  hundredths of an Angstrom are rescaled (a counted repair), anything else is an error.
- secondary_structure: ``primary``, ``ss3`` (L labels H=0, E=1, C=2, or an "HEC" string),
  optional ``ss8`` and ``valid_mask`` (NetSurfP's evaluation mask; TAPE's code scores every
  residue, so it is kept on the record but not applied by the reader).
- remote_homology: ``primary``, ``fold_label`` (int, 1,195 folds), optional
  ``superfamily_label``, ``family_label``, ``class_label``.
- fluorescence: ``primary``, ``log_fluorescence`` (one number, or a 1-element list as TAPE's
  files hold it), optional ``num_mutations``; splits train, valid, test.
- stability: ``primary``, ``stability_score`` (one number or a 1-element list), optional
  ``topology``, ``parent``; splits train, valid, test.

Every record may carry ``id`` (default: its 0-based index) and ``protein_length`` (checked
against ``primary``). Lowercase residues are uppercased and the non-standard letters of
``pmlm.alphabet.NONSTANDARD_MAP`` mapped: counted repairs. LMDB values are unpickled with
an allow-list (dicts, lists, numbers, strings, numpy arrays) so no code runs on load.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pmlm.alphabet import NONSTANDARD_MAP
from pmlm.errors import InputError
from pmlm.tasks.pickles import lmdb_items
from pmlm.tasks.structures import (
    ON_ERROR_CHOICES,
    SEQ_LETTERS,
    SS3_STATES,
    ReadCounts,
    RecordError,
    open_text,
)

# TAPE's task names, as its archives and split files spell them
PROTEINNET = "proteinnet"
SECONDARY_STRUCTURE = "secondary_structure"
REMOTE_HOMOLOGY = "remote_homology"
FLUORESCENCE = "fluorescence"
STABILITY = "stability"
# the key of each regression task's value: a number or a 1-element list, as TAPE stores it
REGRESSION_KEYS = {FLUORESCENCE: "log_fluorescence", STABILITY: "stability_score"}
NUM_FOLDS = 1195  # remote homology fold classes
# Consecutive resolved C-alpha atoms sit ~3.8 A apart (2.9 A for cis peptides); a median far
# outside this window means other units (ProteinNet's raw files store hundredths of A).
_CA_SPACING_RANGE = (2.0, 6.0)
_PROTEINNET_UNITS_PER_ANGSTROM = 100.0
_MIN_SPACINGS = 3  # fewer consecutive resolved pairs than this: too little to judge units


@dataclass
class ProteinNetRecord:
    id: str
    primary: str
    tertiary: np.ndarray  # (L, 3) C-alpha, Angstrom; NaN rows where not valid
    valid_mask: np.ndarray  # (L,) bool: residue resolved


@dataclass
class SecondaryStructureRecord:
    id: str
    primary: str
    ss3: np.ndarray  # (L,) int64, H=0 E=1 C=2
    valid_mask: np.ndarray  # (L,) bool, NetSurfP evaluation mask (all True when absent)
    ss8: np.ndarray | None = None  # (L,) int64 in TAPE's GHIBESTC order, when present


@dataclass
class RegressionRecord:
    id: str
    primary: str
    value: float  # log_fluorescence (fluorescence) or stability_score (stability)


@dataclass
class RemoteHomologyRecord:
    id: str
    primary: str
    fold_label: int
    superfamily_label: int | None = None
    family_label: int | None = None
    class_label: int | None = None


def _primary(item: dict, counts: ReadCounts) -> str:
    seq = item.get("primary")
    if not isinstance(seq, str) or not seq:
        raise RecordError("'primary' must be a non-empty amino-acid string", "bad sequence")
    mapped = residue_string(seq, counts, field="'primary'")
    length = item.get("protein_length")
    if length is not None:
        length = int(np.asarray(length).reshape(-1)[0])  # TAPE stores it as int or a 1-element array
        if length != len(mapped):
            raise RecordError(f"'protein_length' {length} != length of 'primary' {len(mapped)}", "length mismatch")
    return mapped


def residue_string(seq: str, counts: ReadCounts, field: str = "the sequence") -> str:
    """``seq`` uppercased with the non-standard letters mapped (counted repairs); another letter or an empty
    string is a RecordError."""
    if not seq:
        raise RecordError(f"{field} is empty", "bad sequence")
    upper = seq.upper()
    if upper != seq:
        counts.repaired["lowercase residues uppercased"] += sum(c.islower() for c in seq)
    mapped = "".join(NONSTANDARD_MAP.get(c, c) for c in upper)
    if mapped != upper:
        counts.repaired["non-standard residues mapped"] += sum(a != b for a, b in zip(mapped, upper))
    bad = next((i for i, c in enumerate(mapped) if c not in SEQ_LETTERS), None)
    if bad is not None:
        raise RecordError(f"{field} has non-residue letter {seq[bad]!r} at position {bad + 1}", "bad sequence")
    return mapped


def _numeric(value, key: str, dtype) -> np.ndarray:
    try:
        arr = np.asarray(value, dtype=dtype)
    except (TypeError, ValueError):
        raise RecordError(f"'{key}' must be numeric", "bad field") from None
    return arr


def _per_residue(item: dict, key: str, length: int, dtype, required: bool) -> np.ndarray | None:
    if item.get(key) is None:
        if required:
            raise RecordError(f"missing key '{key}'", "missing key")
        return None
    arr = _numeric(item[key], key, dtype)
    if arr.shape != (length,):
        raise RecordError(f"'{key}' has shape {arr.shape}, expected ({length},) to match 'primary'", "length mismatch")
    return arr


def _int_label(item: dict, key: str, required: bool) -> int | None:
    value = item.get(key)
    if value is None:
        if required:
            raise RecordError(f"missing key '{key}'", "missing key")
        return None
    arr = np.asarray(value).reshape(-1)
    if arr.size != 1 or not np.issubdtype(arr.dtype, np.integer):
        raise RecordError(f"'{key}' must be one integer, got {value!r}", "bad field")
    return int(arr[0])


def _tertiary(item: dict, length: int) -> np.ndarray:
    if item.get("tertiary") is None:
        raise RecordError("missing key 'tertiary'", "missing key")
    arr = _numeric(item["tertiary"], "tertiary", np.float64)
    if arr.shape == (length * 3,):
        arr = arr.reshape(length, 3)
    elif arr.shape == (length, 3, 3):
        arr = arr[:, 1]  # per residue N, CA, C -> CA
    elif arr.shape == (3 * length, 3):
        arr = arr[1::3]  # ProteinNet's interleaved N, CA, C rows -> CA
    if arr.shape != (length, 3):
        raise RecordError(
            f"'tertiary' has shape {arr.shape}, expected ({length}, 3) C-alpha coordinates", "length mismatch"
        )
    return arr


def _angstrom(ca: np.ndarray, valid: np.ndarray, counts: ReadCounts) -> np.ndarray:
    """Check the units through the C-alpha spacing; rescale (counted) ProteinNet's raw units."""
    both = valid[:-1] & valid[1:]
    if both.sum() < _MIN_SPACINGS:
        return ca
    spacing = float(np.median(np.linalg.norm(ca[1:][both] - ca[:-1][both], axis=1)))
    low, high = _CA_SPACING_RANGE
    if low <= spacing <= high:
        return ca
    if low <= spacing / _PROTEINNET_UNITS_PER_ANGSTROM <= high:
        counts.repaired["coordinates rescaled from hundredths of Angstrom"] += 1
        return ca / _PROTEINNET_UNITS_PER_ANGSTROM
    raise RecordError(
        f"median distance between consecutive C-alpha atoms is {spacing:.3g}, expected about 3.8 "
        "(coordinates must be in Angstrom)",
        "bad coordinates",
    )


def parse_proteinnet(item: dict, counts: ReadCounts) -> ProteinNetRecord:
    primary = _primary(item, counts)
    length = len(primary)
    tertiary = _tertiary(item, length)
    mask = _per_residue(item, "valid_mask", length, np.float64, required=False)
    valid = np.ones(length, dtype=bool) if mask is None else mask.astype(bool)
    valid &= np.isfinite(tertiary).all(axis=1)
    tertiary = _angstrom(np.where(valid[:, None], tertiary, np.nan), valid, counts)
    return ProteinNetRecord(id=str(item.get("id")), primary=primary, tertiary=tertiary, valid_mask=valid)


def parse_secondary_structure(item: dict, counts: ReadCounts) -> SecondaryStructureRecord:
    primary = _primary(item, counts)
    length = len(primary)
    raw = item.get("ss3")
    if isinstance(raw, str):
        bad = next((i for i, c in enumerate(raw) if c not in SS3_STATES), None)
        if bad is not None:
            raise RecordError(
                f"'ss3' has letter {raw[bad]!r} at position {bad + 1}, expected one of {SS3_STATES}", "bad field"
            )
        raw = [SS3_STATES.index(c) for c in raw]
        item = {**item, "ss3": raw}
    ss3 = _per_residue(item, "ss3", length, np.int64, required=True)
    if ss3.min() < 0 or ss3.max() >= len(SS3_STATES):
        raise RecordError(f"'ss3' labels must be 0..{len(SS3_STATES) - 1}", "bad field")
    ss8 = _per_residue(item, "ss8", length, np.int64, required=False)
    mask = _per_residue(item, "valid_mask", length, np.float64, required=False)
    valid = np.ones(length, dtype=bool) if mask is None else mask.astype(bool)
    return SecondaryStructureRecord(id=str(item.get("id")), primary=primary, ss3=ss3, valid_mask=valid, ss8=ss8)


def parse_remote_homology(item: dict, counts: ReadCounts) -> RemoteHomologyRecord:
    primary = _primary(item, counts)
    fold = _int_label(item, "fold_label", required=True)
    if not 0 <= fold < NUM_FOLDS:
        raise RecordError(f"'fold_label' {fold} outside 0..{NUM_FOLDS - 1}", "bad field")
    return RemoteHomologyRecord(
        id=str(item.get("id")),
        primary=primary,
        fold_label=fold,
        superfamily_label=_int_label(item, "superfamily_label", required=False),
        family_label=_int_label(item, "family_label", required=False),
        class_label=_int_label(item, "class_label", required=False),
    )


def _regression_parser(task: str):
    key = REGRESSION_KEYS[task]

    def parse(item: dict, counts: ReadCounts) -> RegressionRecord:
        primary = _primary(item, counts)
        if item.get(key) is None:
            raise RecordError(f"missing key '{key}'", "missing key")
        value = _numeric(item[key], key, np.float64).reshape(-1)
        if value.size != 1 or not np.isfinite(value[0]):
            raise RecordError(f"'{key}' must be one finite number, got {item[key]!r}", "bad field")
        return RegressionRecord(id=str(item.get("id")), primary=primary, value=float(value[0]))

    return parse


PARSERS = {
    PROTEINNET: parse_proteinnet,
    SECONDARY_STRUCTURE: parse_secondary_structure,
    REMOTE_HOMOLOGY: parse_remote_homology,
    FLUORESCENCE: _regression_parser(FLUORESCENCE),
    STABILITY: _regression_parser(STABILITY),
}


def _json_items(path: Path) -> Iterator[tuple[int, object]]:
    try:
        with open_text(path) as fh:
            records = json.load(fh)
    except json.JSONDecodeError as exc:
        raise InputError(path, f"bad JSON: {exc.msg} (column {exc.colno})", line=exc.lineno) from None
    except (EOFError, OSError, UnicodeDecodeError) as exc:
        raise InputError(path, f"unreadable: {exc}") from None
    if not isinstance(records, list):
        raise InputError(path, f"a TAPE JSON file holds one list of records, found a {type(records).__name__}")
    yield from enumerate(records)


def read_tape(
    path: str | os.PathLike, task: str, *, on_error: str = "raise", counts: ReadCounts | None = None
) -> Iterator[ProteinNetRecord | SecondaryStructureRecord | RemoteHomologyRecord | RegressionRecord]:
    """Yield validated records of one TAPE split file (``.json``/``.json.gz`` or ``.lmdb``).

    Bad records raise InputError naming the file and the 0-based record index, or with
    on_error="skip" are counted by reason in ``counts``. A file that cannot be parsed at all
    always raises.
    """
    if task not in PARSERS:
        raise ValueError(f"task must be one of {tuple(PARSERS)}, got {task!r}")
    if on_error not in ON_ERROR_CHOICES:
        raise ValueError(f"on_error must be one of {ON_ERROR_CHOICES}, got {on_error!r}")
    path = Path(path)
    if not path.exists():
        raise InputError(path, "no such file or directory")
    counts = ReadCounts() if counts is None else counts
    parse = PARSERS[task]
    items = lmdb_items(path) if path.suffix == ".lmdb" else _json_items(path)
    for index, item in items:
        try:
            if not isinstance(item, dict):
                raise RecordError(f"expected an object, got {type(item).__name__}", "not an object")
            if "id" not in item or item["id"] is None:
                item = {**item, "id": str(index)}
            elif isinstance(item["id"], bytes):
                item = {**item, "id": item["id"].decode("utf-8", "replace")}
            record = parse(item, counts)
        except RecordError as exc:
            counts.reject(
                InputError(path, f"record {index} (id {item.get('id') if isinstance(item, dict) else '?'}): {exc}"),
                exc.reason,
                on_error,
            )
            continue
        counts.read += 1
        yield record
