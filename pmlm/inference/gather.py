"""The shards' outputs of one encoder gathered into one Parquet file per output (``pmlm gather``), in input order.

The shards are contiguous runs of the input (``pmlm.inference.fasta_shards``) and each command writes its rows in
its input's order, so the shards' files concatenated in shard order are the input's rows in order. Before anything
is written the gather checks that the parts are the manifest's shards' and nothing else (docs/inference.md, "The
outputs"): every shard has its part with the same columns, the same settings (less ``PER_INPUT_KEYS``) and its
shard's records in order, each in one run of rows. The gathered file holds the parts' row groups as they are and
the settings plus ``inference``; written under a temporary name, renamed at the end.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pmlm.data.fasta import read_fasta
from pmlm.errors import InputError
from pmlm.files import file_digest
from pmlm.inference.fasta_shards import Manifest, Shard, ids_digest, read_manifest
from pmlm.inference.output_types import OUTPUTS, PARQUET, Table
from pmlm.outputs import file_target, writing_files

SETTINGS_KEY = b"pmlm"
MODEL_DIGEST = "model_sha256"  # the settings' key of the encoder file's sha256, in every inference command's
ROW_GROUP_BYTES = 64 << 20  # a gathered row group holds the parts' groups up to about this much data
# settings that name or count a part's own input, not how it was computed: they differ from shard to shard (the
# gathered file's `inference` section says them for the whole input)
PER_INPUT_KEYS = frozenset(
    {"fasta", "fasta_sha256", "sequence", "sequence_sha256", "input", "input_sha256", "sequences", "residues",
     "records", "repairs", "unknown_repaired"}
)  # fmt: skip


def settings_of(path: Path, schema: pa.Schema) -> dict:
    raw = (schema.metadata or {}).get(SETTINGS_KEY)
    if raw is None:
        raise InputError(path, "no pmlm settings in the schema metadata: not written by a pmlm command")
    return json.loads(raw)


def _runs(part: Path) -> Iterator[tuple[str, int]]:
    """(id, rows) of each run of equal ids in the part's ``id`` column, in order."""
    current, count = None, 0
    for batch in pq.ParquetFile(part).iter_batches(columns=["id"], batch_size=1 << 16):
        ids = batch.column(0).to_numpy(zero_copy_only=False)
        if not ids.size:
            continue
        starts = np.concatenate([[0], np.flatnonzero(ids[1:] != ids[:-1]) + 1])
        lengths = np.diff(np.append(starts, ids.size))
        for start, n in zip(starts.tolist(), lengths.tolist()):
            if ids[start] == current:
                count += n
                continue
            if current is not None:
                yield current, count
            current, count = ids[start], n
    if current is not None:
        yield current, count


def shard_records(manifest: Manifest, shard: Shard) -> list[tuple[str, int]]:
    """(id, residues) of the shard's records, checked against the manifest's digest of its ids."""
    fasta = manifest.fasta(shard)
    records = [(r.id, len(r.sequence)) for r in read_fasta(fasta)]
    if ids_digest(i for i, _ in records) != shard.ids_sha256:
        raise InputError(fasta, f"its ids are not those {manifest.folder}/manifest.json records for shard {shard.name}")
    return records


def check_rows(part: Path, table: Table, records: list[tuple[str, int]]) -> int:
    """The part's rows against its shard's records (module docstring); returns its row count."""
    position = {seq_id: k for k, (seq_id, _) in enumerate(records)}
    following, rows = 0, 0  # the record the next run of rows may start at
    for seq_id, n in _runs(part):
        rows += n
        k = position.get(seq_id)
        if k is None or k < following:
            where = "not of its shard" if k is None else "twice, or out of order"
            raise InputError(part, f"rows of {seq_id!r}: {where}; this file is not its shard's output")
        if table.rows_of is not None:
            if k != following:
                raise InputError(part, f"record {records[following][0]!r} of its shard has no rows")
            if n != table.rows_of(records[k][1]):
                raise InputError(part, f"record {seq_id!r} has {n} rows, not {table.rows_of(records[k][1])}")
        following = k + 1
    if following < len(records) and table.rows_of is not None:
        raise InputError(part, f"record {records[following][0]!r} of its shard has no rows (the file ends before it)")
    return rows


def _compression(meta: pq.FileMetaData) -> dict[str, str] | str:
    """Each column's codec as the part was written (the first row group's), as ParquetWriter takes it."""
    if meta.num_row_groups == 0:
        return "zstd"
    columns = [meta.row_group(0).column(k) for k in range(meta.num_columns)]
    codecs = {c.path_in_schema.split(".")[0]: c.compression.lower() for c in columns}
    return {name: "none" if codec == "uncompressed" else codec for name, codec in codecs.items()}


