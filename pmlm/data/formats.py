"""Sequence sources as published: format detection by content and fast record readers.

Three formats, told apart by their first bytes (after gzip, detected by magic bytes):

- ``uniref_xml``: UniProt's UniRef XML (``<UniRef50 xmlns="http://uniprot.org/uniref">``), read by
  :mod:`pmlm.data.uniref`;
- ``pfam_fasta``: Pfam-A's ``Pfam-A.fasta`` (``>A0A0A0MT78_9CAUL/22-94 A0A0A0MT78.1 PF10417.8;1-cysPrx_C;``);
- ``fasta``: any other FASTA.

Every reader yields :class:`~pmlm.data.records.Block` s of consecutive records: ids and residues as bytes (whitespace
removed, case kept), the 1-based line of each record's start, and ``key=value`` words to carry
into the clean FASTA header (``members=12 taxon=9606``, ``family=PF10417.8``).

The FASTA reader is the hot path of ``pmlm ingest`` and ``pmlm tokenize``: it cuts 4 MiB blocks at
record boundaries and parses a block with list comprehensions and C calls rather than visiting every
line in Python; lines are counted only when asked for. It reads what Biopython's ``SimpleFastaParser``
reads (tests compare the two), with the errors of :func:`pmlm.data.fasta.read_fasta`.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Iterator
from itertools import accumulate
from pathlib import Path

import numpy as np

from pmlm.data.columns import fasta_columns
from pmlm.data.fasta import GZIP_ERRORS, LATIN1_REPAIR, open_binary
from pmlm.data.records import Block
from pmlm.data.uniref import entry_chunks, parse_entries, read_uniref_xml
from pmlm.errors import ConfigError, InputError

FORMATS = ("fasta", "pfam_fasta", "uniref_xml")
AUTO = "auto"
BLOCK_SIZE = 1 << 22
WHITESPACE = b" \t\r\n\v\f"
SNIFF_BYTES = 1 << 16
# Pfam-A.fasta (Pfam 31.0): ">NAME/START-END ACCESSION.VERSION PFxxxxx.V;FAMILY_ID;"
PFAM_HEADER = re.compile(rb"^>?\S+/\d+-\d+\s+\S+\s+(PF\d{5}(?:\.\d+)?);[^;\s]*;")
_XML_ROOT = re.compile(rb"<(?![?!])([A-Za-z_][\w.:-]*)")
_UNIREF_ROOT = re.compile(rb"(?:\w+:)?UniRef(?:50|90|100)$")


def check_format(fmt: str) -> str:
    if fmt != AUTO and fmt not in FORMATS:
        raise ConfigError(f"unknown source format {fmt!r}; use {AUTO} or one of {', '.join(FORMATS)}")
    return fmt


def _head(path: str) -> bytes:
    try:
        with open_binary(path) as fh:
            return fh.read(SNIFF_BYTES)
    except GZIP_ERRORS as exc:
        raise InputError(path, f"corrupt or truncated gzip stream ({exc}); re-download the file", line=1) from None


def detect_format(path: str | os.PathLike) -> str:
    """``uniref_xml``, ``pfam_fasta`` or ``fasta`` from the file's first bytes.

    Text that is neither XML nor starts with '>' is called FASTA, so the FASTA reader reports
    where it goes wrong (file and line); XML that is not UniRef XML is an error here.
    """
    path = str(path)
    if not Path(path).is_file():
        raise InputError(path, "no such file")
    head = _head(path).lstrip(b"\xef\xbb\xbf" + WHITESPACE)
    if head.startswith(b"<"):
        root = _XML_ROOT.search(re.sub(rb"<!--.*?-->", b"", head, flags=re.S))
        name = root.group(1) if root else b"?"
        if not _UNIREF_ROOT.match(name):
            raise InputError(
                path,
                f"XML with root element <{name.decode('latin-1')}> is not UniRef XML "
                "(expected <UniRef50>, <UniRef90> or <UniRef100> in namespace http://uniprot.org/uniref); "
                "set the source's format to override",
            )
        return "uniref_xml"
    if head.startswith(b">") and PFAM_HEADER.match(head.split(b"\n", 1)[0]):
        return "pfam_fasta"
    return "fasta"


def _text_check(path: str, body: bytes, line: int, repairs: Counter | None = None) -> bytes:
    """Binary junk fails here with its line, as in read_fasta (NUL bytes, invalid UTF-8). A header line
    that is not UTF-8 is read as Latin-1, as read_fasta does, re-encoded as UTF-8 and counted in
    ``repairs`` (``header_latin1``); returns the block's text."""
    pos = body.find(b"\x00")
    if pos >= 0:
        raise InputError(path, "binary data (NUL byte): is this a FASTA file?", line=line + body.count(b"\n", 0, pos))
    if body.isascii():
        return body
    try:
        body.decode("utf-8")
        return body
    except UnicodeDecodeError:
        pass
    lines = body.split(b"\n")  # rare: line by line only for a block that holds a non-UTF-8 byte
    for i, text in enumerate(lines):
        if text.isascii():
            continue
        try:
            text.decode("utf-8")
        except UnicodeDecodeError:
            if not text.startswith(b">"):
                raise InputError(path, "binary data (not UTF-8 text): is this a FASTA file?", line=line + i) from None
            lines[i] = text.decode("latin-1").encode("utf-8")
            if repairs is not None:
                repairs[LATIN1_REPAIR] += 1
    return b"\n".join(lines)


