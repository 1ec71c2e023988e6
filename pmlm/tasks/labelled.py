"""A user's labelled sequences as a table: CSV, TSV (either optionally gzipped) or Parquet, one protein per row.

Columns (names set by ``data.sequence_column``, ``data.label_column``, ``data.id_column``), the labels per task and
the classes: docs/tasks.md, "Your own labelled data". The id is the 1-based row number when its column is absent;
a per-residue label list may be a Parquet list column or a JSON list such as ``[0, 1, null]`` in a CSV cell.

A bad record raises one line naming the file and its line (CSV / TSV: the header is line 1; a blank line counts, a
quoted cell may span lines) or row (Parquet), or with ``data.on_error: skip`` is counted by reason. A split file of
``pmlm split-table`` names its source table in its schema metadata (key ``pmlm``) and carries each row's line there
(column ``source_line``; ``source_row`` for a Parquet source): its bad rows are named by the source table's line.
"""

from __future__ import annotations

import csv
import gzip
import json
import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from pmlm import alphabet
from pmlm.choices import Choice
from pmlm.errors import InputError
from pmlm.evaluation.metrics import IGNORE_LABEL
from pmlm.tasks.structures import RecordError
from pmlm.tasks.tape import residue_string
from pmlm.tasks.task import Example

SEQUENCE_SETTING, LABEL_SETTING = "data.sequence_column", "data.label_column"  # the recipe keys naming the columns
TABLE_SUFFIXES = (".csv", ".csv.gz", ".tsv", ".tsv.gz", ".parquet", ".pq")
# a split file's record of where its rows came from (pmlm split-table): the schema metadata key holding the source
# table ({"source": PATH, "source_column": SOURCE_LINE or SOURCE_ROW}) and the columns of 1-based lines / rows
SOURCE_KEY = b"pmlm"
SOURCE_LINE, SOURCE_ROW = "source_line", "source_row"


def is_table(path: str | Path) -> bool:
    return Path(path).name.lower().endswith(TABLE_SUFFIXES)


def is_parquet(path: str | Path) -> bool:
    return Path(path).name.lower().endswith((".parquet", ".pq"))


def text_table_lines(path: str | Path) -> list[int]:
    """The 1-based line each data row of a CSV / TSV (optionally gzipped) file starts on: the header is line 1,
    blank lines are no rows (as pandas skips them) and a quoted cell may span lines."""
    path = Path(path)
    delimiter = "\t" if path.name.lower().endswith((".tsv", ".tsv.gz")) else ","
    opener = gzip.open if path.name.lower().endswith(".gz") else open
    lines = []
    with opener(path, "rt", encoding="utf-8-sig", newline="") as fh:
        reader = csv.reader(fh, delimiter=delimiter)
        before, header = 0, False
        for record in reader:
            if record and not (len(record) == 1 and not record[0].strip()):
                if header:
                    lines.append(before + 1)
                header = True
            before = reader.line_num
    return lines


class RowPlaces:
    """Where the data rows of a table file are, for one-line errors: the line of each row in a CSV / TSV, its row
    in Parquet, and in a split file of ``pmlm split-table`` the line (or row) of its source table, the split file
    named beside."""

    def __init__(self, path: str | Path, rows: int):
        self.path, self.lines, self.source = str(path), None, None
        if not is_parquet(path):
            try:
                lines = text_table_lines(path)
            except (OSError, EOFError, UnicodeDecodeError, csv.Error):
                lines = None  # pandas read it: lines counted as rows below
            self.lines = lines if lines is not None and len(lines) == rows else None
            return
        import pyarrow.parquet as pq  # as pandas, on use only

        meta = pq.read_schema(path).metadata or {}
        try:
            origin = json.loads(meta[SOURCE_KEY]) if SOURCE_KEY in meta else None
            column = origin["source_column"] if origin else None
        except (json.JSONDecodeError, KeyError, TypeError):
            origin = column = None
        if column in (SOURCE_LINE, SOURCE_ROW) and column in pq.read_schema(path).names:
            places = pq.read_table(path, columns=[column]).column(0).to_pylist()
            if len(places) == rows:
                self.source = (str(origin["source"]), column, places)

    def error(self, row: int, message: str) -> InputError:
        """The one-line error of 0-based data row ``row``."""
        if self.source is not None:
            source, column, places = self.source
            beside = f"{message} ({self.path} row {row + 1})"
            if places[row] is None:
                return InputError(self.path, f"row {row + 1}: {message}")
            if column == SOURCE_ROW:
                return InputError(source, f"row {places[row]}: {beside}")
            return InputError(source, beside, line=places[row])
        if self.lines is not None:
            return InputError(self.path, message, line=self.lines[row])
        if is_parquet(self.path):
            return InputError(self.path, f"row {row + 1}: {message}")
        return InputError(self.path, message, line=row + 2)  # lines unknown: the header is line 1, rows follow


