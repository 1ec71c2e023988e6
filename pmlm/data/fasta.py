"""Streaming FASTA / FASTA.gz reading with the line numbers a user needs in error messages.

Records are parsed by Biopython's ``SimpleFastaParser``; this module adds what a pipeline
needs around it: gzip detected by magic bytes (not by file name), fast ISA-L decompression,
binary-junk and truncated-gzip detection, and the 1-based line number of each record's header.

Text is UTF-8. A header line that is not (real files carry Latin-1 names such as ``Müller`` written by
old tools; UniProt's own XML is declared ISO-8859-1) is decoded as Latin-1, which maps every byte to
a character, and counted as the repair ``header_latin1``; a sequence line that is not UTF-8 is binary
junk and an error.
"""

from __future__ import annotations

import gzip
import io
import os
import zlib
from collections import Counter, deque
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from pmlm.errors import InputError

try:  # ISA-L decompresses gzip 2-3x faster than zlib; same format
    from isal import igzip as _gzip_impl
    from isal.isal_zlib import error as _isal_error
except ImportError:  # pragma: no cover - isal is a declared dependency
    _gzip_impl = gzip
    _isal_error = zlib.error
try:
    from isal import igzip_threaded as _gzip_threaded
except ImportError:  # pragma: no cover - isal < 1.6
    _gzip_threaded = None
# what a corrupt or truncated gzip stream raises (ISA-L's inflate error is not a zlib.error)
GZIP_ERRORS = (EOFError, zlib.error, gzip.BadGzipFile, _isal_error)

GZIP_MAGIC = b"\x1f\x8b"
READ_BUFFER = 1 << 20
LATIN1_REPAIR = "header_latin1"


class FastaRecord(NamedTuple):
    """One record; a NamedTuple because one is built per record (a frozen dataclass costs ~3x more)."""

    title: str  # header line without '>'
    sequence: str  # residues with whitespace removed, as in the file (case kept)
    line: int  # 1-based line number of the header

    @property
    def id(self) -> str:
        return self.title.split(None, 1)[0] if self.title.strip() else ""


def is_gzip(path: str | os.PathLike) -> bool:
    with open(path, "rb") as fh:
        return fh.read(2) == GZIP_MAGIC


def open_binary(path: str | os.PathLike, threaded: bool = False):
    """Open a plain or gzip-compressed file for binary reading (gzip detected by magic bytes).

    ``threaded``: inflate in a background thread (ISA-L releases the GIL), for a reader that is
    itself CPU-bound; close the file to end the thread.
    """
    if is_gzip(path):
        if threaded and _gzip_threaded is not None:
            return _gzip_threaded.open(path, "rb", threads=1)
        return _gzip_impl.open(path, "rb")
    return open(path, "rb", buffering=READ_BUFFER)


def _counted_lines(path: str, text: io.TextIOBase, header_lines: deque, repairs: Counter | None) -> Iterator[str]:
    """Lines for the parser; appends the 1-based line number of every header to ``header_lines``.

    A generator rather than an iterator class: this runs once per input line, so it stays lean.
    ``text`` decodes with surrogateescape: bytes that are not UTF-8 arrive as lone surrogates.
    """
    n = 0
    try:
        for n, line in enumerate(text, start=1):
            if line[:1] == ">":
                header_lines.append(n)
            elif not header_lines and line.strip():
                # text before the first '>' would be skipped silently by the parser
                raise InputError(path, "expected a FASTA header starting with '>'", line=n)
            if "\x00" in line:
                raise InputError(path, "binary data (NUL byte): is this a FASTA file?", line=n)
            if not line.isascii():  # rare; the check below costs only then
                try:
                    line.encode("utf-8")
                except UnicodeEncodeError:  # undecodable bytes, kept as surrogates
                    if line[:1] != ">":
                        raise InputError(path, "binary data (not UTF-8 text): is this a FASTA file?", line=n) from None
                    line = line.encode("utf-8", "surrogateescape").decode("latin-1")
                    if repairs is not None:
                        repairs[LATIN1_REPAIR] += 1
            yield line
    except GZIP_ERRORS as exc:
        raise InputError(
            path, f"corrupt or truncated gzip stream after line {n} ({exc}); re-download the file", line=n + 1
        ) from None
    except InputError:
        raise
    except OSError as exc:
        raise InputError(path, f"cannot read after line {n} ({exc})", line=n + 1) from None


def read_fasta(path: str | os.PathLike, repairs: Counter | None = None) -> Iterator[FastaRecord]:
    """Yield records of a FASTA or FASTA.gz file in constant memory (one record at a time).

    Raises InputError (file and line) for: no header before sequence data, binary content,
    corrupt or truncated gzip, and a file with no record at all. Headers decoded as Latin-1
    are counted in ``repairs`` (key ``header_latin1``).
    """
    # imported here: Biopython's import costs ~0.5 s, which the readers of pmlm.data.formats don't pay
    from Bio.SeqIO.FastaIO import SimpleFastaParser

    path = str(path)
    if not Path(path).is_file():
        raise InputError(path, "no such file")
    if os.path.getsize(path) == 0:
        raise InputError(path, "file is empty (no FASTA records)")
    raw = open_binary(path)
    # UTF-8; bytes that are not UTF-8 become surrogates, which _counted_lines repairs (header) or rejects
    text = io.TextIOWrapper(raw, encoding="utf-8", errors="surrogateescape", newline=None)
    header_lines: deque[int] = deque()
    n = 0
    try:
        for title, seq in SimpleFastaParser(_counted_lines(path, text, header_lines, repairs)):
            n += 1
            yield FastaRecord(title=title, sequence=seq, line=header_lines.popleft())
    finally:
        text.close()
    if n == 0:
        raise InputError(path, "no FASTA records found (no line starts with '>')")


def sequence_line(path: str | os.PathLike, header_line: int, position: int) -> int:
    """The 1-based line of ``path`` that holds residue ``position`` (1-based, counted as :func:`read_fasta` joins a
    record's lines) of the record whose header is at ``header_line``; the header's line if the record is shorter.

    Read again from the start when asked (an error message's line), so that records keep no line numbers beyond
    their header's: a record of 40,000 residues over 700 lines costs nothing more to read."""
    raw = open_binary(path)
    text = io.TextIOWrapper(raw, encoding="utf-8", errors="surrogateescape", newline=None)
    try:
        count = 0
        for n, line in enumerate(text, start=1):
            if n <= header_line:
                continue
            if line[:1] == ">":
                break
            # what SimpleFastaParser keeps of a sequence line
            count += len(line.rstrip().replace(" ", "").replace("\r", ""))
            if count >= position:
                return n
    finally:
        text.close()
    return header_line
