"""Duplicate sequences and ids among tens of millions of records, exactly, in a few bytes per record.

``pmlm ingest`` logs a 64-bit hash of every record's sequence and id to disk while it streams
(:class:`HashLog`: memory stays constant). Afterwards one hash array at a time is sorted in place
(8 bytes per record) to find the values that occur more than once; only records carrying such a
value are *candidates*, and candidates are compared by content, never by hash alone:

- sequences: candidates are written to bucket files by hash and each bucket is deduplicated
  exactly in a dict (:func:`mark_duplicate_sequences`), so a hash collision never merges two
  different sequences and memory is bounded by the bucket size, not by the number of records;
- ids: candidates are compared by their text while the records stream past in order.

Record order decides which duplicate is kept: the first occurrence in input order (inputs in the
order given, records in file order); later ones are dropped (or renamed, for ids).
"""

from __future__ import annotations

import math
import os
from array import array
from collections.abc import Iterator

import numpy as np

from pmlm.data.formats import fasta_blocks

KEEP, DUPLICATE_SEQUENCE, DUPLICATE_ID = 0, 1, 2
BUCKET_BYTES = 64 << 20  # candidate sequence bytes per bucket file: bounds the dict built from one (~3x this)
_CHUNK = 1 << 20  # hash values read back per step


class HashLog:
    """int64 values added a block at a time (``log.extend(values)``), spilled to ``path`` when the buffer
    holds ``block`` values or more: memory stays constant whatever the number of records."""

    def __init__(self, path: str, block: int = 1 << 16):
        self.path = path
        self.block = block
        self._fh = open(path, "wb")
        self._buf = array("q")
        self.extend = self._buf.extend  # a C method: no Python frame per value
        self.count = 0

    def extend_bytes(self, raw: bytes) -> None:
        """Add values given as native int64 bytes (array('q').tobytes() of a worker)."""
        self._buf.frombytes(raw)
        self.spill_if_full()

    def spill(self) -> None:
        if self._buf:
            self._buf.tofile(self._fh)
            self.count += len(self._buf)
            del self._buf[:]

    def spill_if_full(self) -> None:
        if len(self._buf) >= self.block:
            self.spill()

    def close(self) -> None:
        self.spill()
        self._fh.close()


def repeated_values(path: str) -> np.ndarray:
    """Sorted distinct values that occur more than once in the int64 file ``path``.

    Peak memory: the values (8 bytes each) plus one byte each for the comparison.
    """
    values = np.fromfile(path, dtype=np.int64)
    values.sort()
    same = values[1:] == values[:-1]
    repeated = np.unique(values[1:][same])
    del values, same
    return repeated


def positions_of(path: str, wanted: np.ndarray) -> np.ndarray:
    """Indices (ascending) of the entries of the int64 file ``path`` whose value is in sorted ``wanted``."""
    if wanted.size == 0:
        return np.zeros(0, dtype=np.int64)
    found = []
    offset = 0
    with open(path, "rb") as fh:
        while True:
            chunk = np.fromfile(fh, dtype=np.int64, count=_CHUNK)
            if chunk.size == 0:
                break
            at = np.minimum(np.searchsorted(wanted, chunk), wanted.size - 1)
            found.append(np.flatnonzero(wanted[at] == chunk) + offset)
            offset += chunk.size
    return np.concatenate(found)


def indexed_records(path: str) -> Iterator[tuple[int, bytes, bytes]]:
    """(index, header, sequence) of a one-line-per-sequence FASTA written by ingest's first pass."""
    index = 0
    for records, _ in fasta_blocks(path):
        for text in records:
            header, _, seq = text.partition(b"\n")
            yield index, header, seq.rstrip(b"\n")
            index += 1


def mark_duplicate_sequences(
    fasta: str, candidates: np.ndarray, reason: bytearray, workdir: str, mean_length: float
) -> int:
    """Set ``reason[i] = DUPLICATE_SEQUENCE`` for every candidate whose sequence occurred earlier.

    Candidates go to ``ceil(bytes / BUCKET_BYTES)`` bucket files by hash (equal sequences share a
    bucket); each bucket is then deduplicated exactly, keeping its first (lowest-index) record.
    Returns the number marked.
    """
    if candidates.size == 0:
        return 0
    buckets = max(1, math.ceil(candidates.size * (mean_length + 12) / BUCKET_BYTES))
    paths = [os.path.join(workdir, f"seq-bucket-{b}") for b in range(buckets)]
    files = [open(p, "wb", buffering=1 << 20) for p in paths]
    try:
        wanted = iter(candidates.tolist())
        nxt = next(wanted, -1)
        for index, _, seq in indexed_records(fasta):
            if index != nxt:
                continue
            files[hash(seq) % buckets].write(b"%d\t%s\n" % (index, seq))
            nxt = next(wanted, -1)
            if nxt < 0:
                break
    finally:
        for fh in files:
            fh.close()
    marked = 0
    for path in paths:
        first: dict[bytes, int] = {}
        with open(path, "rb") as fh:
            data = fh.read()
        os.unlink(path)
        for row in data.split(b"\n"):
            if not row:
                continue
            index, _, seq = row.partition(b"\t")
            if seq in first:
                reason[int(index)] = DUPLICATE_SEQUENCE
                marked += 1
            else:
                first[seq] = int(index)
        del data, first
    return marked
