"""``pmlm split-table``: train / valid / test files of a labelled table (a user's task, ``pmlm.tasks.labelled``).

Either the table says where each row goes (``--split-column``: values train, valid, test) or the rows are split by
sequence identity as the structures are (``pmlm.data.structsplit.assign_sides``; docs/tasks.md, "Your own labelled
data"). Each side is written as Parquet with every column of the input in its type (a CSV / TSV's types inferred:
integers stay integers, numbers floats, and the sequence and split columns text), rows in input order, plus
``source_line`` (``source_row`` for a Parquet input) and the input's path in the schema metadata (key ``pmlm``), so
that a reader names a bad row by the user's file and line (``pmlm.tasks.labelled.RowPlaces``);
``table_split_stats.json`` says what went where.

An empty (or blank) sequence is refused, in one line naming the input and the line, as is a split value other than
train, valid or test; splitting by identity refuses any letter that is no residue too.
"""

from __future__ import annotations

import json
import sys

import pyarrow as pa
import pyarrow.parquet as pq

from pmlm.data.split import SplitConfig
from pmlm.data.structsplit import SIDES, assign_sides, check_fractions, split_settings
from pmlm.errors import InputError
from pmlm.outputs import folder_target, writing_folder
from pmlm.tasks.labelled import SOURCE_KEY, SOURCE_LINE, SOURCE_ROW, RowPlaces, is_parquet, load_table
from pmlm.tasks.structures import ReadCounts, RecordError
from pmlm.tasks.tape import residue_string

SPLIT_TABLE_COMMAND = "pmlm split-table"


def split_table(
    path: str,
    out_dir: str,
    *,
    sequence_column: str = "sequence",
    split_column: str | None = None,
    cfg: SplitConfig | None = None,
    fractions: tuple[float, float, float] = (0.8, 0.1, 0.1),
    log=None,
    overwrite: bool = False,
) -> dict:
    """train/valid/test.parquet and table_split_stats.json of the table ``path`` into the folder ``out_dir``, a
    folder of its own (pmlm.outputs: checked before any work, the files appear together)."""
    import pandas as pd  # as load_table, on use only: missing cells are None, NaN or pandas' NA

    log = log or sys.stderr
    out = folder_target(out_dir, command=SPLIT_TABLE_COMMAND, option="--out-dir", overwrite=overwrite)
    required = {sequence_column: "--sequence-column"} | ({split_column: "--split-column"} if split_column else {})
    frame = load_table(path, None, required, typed=True, text=tuple(required))
    places = RowPlaces(path, len(frame))
    sequences = ["" if pd.isna(seq) else str(seq) for seq in frame[sequence_column].tolist()]
    for row, seq in enumerate(sequences):
        if not seq.strip():
            raise places.error(row, f"empty sequence in column {sequence_column!r}")
    if split_column:
        side = []
        for row, value in enumerate(frame[split_column].tolist()):
            if value not in SIDES:
                shown = value if isinstance(value, str) else ""
                raise places.error(row, f"{split_column} is {shown!r}, expected one of {', '.join(SIDES)}")
            side.append(value)
        method, dropped, clusters = {"split_column": split_column}, {"valid": 0, "test": 0}, None
    else:
        check_fractions(fractions, "split-table")
        counts = ReadCounts()
        seqs = []
        for row, seq in enumerate(sequences):
            try:
                seqs.append(residue_string(seq.strip(), counts))
            except RecordError as exc:
                raise places.error(row, str(exc)) from None
        names = [str(i) for i in range(len(seqs))]
        side, rep_of, dropped = assign_sides(names, seqs, cfg, fractions, out.parent, log)
        clusters = len(set(rep_of.tolist()))
        method = split_settings(cfg, fractions)
    table = _typed_table(path, frame, places)
    stats = {"input": str(path), "config": method, "rows": len(side), "clusters": clusters, "dropped": dropped}
    with writing_folder(out, command=SPLIT_TABLE_COMMAND, option="--out-dir", overwrite=overwrite) as staged:
        for name in SIDES:
            keep = [i for i, s in enumerate(side) if s == name]
            stats[name] = {"rows": len(keep)}
            pq.write_table(table.take(pa.array(keep, type=pa.int64())), staged / f"{name}.parquet")
        (staged / "table_split_stats.json").write_text(json.dumps(stats, indent=2) + "\n")
    return stats


def _typed_table(path: str, frame, places: RowPlaces) -> pa.Table:
    """The input's columns in their types (text as string), plus the source line (or row) of every row, with the
    input named in the schema metadata."""
    column = SOURCE_ROW if is_parquet(path) else SOURCE_LINE
    if column in frame.columns:
        raise InputError(path, f"a column is named {column!r}, the column pmlm split-table adds; rename it")
    table = pa.Table.from_pandas(frame, preserve_index=False)
    fields = [f.with_type(pa.string()) if f.type == pa.large_string() else f for f in table.schema]
    table = table.cast(pa.schema(fields, metadata=table.schema.metadata))
    if column == SOURCE_ROW or places.lines is None:
        sources = [row + (1 if column == SOURCE_ROW else 2) for row in range(table.num_rows)]
    else:
        sources = places.lines
    table = table.append_column(column, pa.array(sources, pa.int64()))
    origin = {"source": str(path), "source_column": column}
    return table.replace_schema_metadata({**(table.schema.metadata or {}), SOURCE_KEY: json.dumps(origin)})
