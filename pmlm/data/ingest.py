"""``pmlm ingest``: normalise sequence sources (FASTA, Pfam-A FASTA, UniRef XML) into clean, uniquely
named sequences plus an accounting JSON (docs/data.md, "Ingest"): ``kept + sum(dropped) == read`` always holds.

Memory stays at a few bytes per record whatever the input size: the first pass streams records
through the normaliser into a temporary FASTA and logs 64-bit hashes of sequences and ids to disk;
duplicates are then found by sorting one hash array at a time and confirmed by content
(:mod:`pmlm.data.dedup`); a second pass over the temporary file drops or renames them, and is
skipped when there is nothing to drop. Of duplicate sequences or ids, the first occurrence in
input order is kept (inputs in the order given, records in file order). The clean FASTA's headers carry the
source's ``key=value`` annotations, which ``pmlm split`` keeps and ``pmlm tokenize`` turns into shard columns.
"""

from __future__ import annotations

import bisect
import json
import os
import shutil
import tempfile
from array import array
from collections import Counter
from dataclasses import dataclass
from itertools import chain, repeat
from pathlib import Path
from typing import NamedTuple

import numpy as np
import yaml

from pmlm.data import dedup
from pmlm.data.columns import clean_one_line_fasta
from pmlm.data.formats import (
    AUTO,
    check_format,
    chunk_first_line,
    detect_format,
    parse_chunk,
    record_lines,
    source_chunks,
)
from pmlm.data.normalise import STANDARD, IngestPolicy, Normaliser
from pmlm.errors import ConfigError, InputError
from pmlm.outputs import writing_files
from pmlm.progress import Progress


class _Origins:
    """Where record ``i`` of the first pass came from: its input and line.

    Per chunk of input: the index of its first kept record, and its kept records' lines when they were
    counted (a chunk the normaliser repaired); for a clean chunk the lines are counted again from the
    input only when an error needs one.
    """

    def __init__(self):
        self.starts: list[int] = []
        self.chunks: list[tuple[str, str, int, np.ndarray | None]] = []  # (path, format, first line, lines)

    def add(self, start: int, path: str, fmt: str, first_line: int, lines: bytes) -> None:
        self.starts.append(start)
        self.chunks.append((path, fmt, first_line, np.frombuffer(lines, dtype=np.int64) if lines else None))

    def where(self, index: int) -> tuple[str, int]:
        at = bisect.bisect_right(self.starts, index) - 1
        path, fmt, first_line, lines = self.chunks[at]
        if lines is None:
            chunk = next(c for c in source_chunks(path, fmt) if chunk_first_line(fmt, c) == first_line)
            lines = parse_chunk(path, fmt, chunk).lines
        return path, int(lines[index - self.starts[at]])


def ingest(
    inputs: list[str], out_fasta: str, stats_path: str, policy: IngestPolicy, formats: list[str] | None = None
) -> dict:
    """Normalise ``inputs`` into ``out_fasta`` (one line per sequence); both outputs appear atomically.

    ``formats``: one per input (``auto``, ``fasta``, ``pfam_fasta``, ``uniref_xml``), or None for auto.
    """
    for path in inputs:
        if not os.path.isfile(path):
            raise InputError(path, "no such file")
    formats = [check_format(f) for f in (formats or [AUTO] * len(inputs))]
    if len(formats) != len(inputs):
        raise ConfigError(f"ingest: {len(formats)} formats given for {len(inputs)} inputs")
    formats = [detect_format(p) if f == AUTO else f for p, f in zip(inputs, formats)]
    norm = Normaliser(policy)
    out_dir = Path(out_fasta).resolve().parent
    out_dir.mkdir(parents=True, exist_ok=True)
    work = tempfile.mkdtemp(prefix=".ingest.", dir=out_dir)
    try:
        with writing_files([out_fasta, stats_path]) as (tmp, stats_tmp):
            first = os.path.join(work, "pass1.fasta")
            origins = _Origins()
            seq_log = dedup.HashLog(os.path.join(work, "seq.i64"))
            id_log = dedup.HashLog(os.path.join(work, "id.i64"))
            read, tally = _first_pass(inputs, formats, first, norm, origins, seq_log, id_log)
            for log in (seq_log, id_log):
                log.close()
            if tally.kept == 0:
                raise InputError(inputs[0], f"no record survived normalisation (dropped: {dict(norm.dropped)})")
            reason = bytearray(tally.kept)  # one byte per record: KEEP or why it goes
            if policy.dedup_sequences:
                candidates = dedup.positions_of(seq_log.path, dedup.repeated_values(seq_log.path))
                marked = dedup.mark_duplicate_sequences(first, candidates, reason, work, tally.residues / tally.kept)
                if marked:
                    norm.dropped["duplicate_sequence"] += marked
            renames = _duplicate_ids(first, id_log.path, reason, policy, norm, origins)
            if any(reason) or renames:
                tally = _second_pass(first, tmp, reason, renames)
            else:
                os.replace(first, tmp)
            stats = _stats(inputs, formats, policy, norm, read, tally)
            Path(stats_tmp).write_text(json.dumps(stats, indent=2) + "\n")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return stats