def _newlines(body: bytes) -> int:
    """``body.count(b"\\n")``, ~5x faster: a vectorised compare and count instead of a byte loop."""
    return int(np.count_nonzero(np.frombuffer(body, dtype=np.uint8) == 10))


def fasta_blocks(
    path: str | os.PathLike, block_size: int | None = None, split: bool = True, repairs: Counter | None = None
) -> Iterator[tuple]:
    """Yield ``(records, line)``: the raw text of consecutive records (without their '>') and the
    line of the first one. A record's text is its header line, a newline and its sequence lines.
    With ``split=False`` the records come as one bytes object, from the first '>' to the end of the
    last record, for callers that cut it themselves. Latin-1 headers are counted in ``repairs``.
    """
    block_size = block_size or BLOCK_SIZE
    path = str(path)
    if not Path(path).is_file():
        raise InputError(path, "no such file")
    if os.path.getsize(path) == 0:
        raise InputError(path, "file is empty (no FASTA records)")
    line = 1  # line of the first byte of `pending`
    pending = b""
    started = False
    raw = open_binary(path, threaded=True)
    try:
        while True:
            block = raw.read(block_size)
            data = pending + block if pending else block
            if not started:
                text = data.lstrip(WHITESPACE)
                line += data.count(b"\n", 0, len(data) - len(text))
                if not text:
                    pending = b""
                    if block:
                        continue
                    break
                if not text.startswith(b">"):
                    raise InputError(path, "expected a FASTA header starting with '>'", line=line)
                data, started = text, True
            if block:
                cut = data.rfind(b"\n>")
                if cut < 0:  # one record longer than a block: read on
                    pending = data
                    continue
                body, pending = data[:cut], data[cut + 1 :]
            else:
                body, pending = data, b""
            if not body:
                break
            body = _text_check(path, body, line, repairs)
            yield (body[1:].split(b"\n>") if split else body), line
            line += _newlines(body) + 1
            if not block:
                break
    except GZIP_ERRORS as exc:
        raise InputError(
            path, f"corrupt or truncated gzip stream after line {line} ({exc}); re-download the file", line=line + 1
        ) from None
    except OSError as exc:
        raise InputError(path, f"cannot read after line {line} ({exc})", line=line + 1) from None
    finally:
        raw.close()
    if not started:
        raise InputError(path, "no FASTA records found (no line starts with '>')")


