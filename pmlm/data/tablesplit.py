"""``pmlm split-table``: train / valid / test files of a labelled table (a user's task, ``pmlm.tasks.labelled``).

Either the table says where each row goes (``--split-column``: values train, valid, test; any other value is an
error naming its line) or the rows are split by sequence identity as the structures are
(``pmlm.data.structsplit.assign_sides``: MMseqs2 clusters drawn whole to one side, then every held-out sequence
that still hits a training one at ``--min-seq-id`` dropped and counted). Each side is written as Parquet with every
column of the input, rows in input order; ``table_split_stats.json`` says what went where.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from pmlm.data.split import SplitConfig
from pmlm.data.structsplit import SIDES, assign_sides, check_fractions, split_settings
from pmlm.files import atomic_output
from pmlm.tasks.labelled import load_table, row_error
from pmlm.tasks.structures import ReadCounts, RecordError
from pmlm.tasks.tape import residue_string


def split_table(
    path: str,
    out_dir: str,
    *,
    sequence_column: str = "sequence",
    split_column: str | None = None,
    cfg: SplitConfig | None = None,
    fractions: tuple[float, float, float] = (0.8, 0.1, 0.1),
    log=None,
) -> dict:
    log = log or sys.stderr
    required = {sequence_column: "--sequence-column"} | ({split_column: "--split-column"} if split_column else {})
    frame = load_table(path, None, required)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if split_column:
        side = []
        for row, value in enumerate(frame[split_column].tolist()):
            if value not in SIDES:
                raise row_error(path, row, f"{split_column} is {value!r}, expected one of {', '.join(SIDES)}")
            side.append(value)
        method, dropped, clusters = {"split_column": split_column}, {"valid": 0, "test": 0}, None
    else:
        check_fractions(fractions, "split-table")
        counts = ReadCounts()
        seqs = []
        for row, seq in enumerate(frame[sequence_column].tolist()):
            try:
                seqs.append(residue_string("" if seq is None else str(seq).strip(), counts))
            except RecordError as exc:
                raise row_error(path, row, str(exc)) from None
        names = [str(i) for i in range(len(seqs))]
        side, rep_of, dropped = assign_sides(names, seqs, cfg, fractions, out, log)
        clusters = len(set(rep_of.tolist()))
        method = split_settings(cfg, fractions)
    table = pa.Table.from_pandas(frame, preserve_index=False)
    stats = {"input": str(path), "config": method, "rows": len(side), "clusters": clusters, "dropped": dropped}
    for name in SIDES:
        keep = [i for i, s in enumerate(side) if s == name]
        stats[name] = {"rows": len(keep)}
        with atomic_output(out / f"{name}.parquet") as tmp:
            pq.write_table(table.take(pa.array(keep, type=pa.int64())), tmp)
    with atomic_output(out / "table_split_stats.json") as tmp:
        Path(tmp).write_text(json.dumps(stats, indent=2) + "\n")
    return stats
