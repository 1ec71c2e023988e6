"""Columns of a block of one-line FASTA records by numpy operations on the block's bytes: no Python
object per record, which is what a per-record loop spends most of its time creating.

A block (bytes from a '>' to the end of a record, as :func:`pmlm.data.formats.fasta_blocks` cuts it)
of what ``pmlm ingest`` and ``pmlm split`` write: each record one header line ``>ID [key=value ...]``
and one sequence line. Anything else (wrapped sequences, tabs, carriage returns, blank lines,
irregular headers) makes :func:`one_line_columns` return None and the caller reads the block record
by record, which also reports what is wrong with it.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pyarrow as pa

from pmlm import alphabet

_NEWLINE, _SPACE, _GT = ord("\n"), ord(" "), ord(">")
KEYS = (b"cluster=", b"members=", b"taxon=", b"family=")


def _crc_table() -> np.ndarray:
    """CRC-32 as zlib computes it (reflected polynomial 0xEDB88320): one table lookup per byte."""
    table = []
    for byte in range(256):
        c = byte
        for _ in range(8):
            c = (c >> 1) ^ 0xEDB88320 if c & 1 else c >> 1
        table.append(c)
    return np.array(table, dtype=np.uint32)


_CRC_TABLE = _crc_table()


class Columns(NamedTuple):
    """A block's rows as Arrow-ready pieces."""

    ids: object  # pyarrow string array
    clusters: object  # pyarrow string array
    cluster_crc32: np.ndarray  # (n,) uint32, zlib.crc32 of each cluster id
    lengths: np.ndarray  # (n,) int32 residues per row
    tokens: np.ndarray  # (sum(lengths),) uint8 token ids, rows one after the other
    members: object | None  # pyarrow int32 array, None when no row has one
    taxa: object | None
    families: object | None
    from_header: int  # rows whose cluster came from a cluster= word