def gather(
    output: str,
    shards: str | os.PathLike,
    parts: str | os.PathLike,
    out: str | os.PathLike,
    model: str | os.PathLike | None = None,
    *,
    overwrite: bool = False,
) -> dict:
    """Gather output ``output``'s parts (``parts``/<shard><suffix>) of the shards of ``shards`` (a folder ``pmlm
    shard-fasta`` wrote) into ``out`` (and, for embeddings, its per-sequence file); with ``model`` (the encoder's
    weights) every part must also have been computed by that file. Returns counts for the summary."""
    if output not in OUTPUTS:
        raise InputError(out, f"unknown output {output!r} (one of {', '.join(OUTPUTS)})")
    kind = OUTPUTS[output]
    what = f"gathered {output}"
    file_target(out, suffixes=(PARQUET,), what=what, overwrite=overwrite)  # OUT itself before the names beside it
    targets = [file_target(p, suffixes=(PARQUET,), what=what, overwrite=overwrite) for p in kind.gathered_paths(out)]
    manifest = read_manifest(shards)
    files = {t: [Path(parts) / f"{s.name}{t.suffix}" for s in manifest.shards] for t in kind.tables}
    for paths in files.values():
        absent = [p for p in paths if not p.is_file()]
        if absent:
            raise InputError(absent[0], f"no such file ({len(absent)} of {len(paths)} shards' parts are missing)")
    first_part, first_settings, columns = None, None, {}
    digest = None if model is None else file_digest(model)
    rows = dict.fromkeys(files, 0)
    for k, shard in enumerate(manifest.shards):
        records = shard_records(manifest, shard)
        for table, paths in files.items():
            part = paths[k]
            schema = pq.read_schema(part)
            settings = {key: v for key, v in settings_of(part, schema).items() if key not in PER_INPUT_KEYS}
            if digest is not None and settings.get(MODEL_DIGEST) != digest:
                raise InputError(
                    part,
                    f"computed by the encoder of sha256 {settings.get(MODEL_DIGEST)}, not by {model} ({digest}): "
                    "another encoder's part, or an earlier version's; remove it and rerun its shard",
                )
            if first_settings is None:
                first_part, first_settings = part, settings
            _check_same(part, settings, first_part, first_settings)
            if not schema.remove_metadata().equals(columns.setdefault(table, schema.remove_metadata())):
                raise InputError(part, f"its columns differ from those of {paths[0]}")
            rows[table] += check_rows(part, table, records)
    gathered = {**first_settings, "inference": {**manifest.settings, "output": output}}
    with writing_files(targets) as temps:
        for (table, paths), tmp in zip(files.items(), temps):
            _concatenate(paths, tmp, {**gathered, "inference": {**gathered["inference"], "rows": rows[table]}})
    return {
        "shards": len(manifest.shards),
        "sequences": manifest.records,
        "rows": list(rows.values()),
        "files": targets,
    }


def _check_same(part: Path, settings: dict, first: Path, first_settings: dict) -> None:
    for key in sorted(settings.keys() | first_settings.keys()):
        if settings.get(key) != first_settings.get(key):
            raise InputError(
                part,
                f"computed with {key} {settings.get(key)!r}, {first} with {first_settings.get(key)!r}: the shards "
                "disagree; rerun them with one setting",
            )


def _concatenate(paths: list[Path], tmp: str, settings: dict) -> None:
    """The parts' rows, in order, into ``tmp`` with ``settings`` as its metadata; small row groups (pmlm contacts
    writes one per sequence) are joined up to ROW_GROUP_BYTES, so memory holds about one row group."""
    first = pq.ParquetFile(paths[0])
    schema = first.schema_arrow.remove_metadata().with_metadata({SETTINGS_KEY: json.dumps(settings).encode()})
    # the codecs of the first part with rows (a shard of short sequences may have no contacts)
    written = next((m for m in (pq.read_metadata(p) for p in paths) if m.num_row_groups), first.metadata)
    pending: list[pa.Table] = []
    with pq.ParquetWriter(tmp, schema, compression=_compression(written)) as writer:
        for path in paths:
            part = pq.ParquetFile(path)
            for group in range(part.metadata.num_row_groups):
                pending.append(part.read_row_group(group).replace_schema_metadata(schema.metadata))
                if sum(t.nbytes for t in pending) >= ROW_GROUP_BYTES:
                    writer.write_table(pa.concat_tables(pending))
                    pending = []
        if pending:
            writer.write_table(pa.concat_tables(pending))
