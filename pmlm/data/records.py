"""The unit every source reader yields: a ``Block`` of consecutive records, column by column."""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple


class Block(NamedTuple):
    """Consecutive records of one source, column by column (readers and ingest work a block at a time:
    list comprehensions and C calls instead of Python statements per record)."""

    ids: list[bytes]
    seqs: list[bytes]  # residues, whitespace removed, case kept
    lines: list[int] | None  # 1-based line of each record's start (None: not counted, see fasta_block)
    annotations: list[bytes] | None  # key=value words to carry per record; None when the format has none


def records_of(blocks: Iterator[Block]) -> Iterator[tuple[bytes, bytes, int, bytes | None]]:
    """``(id, residues, line, annotation)`` per record of a stream of blocks."""
    for ids, seqs, lines, notes in blocks:
        yield from zip(ids, seqs, lines, notes if notes is not None else [None] * len(ids))
