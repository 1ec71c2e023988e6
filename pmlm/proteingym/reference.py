"""ProteinGym's reference file (one row per assay), the assays a run scores, and the selection file the workflow
fans out over.

The reference file of the substitution benchmark (``reference_files/DMS_substitutions.csv`` in
OATML-Markslab/ProteinGym) is read as published: a CSV whose columns include ``DMS_id``, ``DMS_filename`` (the
assay's CSV in the archive), ``UniProt_ID``, ``target_seq`` (the sequence the mutants are written against) and
the function category ``coarse_selection_type`` (Activity, Binding, Expression, OrganismalFitness, Stability in
v1.0-v1.3), which ProteinGym aggregates over. Other columns are ignored.

The selection (``pmlm proteingym select``) is a TSV with one row per chosen assay: ``DMS_id``, ``DMS_filename``,
``UniProt_ID``, ``category``, ``seq_len``, ``target_seq``; every assay file it names is in the archive.
"""

from __future__ import annotations

import csv
import difflib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from pmlm import alphabet
from pmlm.data.ziparchive import ZipMembers
from pmlm.errors import ConfigError, InputError
from pmlm.files import atomic_output

CATEGORY_COLUMN = "coarse_selection_type"
REFERENCE_COLUMNS = ("DMS_id", "DMS_filename", "UniProt_ID", "target_seq", CATEGORY_COLUMN)
SELECTION_COLUMNS = ("DMS_id", "DMS_filename", "UniProt_ID", "category", "seq_len", "target_seq")
ALL = "all"


@dataclass(frozen=True)
class Assay:
    """One assay of the benchmark: its id, file in the archive, protein, function category and target sequence."""

    dms_id: str
    filename: str
    uniprot: str
    category: str
    target_seq: str

    def row(self) -> dict:
        return {
            "DMS_id": self.dms_id,
            "DMS_filename": self.filename,
            "UniProt_ID": self.uniprot,
            "category": self.category,
            "seq_len": len(self.target_seq),
            "target_seq": self.target_seq,
        }


def checked_rows(fh: TextIO, where: str, columns: tuple[str, ...], delimiter: str = ","):
    """(line, {column: stripped value}) of every non-blank row of a CSV / TSV open as text whose header holds
    ``columns``; one-line errors naming ``where`` and the line (no header, a missing column, a short row)."""
    reader = csv.reader(fh, delimiter=delimiter)
    try:
        header = next(reader, None)
        if header is None:
            raise InputError(where, "empty file (no header row)", line=1)
        names = [h.strip() for h in header]
        missing = [c for c in columns if c not in names]
        if missing:
            raise InputError(where, f"no column(s) {', '.join(missing)} in the header", line=1)
        index = {c: names.index(c) for c in columns}
        for row in reader:
            if not any(cell.strip() for cell in row):
                continue
            if len(row) != len(names):
                raise InputError(where, f"{len(row)} fields, the header has {len(names)}", line=reader.line_num)
            yield reader.line_num, {c: row[i].strip() for c, i in index.items()}
    except csv.Error as exc:
        raise InputError(where, f"malformed CSV: {exc}", line=reader.line_num) from None


def _rows(path: str, columns: tuple[str, ...], delimiter: str):
    if not Path(path).is_file():
        raise InputError(path, "no such file")
    try:
        with open(path, newline="", encoding="utf-8-sig") as fh:
            yield from checked_rows(fh, path, columns, delimiter)
    except UnicodeDecodeError:
        raise InputError(path, "not UTF-8 text") from None


def _checked_target(path: str, dms_id: str, seq: str, line: int) -> str:
    bad = sorted(set(seq) - set(alphabet.RESIDUES))
    if not seq or bad:
        what = "is empty" if not seq else f"holds {''.join(bad)!r}, not one of the 20 residues {alphabet.RESIDUES}"
        raise InputError(path, f"{dms_id}: target_seq {what}", line=line)
    return seq


def read_reference(path: str | os.PathLike) -> list[Assay]:
    """Every assay of a ProteinGym reference file, in file order."""
    path = str(path)
    out, seen = [], {}
    for line, row in _rows(path, REFERENCE_COLUMNS, ","):
        for column in REFERENCE_COLUMNS:
            if not row[column]:
                raise InputError(path, f"empty {column}", line=line)
        if row["DMS_id"] in seen:
            raise InputError(
                path, f"duplicate DMS_id {row['DMS_id']!r} (first at line {seen[row['DMS_id']]})", line=line
            )
        seen[row["DMS_id"]] = line
        out.append(
            Assay(
                row["DMS_id"],
                row["DMS_filename"],
                row["UniProt_ID"],
                row[CATEGORY_COLUMN],
                _checked_target(path, row["DMS_id"], row["target_seq"], line),
            )
        )
    if not out:
        raise InputError(path, "no assays after the header")
    return out


def select_assays(assays: list[Assay], chosen: str | list[str] = ALL, max_length: int | None = None) -> list[Assay]:
    """The assays named in ``chosen`` (in that order) or all of them, those with a target longer than
    ``max_length`` residues left out; ConfigError for an unknown id or an empty selection."""
    by_id = {a.dms_id: a for a in assays}
    if chosen == ALL:
        picked = list(assays)
    elif isinstance(chosen, (list, tuple)) and chosen:
        unknown = [name for name in chosen if name not in by_id]
        if unknown:
            close = difflib.get_close_matches(unknown[0], by_id, n=3)
            hint = f" (closest: {', '.join(close)})" if close else ""
            raise ConfigError(f"proteingym assays: {', '.join(unknown)} not in the reference file{hint}")
        picked = [by_id[name] for name in dict.fromkeys(chosen)]
    else:
        raise ConfigError(f"proteingym assays must be 'all' or a list of DMS_id values, got {chosen!r}")
    if max_length is not None:
        picked = [a for a in picked if len(a.target_seq) <= max_length]
    if not picked:
        raise ConfigError(f"no assay is selected (max_length {max_length}): nothing to score")
    return picked


def write_selection(path: str | os.PathLike, assays: list[Assay]) -> None:
    with atomic_output(path) as tmp, open(tmp, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=SELECTION_COLUMNS, delimiter="\t", lineterminator="\n")
        writer.writeheader()
        writer.writerows(a.row() for a in assays)


def read_selection(path: str | os.PathLike) -> list[Assay]:
    path = str(path)
    out = [
        Assay(
            row["DMS_id"],
            row["DMS_filename"],
            row["UniProt_ID"],
            row["category"],
            _checked_target(path, row["DMS_id"], row["target_seq"], line),
        )
        for line, row in _rows(path, SELECTION_COLUMNS, "\t")
    ]
    if not out:
        raise InputError(path, "no assays after the header")
    return out


def find_assay(assays: list[Assay], dms_id: str, path: str) -> Assay:
    for assay in assays:
        if assay.dms_id == dms_id:
            return assay
    raise InputError(path, f"no assay {dms_id!r} in the selection")


def select(
    reference: str | Path, archive: str | Path, out: str | Path, *, assays: str = ALL, max_length: int | None = None
) -> list[Assay]:
    """The assays of ``reference`` chosen by ``assays`` (``all`` or comma-separated DMS_id values) and
    ``max_length``, each checked to be in the zip ``archive``; written to the selection TSV ``out``."""
    chosen = ALL if assays == ALL else [a for a in assays.split(",") if a]
    selected = select_assays(read_reference(reference), chosen, max_length)
    with ZipMembers(archive) as members:
        for assay in selected:
            members.member(assay.filename)  # an assay file missing from the archive fails here, before any scoring
    write_selection(out, selected)
    return selected