@dataclass
class _Tally:
    """Records written so far and their lengths."""

    kept: int = 0
    residues: int = 0
    shortest: int | None = None
    longest: int = 0

    def add(self, n: int) -> None:
        self.merge(_Tally(1, n, n, n))

    def merge(self, other: _Tally) -> None:
        if not other.kept:
            return
        self.kept += other.kept
        self.residues += other.residues
        self.shortest = other.shortest if self.shortest is None else min(self.shortest, other.shortest)
        self.longest = max(self.longest, other.longest)


class _Cleaned(NamedTuple):
    """What one chunk of a source becomes: clean FASTA text, logs as raw int64 bytes, counts."""

    read: int
    first_line: int
    fasta: bytes
    seq_hashes: bytes
    id_hashes: bytes
    lines: bytes  # the kept records' lines when the chunk was repaired, else b"" (counted on demand)
    tally: _Tally
    dropped: Counter
    repaired: Counter


def _clean_chunk(path: str, fmt: str, policy: IngestPolicy, chunk) -> _Cleaned:
    """Parse and normalise one chunk of a source.

    A block whose records are all clean (uppercase standard letters, lengths in range: almost every
    block of a real source) is checked with a few C calls on the whole block and written as it is
    (plain FASTA: cut from the block's bytes by numpy, no Python object per record but the two
    hashed); any other block goes record by record through the normaliser.
    """
    first_line = chunk_first_line(fmt, chunk)
    if fmt == "fasta":
        clean = clean_one_line_fasta(chunk[0], policy.min_length, policy.max_length, STANDARD)
        if clean is not None:
            fasta, ids, seqs, lengths = clean
            return _Cleaned(
                len(ids),
                first_line,
                fasta,
                _hashes(seqs),
                _hashes(ids),
                b"",
                _Tally(len(ids), int(lengths.sum()), int(lengths.min()), int(lengths.max())),
                Counter(),
                Counter(),
            )
    ids, seqs, lines, annotations = parse_chunk(path, fmt, chunk, lines=False)
    norm = Normaliser(policy)
    read = len(ids)
    joined = b"".join(seqs)
    lengths = list(map(len, seqs))
    kept_lines = b""
    # deleting the standard letters leaves nothing: uppercase, no gap, stop or other character
    if joined.translate(None, STANDARD) or not policy.min_length <= min(lengths) <= max(lengths) <= policy.max_length:
        if lines is None:  # a FASTA chunk: count them now
            lines = record_lines(*chunk)
        ids, seqs, lines, annotations = _normalise_block(norm, path, ids, seqs, lines, annotations)
        if not ids:
            return _Cleaned(read, first_line, b"", b"", b"", b"", _Tally(), norm.dropped, norm.repaired)
        joined = b"".join(seqs)
        lengths = list(map(len, seqs))
        kept_lines = array("q", lines).tobytes()
    headers = (
        ids if annotations is None else [b"%s %s" % pair if pair[1] else pair[0] for pair in zip(ids, annotations)]
    )
    fasta = b"".join(chain.from_iterable(zip(repeat(b">"), headers, repeat(b"\n"), seqs, repeat(b"\n"))))
    tally = _Tally(len(ids), len(joined), min(lengths), max(lengths))
    return _Cleaned(
        read, first_line, fasta, _hashes(seqs), _hashes(ids), kept_lines, tally, norm.dropped, norm.repaired
    )


def _hashes(values: list[bytes]) -> bytes:
    """64-bit hashes of ``values`` as native int64 bytes: what the duplicate logs hold, one home for
    every path that fills them (duplicates are confirmed by content, so the hash only has to agree)."""
    return array("q", map(hash, values)).tobytes()


def _normalise_block(norm, path, ids, seqs, lines, annotations):
    """The records of a block that survive the normaliser, repaired (columns as in the block)."""
    kept = ([], [], [], None if annotations is None else [])
    for i, (record_id, seq, line) in enumerate(zip(ids, seqs, lines)):
        seq = norm(seq, path, line, record_id)
        if seq is None:
            continue
        kept[0].append(record_id)
        kept[1].append(seq)
        kept[2].append(line)
        if annotations is not None:
            kept[3].append(annotations[i])
    return kept


def _first_pass(inputs, formats, first, norm, origins, seq_log, id_log) -> tuple[int, _Tally]:
    """Stream every chunk of every input through the normaliser into ``first``, in input order;
    returns (records read, tally)."""
    read = 0
    tally = _Tally()
    progress = Progress("pmlm ingest")  # records read, a line a minute in the rule's log
    with open(first, "wb", buffering=1 << 22) as out:
        for path, fmt in zip(inputs, formats):
            for chunk in source_chunks(path, fmt, norm.repaired):  # counts headers read as Latin-1
                cleaned = _clean_chunk(path, fmt, norm.policy, chunk)
                read += cleaned.read
                progress.advance(cleaned.read)
                norm.dropped.update(cleaned.dropped)
                norm.repaired.update(cleaned.repaired)
                if not cleaned.fasta:
                    continue
                origins.add(tally.kept, path, fmt, cleaned.first_line, cleaned.lines)
                out.write(cleaned.fasta)
                seq_log.extend_bytes(cleaned.seq_hashes)
                id_log.extend_bytes(cleaned.id_hashes)
                tally.merge(cleaned.tally)
    progress.close()  # on success only: an error stays the run's one line
    return read, tally