def load_table(path: str | Path, columns: list[str] | None, required: dict[str, str], *, typed: bool = False, text=()):
    """The named columns (None: all) of a table file as a pandas DataFrame of Python objects (absent optional
    columns left out); an unreadable file or a missing required column is one InputError. ``required``: column ->
    the setting that names it (what the error tells to set). ``typed``: a CSV / TSV's column types inferred (ints,
    floats, booleans, text; nullable, an empty cell missing) but for the ``text`` columns, and the columns kept in
    their types rather than as Python objects; otherwise every CSV / TSV cell is text."""
    import pandas as pd  # only table tasks read tables; the other readers never need pandas

    path = Path(path)
    if not path.exists():
        raise InputError(path, "no such file or directory")
    name = path.name.lower()
    try:
        if name.endswith((".parquet", ".pq")):
            import pyarrow.parquet as pq  # as pandas, on use only

            present = set(pq.read_schema(path).names)
            wanted = None if columns is None else [c for c in columns if c in present]
            frame = pq.read_table(path, columns=wanted).to_pandas()
        else:
            sep = "\t" if name.endswith((".tsv", ".tsv.gz")) else ","
            types = {"dtype": dict.fromkeys(text, str), "dtype_backend": "numpy_nullable"} if typed else {"dtype": str}
            frame = pd.read_csv(path, sep=sep, keep_default_na=False, na_values=[""], **types)
    except (OSError, EOFError, ValueError, pd.errors.ParserError) as exc:
        raise InputError(path, f"cannot read the table: {exc}") from None
    missing = [c for c in required if c not in frame.columns]
    if missing:
        found = ", ".join(map(str, frame.columns)) or "none"
        raise InputError(path, f"no column {missing[0]!r} (set {required[missing[0]]}; found: {found})")
    frame = frame[[c for c in (columns or frame.columns) if c in frame.columns]]
    return frame if typed else frame.astype(object)


def _missing(value) -> bool:
    """None, NaN, or pandas' NA (a nullable column's missing value)."""
    return value is None or (isinstance(value, float) and math.isnan(value)) or type(value).__name__ == "NAType"