def crc32_spans(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """zlib.crc32 of each span ``data[start:start + length]``, all spans at once, byte position by
    byte position (spans sorted by length so each step touches only the spans still running)."""
    order = np.argsort(-lengths, kind="stable")
    starts, lengths = starts[order], lengths[order]
    crc = np.full(starts.size, 0xFFFFFFFF, dtype=np.uint32)
    running = np.searchsorted(-lengths, -np.arange(1, int(lengths.max(initial=0)) + 1), side="right")
    for position, k in enumerate(running.tolist()):
        c = crc[:k]
        crc[:k] = _CRC_TABLE[(c ^ data[starts[:k] + position]) & 0xFF] ^ (c >> 8)
    out = np.empty_like(crc)
    out[order] = crc ^ 0xFFFFFFFF
    return out


def _string_array(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray, binary: bool = False):
    """An Arrow string (or binary) array of the spans of ``data``."""
    offsets = np.zeros(lengths.size + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    index = np.repeat(starts - offsets[:-1], lengths) + np.arange(offsets[-1])
    array = pa.BinaryArray.from_buffers(
        pa.binary(), lengths.size, [None, pa.py_buffer(offsets), pa.py_buffer(data[index])]
    )
    return array if binary else array.cast(pa.string())


def _lines(body: bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """(bytes, newline positions, line starts, line ends) of a block, or None when it holds whitespace
    other than spaces and newlines (what the record-by-record parsers handle)."""
    if any(c in body for c in (b"\t", b"\r", b"\v", b"\f")):
        return None
    data = np.frombuffer(body, dtype=np.uint8)
    newlines = np.flatnonzero(data == _NEWLINE)
    starts = np.concatenate([[0], newlines + 1])
    ends = np.append(newlines, data.size)
    if ends[-1] == starts[-1]:  # a final newline, not an empty line
        starts, ends = starts[:-1], ends[:-1]
    return data, newlines, starts, ends


def one_line_columns(body: bytes) -> Columns | None:
    """The columns of a block of one-line records, or None when the block is laid out otherwise
    or has a record the tokenizer would refuse (the record-by-record reader then says which)."""
    lines = _lines(body)
    if lines is None:
        return None
    data, newlines, starts, ends = lines
    if starts.size % 2 or not starts.size:
        return None
    head, head_end, seq, seq_end = starts[0::2], ends[0::2], starts[1::2], ends[1::2]
    lengths = (seq_end - seq).astype(np.int32)
    if (data[head] != _GT).any() or not lengths.all() or (data[seq] == _GT).any():
        return None  # headers and sequences do not alternate, or a sequence is empty
    # every byte of a sequence line: lines alternate header / sequence, each line with its newline
    in_sequence = np.repeat(np.tile(np.array([False, True]), head.size), ends - starts + 1)[: data.size]
    in_sequence[newlines] = False
    tokens = np.frombuffer(body.translate(alphabet.TRANSLATE_TABLE), dtype=np.uint8)[in_sequence]
    if (tokens == alphabet.INVALID_BYTE).any():
        return None
    # header words: ID and key=value words separated by single spaces, as many in every header
    spaces = np.flatnonzero(data == _SPACE)
    first = np.searchsorted(spaces, head)
    per_header = np.searchsorted(spaces, head_end) - first
    width = int(per_header[0])
    if (per_header != width).any():
        return None
    gaps = spaces[first[:, None] + np.arange(width)]  # (n, width) positions of the spaces
    word_start = np.column_stack([head + 1, gaps + 1])  # (n, width + 1)
    word_len = np.column_stack([gaps, head_end]) - word_start
    if (word_len <= 0).any():
        return None
    columns = {"cluster=": None, "members=": None, "taxon=": None, "family=": None}
    for j in range(1, width + 1):
        sample = body[word_start[0, j] : word_start[0, j] + word_len[0, j]]
        key = sample[: sample.find(b"=") + 1]
        if key not in KEYS or (word_len[:, j] <= len(key)).any() or columns[key.decode()] is not None:
            return None
        prefix = data[word_start[:, j, None] + np.arange(len(key))]
        if (prefix != np.frombuffer(key, dtype=np.uint8)).any():
            return None
        columns[key.decode()] = (word_start[:, j] + len(key), word_len[:, j] - len(key))
    ids = _string_array(data, word_start[:, 0], word_len[:, 0])
    cluster_span = columns["cluster="] or (word_start[:, 0], word_len[:, 0])
    optional = []
    for key in ("members=", "taxon="):
        if columns[key] is None:
            optional.append(None)
            continue
        try:
            optional.append(_string_array(data, *columns[key]).cast(pa.int32()))
        except (pa.ArrowInvalid, ValueError):  # not a number: the record path leaves it null
            return None
    return Columns(
        ids,
        _string_array(data, *cluster_span) if columns["cluster="] else ids,
        crc32_spans(data, *cluster_span),
        lengths,
        tokens,
        *optional,
        _string_array(data, *columns["family="]) if columns["family="] else None,
        head.size if columns["cluster="] else 0,
    )


def fasta_columns(body: bytes, headers: bool = False) -> tuple[list[bytes], list[bytes], list[bytes] | None] | None:
    """(ids, residues, header lines or None) of a block of FASTA records, sequence lines wrapped or
    not, by numpy operations on the block; None when the block holds what this does not read as
    Biopython would (tabs, carriage returns, spaces in sequence lines, an empty or space-led id)."""
    lines = _lines(body)
    if lines is None:
        return None
    data, newlines, starts, ends = lines
    is_head = np.zeros(starts.size, dtype=bool)
    nonempty = ends > starts
    is_head[nonempty] = data[starts[nonempty]] == _GT
    heads = np.flatnonzero(is_head)
    if not heads.size or heads[0] != 0:
        return None
    # residues: every byte of the other lines but their newlines, record after record
    sequence_bytes = np.where(is_head, 0, ends - starts)
    in_sequence = np.repeat(~is_head, ends - starts + 1)[: data.size]
    in_sequence[newlines] = False
    residues = data[in_sequence]
    if (residues == _SPACE).any():
        return None
    lengths = np.add.reduceat(sequence_bytes, heads)
    offsets = np.zeros(heads.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    seqs = pa.LargeBinaryArray.from_buffers(
        pa.large_binary(), heads.size, [None, pa.py_buffer(offsets), pa.py_buffer(residues)]
    ).to_pylist()
    head_start, head_end = starts[heads] + 1, ends[heads]
    spaces = np.append(np.flatnonzero(data == _SPACE), data.size)  # the end of the block stands in for a last space
    first_space = spaces[np.searchsorted(spaces, head_start)]
    id_len = np.minimum(first_space, head_end) - head_start
    if (id_len <= 0).any():
        return None
    ids = _string_array(data, head_start, id_len, binary=True).to_pylist()
    lines = _string_array(data, head_start - 1, head_end - head_start + 1, binary=True).to_pylist() if headers else None
    return ids, seqs, lines


def clean_one_line_fasta(
    body: bytes, min_length: int, max_length: int, allowed: bytes
) -> tuple[bytes, list[bytes], list[bytes], np.ndarray] | None:
    """``pmlm ingest``'s output for a block of plain FASTA whose every record is already clean:
    (one-line FASTA ``>ID\\nRESIDUES\\n`` per record, ids, residues, residues per record).

    None when any record would need the normaliser (a residue outside ``allowed``, a length outside
    ``min_length..max_length``) or the block holds what :func:`fasta_columns` leaves to the
    record-by-record parser (blank lines too). The output is cut from the block by one boolean mask
    (header descriptions and the newlines inside sequences out), so no Python object is made per
    record but the two that hashing needs, split from the output in one C call.
    """
    lines = _lines(body)
    if lines is None:
        return None
    data, _newlines, starts, ends = lines
    line_len = ends - starts
    if not line_len.all():
        return None
    is_head = data[starts] == _GT
    heads = np.flatnonzero(is_head)
    if not heads.size or heads[0] != 0:
        return None
    lengths = np.add.reduceat(np.where(is_head, 0, line_len), heads)  # (records,) residues
    if lengths.min() < min_length or lengths.max() > max_length:
        return None
    id_len = _id_lengths(body, data, starts[heads] + 1, ends[heads])
    if (id_len <= 0).any():
        return None
    # per line three runs of bytes: kept text ('>' + id, or the residues), dropped text (the header's
    # description), the newline: kept after a header and after the last line of a record
    keep_text = line_len.copy()
    keep_text[heads] = id_len + 1
    last_line = np.append(is_head[1:], True)
    runs = np.column_stack([keep_text, line_len - keep_text, np.ones_like(line_len)]).ravel()
    kept = np.column_stack([np.ones_like(is_head), np.zeros_like(is_head), is_head | last_line]).ravel()
    mask = np.repeat(kept, runs)[: data.size]
    out = data[mask].tobytes()
    if not out.endswith(b"\n"):
        out += b"\n"
    parts = out.split(b"\n")
    ids, seqs = [p[1:] for p in parts[0:-1:2]], parts[1:-1:2]
    # every residue allowed: deleting the allowed letters and newlines from the output leaves the
    # '>' of each record and what the ids leave, nothing more
    drop = allowed + b"\n"
    if len(seqs) != heads.size or len(out.translate(None, drop)) != heads.size + len(
        b"".join(ids).translate(None, drop)
    ):
        return None
    return out, ids, seqs, lengths.astype(np.int64)


def _id_lengths(body: bytes, data: np.ndarray, start: np.ndarray, end: np.ndarray, window: int = 32) -> np.ndarray:
    """Length of each header's first word, header ``i`` being ``body[start[i]:end[i]]``: the first space
    among the header's first ``window`` bytes, by numpy on (headers, window) bytes; a C call for each
    header whose first word is longer."""
    width = end - start
    at = np.minimum(start[:, None] + np.arange(window), data.size - 1)  # (headers, window)
    space = (data[at] == _SPACE) & (np.arange(window) < width[:, None])
    found = space.any(axis=1)
    length = np.where(found, space.argmax(axis=1), width)
    for i in np.flatnonzero(~found & (width > window)).tolist():
        a, b = int(start[i]), int(end[i])
        space_at = body.find(b" ", a, b)
        length[i] = (space_at if space_at >= 0 else b) - a
    return length