def record_lines(body: bytes, line: int) -> list[int]:
    """The line of each record of ``body`` (FASTA text from a '>'), the first on ``line``."""
    return list(accumulate([text.count(b"\n") + 1 for text in body[1:].split(b"\n>")[:-1]], initial=line))


def fasta_block(path: str, body: bytes, line: int, pfam: bool = False, lines: bool = True) -> Block:
    """The records of ``body`` (FASTA text from a '>' to the end of a record, first line ``line``);
    with ``pfam`` every header must be Pfam-A's and gives ``family=``. ``lines=False`` leaves the
    block's lines None (counting them is a fifth of the parsing; errors count them when needed).

    Blocks are parsed by numpy on the whole block (:func:`pmlm.data.columns.fasta_columns`) unless
    they hold what only the record-by-record parser here reads (tabs, carriage returns, spaces in
    sequence lines) or something wrong, which it reports with the line.
    """
    fast = fasta_columns(body, headers=pfam)
    if fast is not None:
        ids, seqs, headers = fast
    else:
        records = body[1:].split(b"\n>")
        parts = [text.partition(b"\n") for text in records]
        words = [p[0].split(None, 1) for p in parts]
        if not all(words):
            raise InputError(
                path,
                "header has no identifier ('>' followed by nothing)",
                line=record_lines(body, line)[words.index([])],
            )
        ids, headers = [w[0] for w in words], [p[0] for p in parts]
        # the sequence lines of all records in one translate call (NUL, which _text_check rules out, between them)
        seqs = b"\0".join([p[2] for p in parts]).translate(None, WHITESPACE).split(b"\0")
    annotations = None
    if pfam:
        matches = [PFAM_HEADER.match(h) for h in headers]
        if None in matches:
            at = matches.index(None)
            raise InputError(
                path,
                f"record {ids[at].decode(errors='replace')!r}: not a Pfam-A FASTA header "
                "(expected 'NAME/START-END ACCESSION PFxxxxx.V;ID;')",
                line=record_lines(body, line)[at],
            )
        annotations = [b"family=" + m.group(1) for m in matches]
    return Block(ids, seqs, record_lines(body, line) if lines else None, annotations)


def read_fasta_source(path: str | os.PathLike, pfam: bool = False) -> Iterator[Block]:
    """Blocks of a FASTA file; with ``pfam`` every header must be Pfam-A's and gives ``family=``."""
    for body, line in fasta_blocks(path, split=False):
        yield fasta_block(str(path), body, line, pfam)


def source_chunks(path: str | os.PathLike, fmt: str, repairs: Counter | None = None) -> Iterator:
    """The raw pieces of a source that :func:`parse_chunk` turns into blocks, cut in this process
    (decompression, record boundaries, XML well-formedness) so workers can parse them; FASTA headers
    read as Latin-1 are counted in ``repairs``."""
    return entry_chunks(path) if fmt == "uniref_xml" else fasta_blocks(path, split=False, repairs=repairs)


def parse_chunk(path: str, fmt: str, chunk, lines: bool = True) -> Block:
    """The block of one chunk of :func:`source_chunks`; ``lines=False``: see :func:`fasta_block`."""
    if fmt == "uniref_xml":
        return parse_entries(path, chunk)
    body, line = chunk
    return fasta_block(path, body, line, pfam=fmt == "pfam_fasta", lines=lines)


def chunk_first_line(fmt: str, chunk) -> int:
    return chunk[0][1] if fmt == "uniref_xml" else chunk[1]


def read_source(path: str | os.PathLike, fmt: str = AUTO) -> Iterator[Block]:
    """Blocks of records of ``path`` in ``fmt`` (``auto``: detected by content)."""
    fmt = detect_format(path) if check_format(fmt) == AUTO else fmt
    if fmt == "uniref_xml":
        return read_uniref_xml(path)
    return read_fasta_source(path, pfam=fmt == "pfam_fasta")