def _duplicate_ids(
    first: str, id_log: str, reason: bytearray, policy: IngestPolicy, norm: Normaliser, origins: _Origins
) -> dict[int, bytes]:
    """Apply ``duplicate_ids`` to records whose id occurred earlier; returns {index: new id} for renames."""
    hashes = dedup.repeated_values(id_log)
    candidates = dedup.positions_of(id_log, hashes)
    if candidates.size == 0:
        return {}
    wanted = set(candidates.tolist())
    seen: dict[bytes, int] = {}
    later: list[tuple[int, bytes]] = []
    for index, header, _ in dedup.indexed_records(first):
        if index not in wanted or reason[index]:
            continue
        record_id = header.split(None, 1)[0]
        if record_id not in seen:
            seen[record_id] = index
            continue
        if policy.duplicate_ids == "error":
            path, line = origins.where(index)
            first_path, first_line = origins.where(seen[record_id])
            where = f"line {first_line}" if first_path == path else f"{first_path}:{first_line}"
            raise InputError(
                path,
                f"record {record_id.decode(errors='replace')!r}: duplicate id (first seen at {where}); "
                "see ingest.duplicate_ids",
                line=line,
            )
        if policy.duplicate_ids == "drop":
            reason[index] = dedup.DUPLICATE_ID
            norm.dropped["duplicate_id"] += 1
        else:
            later.append((index, record_id))
    return _rename(first, later, norm)


def _rename(first: str, later: list[tuple[int, bytes]], norm: Normaliser) -> dict[int, bytes]:
    """ID_dupK for each later duplicate: the smallest K >= 2 not taken by a kept id or an earlier rename."""
    if not later:
        return {}
    taken: set[bytes] = set()
    while True:
        renames: dict[int, bytes] = {}
        next_k: dict[bytes, int] = {}
        used = set(taken)
        for index, base in later:
            k = next_k.get(base, 2)
            while (name := b"%s_dup%d" % (base, k)) in used:
                k += 1
            renames[index], next_k[base] = name, k + 1
            used.add(name)
        # exact check against the ids of the input, in one pass; repeat in the rare case of a clash
        proposed = set(renames.values())
        clashes = {
            header.split(None, 1)[0]
            for i, header, _ in dedup.indexed_records(first)
            if i not in renames and header.split(None, 1)[0] in proposed
        }
        if not clashes:
            norm.repaired["id_renamed"] += len(renames)
            return renames
        taken |= clashes


def _second_pass(first: str, out: str, reason: bytearray, renames: dict[int, bytes]) -> _Tally:
    """Copy the kept records of ``first`` to ``out``, renaming where asked."""
    tally = _Tally()
    with open(out, "wb", buffering=1 << 22) as fh:
        for index, header, seq in dedup.indexed_records(first):
            if reason[index]:
                continue
            if index in renames:
                words = header.split(None, 1)
                header = renames[index] + (b" " + words[1] if len(words) > 1 else b"")
            fh.write(b">%s\n%s\n" % (header, seq))
            tally.add(len(seq))
    return tally


def _stats(
    inputs: list[str], formats: list[str], policy: IngestPolicy, norm: Normaliser, read: int, tally: _Tally
) -> dict:
    dropped = dict(sorted(norm.dropped.items()))
    if tally.kept + sum(dropped.values()) != read:
        raise AssertionError(f"ingest accounting is inconsistent: kept {tally.kept} + dropped {dropped} != read {read}")
    return {
        "inputs": [str(p) for p in inputs],
        "formats": formats,
        "policy": policy.as_dict(),
        "read": read,
        "kept": tally.kept,
        "dropped": dropped,
        "dropped_total": sum(dropped.values()),
        "repaired": dict(sorted(norm.repaired.items())),
        "residues_kept": tally.residues,
        "length_min": tally.shortest,
        "length_max": tally.longest,
        "length_mean": round(tally.residues / tally.kept, 2) if tally.kept else None,
    }


def read_policy(path: str | None, overrides: list[str] = ()) -> IngestPolicy:
    """The ingest policy of a YAML file (or the defaults, without one) with ``key=value`` overrides."""
    values: dict = {}
    if path:
        try:
            values = yaml.safe_load(Path(path).read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"{path}: cannot read ingest policy ({exc})") from None
        if not isinstance(values, dict):
            raise ConfigError(f"{path}: ingest policy must be a mapping")
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--set expects key=value, got {item!r}")
        values[key] = yaml.safe_load(value)
    return IngestPolicy.from_dict(values)