def _class_text(value) -> str:
    """A class label's name: integers as integers (2.0 -> '2'), text stripped."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return str(int(value))
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        return str(int(value))
    return str(value).strip()


def _residue_classes(value, length: int | None) -> list:
    """Per-residue labels of one cell: a string (a class per letter) or a list (null = no label); ``length``, the
    residues they must match (None: any)."""
    if isinstance(value, str) and value.lstrip().startswith("["):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise RecordError(f"the label is not a JSON list ({exc.msg})", "bad label") from None
    items = list(value) if isinstance(value, (str, list, tuple, np.ndarray)) else None
    if items is None:
        raise RecordError(f"per-residue labels must be a string or a list, got {value!r}", "bad label")
    if length is not None and len(items) != length:
        raise RecordError(f"{len(items)} per-residue labels for {length} residues", "length mismatch")
    return [None if _missing(v) else _class_text(v) for v in items]


def _sorted_classes(names: set[str]) -> tuple[str, ...]:
    if names and all(n.lstrip("-").isdigit() for n in names):
        return tuple(sorted(names, key=int))
    return tuple(sorted(names))


class LabelKind(Choice):
    """What a table's label column holds, by task: how a cell becomes an ``Example``'s label."""

    VALUE = "value"  # one number per protein
    CLASS = "class"  # one class per protein
    RESIDUE_LABELS = "residue labels"  # one class per residue

    def class_names(self, value) -> list[str]:
        """The class names in one label cell (a classification's)."""
        cells = _residue_classes(value, None) if self is LabelKind.RESIDUE_LABELS else [_class_text(value)]
        return [c for c in cells if c is not None]

    def set_label(self, example: Example, value, class_ids: dict[str, int]) -> None:
        """``example``'s label from its cell ``value`` (classes by ``class_ids``); a bad one is a RecordError."""
        field, parse = _LABELS[self]
        setattr(example, field, parse(value, len(example), class_ids))


def _number(value, length: int, class_ids) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise RecordError(f"label {value!r} is not a number", "bad label") from None
    if not math.isfinite(number):
        raise RecordError(f"label {value!r} is not a finite number", "bad label")
    return number


def _residue_ids(value, length: int, class_ids: dict[str, int]) -> np.ndarray:
    cells = _residue_classes(value, length)
    return np.asarray([IGNORE_LABEL if c is None else _class_id(c, class_ids) for c in cells], dtype=np.int64)


# each kind's Example field and the parse of a cell into it
_LABELS = {
    LabelKind.VALUE: ("value", _number),
    LabelKind.CLASS: ("label", lambda value, length, class_ids: _class_id(_class_text(value), class_ids)),
    LabelKind.RESIDUE_LABELS: ("labels", _residue_ids),
}


def table_classes(path: str | Path, label_kind: LabelKind, options) -> tuple[str, ...]:
    """The distinct class names of a table file's label column (of its first ``options.limit`` rows)."""
    frame = load_table(path, [options.sequence_column, options.label_column], {options.label_column: LABEL_SETTING})
    labels = frame[options.label_column].tolist()[: options.limit or None]
    names: set[str] = set()
    for value in labels:
        if not _missing(value):
            names.update(label_kind.class_names(value))
    if not names:
        raise InputError(path, f"no labels in column {options.label_column!r}")
    return _sorted_classes(names)


def read_table(path: str | Path, label_kind: LabelKind, options, counts) -> Iterator:
    """Yield ``Example``s of a table file; labels as ``label_kind``, classes by ``options.classes`` (their index
    is the class id)."""
    path = Path(path)
    seq_col, label_col, id_col = options.sequence_column, options.label_column, options.id_column
    frame = load_table(path, [id_col, seq_col, label_col], {seq_col: SEQUENCE_SETTING, label_col: LABEL_SETTING})
    ids = frame[id_col].tolist() if id_col in frame.columns else None
    class_ids = {name: i for i, name in enumerate(options.classes or ())}
    places = RowPlaces(path, len(frame))
    for row, (seq, value) in enumerate(zip(frame[seq_col].tolist(), frame[label_col].tolist())):
        name = _class_text(ids[row]) if ids is not None and not _missing(ids[row]) else str(row + 1)
        try:
            if _missing(seq) or not str(seq).strip():
                raise RecordError("empty sequence", "bad sequence")
            residues = residue_string(str(seq).strip(), counts)
            example = Example(name, alphabet.encode(residues))
            if _missing(value):
                raise RecordError(f"no label in column {label_col!r}", "missing label")
            label_kind.set_label(example, value, class_ids)
        except RecordError as exc:
            counts.reject(places.error(row, f"protein {name}: {exc}"), exc.reason, options.on_error)
            continue
        counts.read += 1
        yield example


def _class_id(name: str, class_ids: dict[str, int]) -> int:
    if name not in class_ids:
        known = ", ".join(list(class_ids)[:10]) + (", ..." if len(class_ids) > 10 else "")
        raise RecordError(f"class {name!r} is not one of the head's classes ({known})", "unknown class")
    return class_ids[name]
