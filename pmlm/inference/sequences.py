"""The sequences the inference commands read (embed, contacts, score): FASTA records checked to be protein
sequences, streamed one at a time, with one-line errors naming the file and the line. What a record must be and
what ``unknown`` repairs (counted in a :class:`SequenceReport`): docs/cli.md, "Sequences as users have them".

Memory: :func:`iter_fasta_sequences` holds one record at a time plus the ids seen (for the duplicate check), so a
caller that streams keeps its peak set by its own batches, not by the file (``pmlm embed`` checks the whole file in
a first pass with :func:`check_fasta`, then computes in a second). The whole-file nucleotide check can only
conclude at the end of the stream: a caller that must not start on such a file checks it first.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import NamedTuple

import numpy as np

from pmlm import alphabet
from pmlm.data.fasta import read_fasta, sequence_line
from pmlm.errors import ConfigError, InputError

UNKNOWN_ERROR, UNKNOWN_X, UNKNOWN_SKIP = "error", "x", "skip"
UNKNOWN_CHOICES = (UNKNOWN_ERROR, UNKNOWN_X, UNKNOWN_SKIP)
UNKNOWN_OPTION = "--unknown"  # the commands' option for letters outside the alphabet (embed, contacts, score)
NUCLEOTIDES = b"ACGTUN"
NUCLEOTIDE_SHARE = 0.9  # of a record's (or the file's) letters
NUCLEOTIDE_MIN_LETTERS = 20  # shorter records are judged with the whole file only
_UPPERCASE = bytes.maketrans(b"abcdefghijklmnopqrstuvwxyz", b"ABCDEFGHIJKLMNOPQRSTUVWXYZ")
_INGEST_HINT = "pmlm ingest normalises sequences"
_PROTEIN = "pmlm reads protein sequences (translate them first)"


@dataclass(frozen=True)
class Sequence:
    """One FASTA record, checked: its id, the letters the model reads (uppercase; ``X`` for a letter read as
    unknown), residue token ids (uint8) and header line."""

    id: str
    letters: str
    residues: np.ndarray  # (L,) token ids, no specials
    line: int


@dataclass
class SequenceReport:
    """What reading a FASTA found and did: records and residues read, and the counted repairs."""

    sequences: int = 0  # records read (those skipped not included)
    residues: int = 0
    lowercase_sequences: int = 0  # records with lowercase letters, read as uppercase (accepted, not a repair)
    unknown_letters: int = 0  # letters outside the alphabet read as X (unknown="x")
    unknown_sequences: int = 0  # ... in this many records
    skipped_sequences: int = 0  # records left out for letters outside the alphabet (unknown="skip")
    skipped_letters: int = 0  # ... holding this many such letters

    def repairs(self) -> list[str]:
        """One line per repair made, e.g. ``3 letters outside the alphabet read as X in 2 sequences``."""
        lines = []
        if self.unknown_letters:
            lines.append(
                f"{_count(self.unknown_letters, 'letter')} outside the alphabet read as X in "
                f"{_count(self.unknown_sequences, 'sequence')}"
            )
        if self.skipped_sequences:
            lines.append(
                f"{_count(self.skipped_sequences, 'sequence')} with letters outside the alphabet skipped "
                f"({_count(self.skipped_letters, 'such letter')})"
            )
        return lines

    def as_dict(self) -> dict:
        return asdict(self)


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def _hint(repair_option: str | None) -> str:
    if repair_option is None:
        return _INGEST_HINT
    return f"{repair_option} x reads letters outside the alphabet as X, {repair_option} skip leaves such records out"


def _nucleotides(upper: bytes) -> int:
    return sum(upper.count(c) for c in NUCLEOTIDES)


class Checked(NamedTuple):
    """One record's letters as read (uppercase, X for a letter read as unknown), token ids (None: skipped), letters
    outside the alphabet, and letters among A C G T U N (before any repair)."""

    letters: str
    residues: np.ndarray | None
    outside: int
    nucleotides: int


def check_sequence(
    path: str | os.PathLike,
    seq_id: str,
    letters: str,
    line: int,
    *,
    unknown: str = UNKNOWN_ERROR,
    repair_option: str | None = None,
) -> Checked:
    """One record whose header is at ``line``, checked and read (module docstring); a one-line error naming the file
    and the line of the first offending character otherwise. ``unknown``: ``error``, ``x`` (letters outside the
    alphabet read as X) or ``skip`` (residues None when the record holds such a letter); ``repair_option``, the
    command's option for it, is named in the error (``pmlm ingest`` otherwise)."""
    if unknown not in UNKNOWN_CHOICES:
        raise ConfigError(f"unknown must be one of {', '.join(UNKNOWN_CHOICES)}, got {unknown!r}")
    if not seq_id:
        raise InputError(path, "record without an id", line=line)
    if not letters:
        raise InputError(path, f"record {seq_id!r} has no residues", line=line)
    # one byte per character (non-ASCII ones become '?', refused below), so positions are the string's
    upper = letters.encode("ascii", "replace").translate(_UPPERCASE)
    nucleotides = _nucleotides(upper)
    ids = np.frombuffer(upper.translate(alphabet.TRANSLATE_TABLE), dtype=np.uint8)
    bad = np.flatnonzero(ids == alphabet.INVALID_BYTE)
    # a short record is judged with its file, unless it holds a letter no protein has and is nucleotides otherwise
    judged = len(upper) >= NUCLEOTIDE_MIN_LETTERS or (bad.size and unknown == UNKNOWN_ERROR)
    if judged and nucleotides >= NUCLEOTIDE_SHARE * len(upper):
        raise InputError(
            path,
            f"record {seq_id!r} looks like nucleotides ({nucleotides / len(upper):.0%} of its {len(upper):,} letters "
            f"are A, C, G, T, U or N); {_PROTEIN}",
            line=line,
        )
    if not bad.size:
        return Checked(upper.decode("ascii"), ids, 0, nucleotides)
    codes = np.frombuffer(upper, dtype=np.uint8)[bad]
    is_letter = (codes >= ord("A")) & (codes <= ord("Z"))
    if unknown == UNKNOWN_ERROR or not is_letter.all():
        # the first character no repair reads: any outside the alphabet, or (repairing) the first that is no letter
        k = 0 if unknown == UNKNOWN_ERROR else int(np.argmin(is_letter))
        first = int(bad[k])
        raise InputError(
            path,
            f"record {seq_id!r}: character {letters[first]!r} at position {first + 1} is not a residue letter "
            f"(expected {alphabet.RESIDUES} or X; {_hint(repair_option) if is_letter[k] else _INGEST_HINT})",
            # a sequence given in Python (pmlm.load) has no file to find the letter's line in
            line=sequence_line(path, line, first + 1) if os.path.isfile(path) else line,
        )
    if unknown == UNKNOWN_SKIP:
        return Checked(upper.decode("ascii"), None, int(bad.size), nucleotides)
    ids = ids.copy()
    ids[bad] = alphabet.X_ID
    marked = np.frombuffer(upper, dtype=np.uint8).copy()
    marked[bad] = ord(alphabet.UNKNOWN_RESIDUE)
    return Checked(marked.tobytes().decode("ascii"), ids, int(bad.size), nucleotides)


def iter_fasta_sequences(
    path: str | os.PathLike,
    *,
    unknown: str = UNKNOWN_ERROR,
    report: SequenceReport | None = None,
    repair_option: str | None = None,
) -> Iterator[Sequence]:
    """Every record of a FASTA / FASTA.gz file, checked (module docstring), one at a time; ``report`` (if given)
    counts what was read and repaired. The whole-file nucleotide check raises when the stream ends."""
    report = SequenceReport() if report is None else report
    seen: dict[str, int] = {}
    letters_read = nucleotides = 0
    for record in read_fasta(path):
        if record.id in seen:
            raise InputError(path, f"duplicate id {record.id!r} (first at line {seen[record.id]})", line=record.line)
        seen[record.id] = record.line
        checked = check_sequence(
            path, record.id, record.sequence, record.line, unknown=unknown, repair_option=repair_option
        )
        letters_read += len(checked.letters)
        nucleotides += checked.nucleotides
        if checked.residues is None:
            report.skipped_sequences += 1
            report.skipped_letters += checked.outside
            continue
        report.sequences += 1
        report.residues += len(checked.letters)
        report.lowercase_sequences += not record.sequence.isupper()
        if checked.outside:
            report.unknown_letters += checked.outside
            report.unknown_sequences += 1
        yield Sequence(record.id, checked.letters, checked.residues, record.line)
    if letters_read >= NUCLEOTIDE_MIN_LETTERS and nucleotides >= NUCLEOTIDE_SHARE * letters_read:
        raise InputError(
            path,
            f"looks like nucleotides ({nucleotides / letters_read:.0%} of its {letters_read:,} letters are A, C, G, "
            f"T, U or N); {_PROTEIN}",
        )


def check_fasta(
    path: str | os.PathLike, *, unknown: str = UNKNOWN_ERROR, repair_option: str | None = None
) -> SequenceReport:
    """Read the whole file once, keeping nothing but ids: what :func:`iter_fasta_sequences` would read and repair,
    or its first error (a first pass before work that must not start on a bad file)."""
    report = SequenceReport()
    for _ in iter_fasta_sequences(path, unknown=unknown, report=report, repair_option=repair_option):
        pass
    return report


def read_fasta_sequences(
    path: str | os.PathLike,
    *,
    unknown: str = UNKNOWN_ERROR,
    report: SequenceReport | None = None,
    repair_option: str | None = None,
) -> list[Sequence]:
    """Every record of a FASTA / FASTA.gz file, checked, as a list (:func:`iter_fasta_sequences`)."""
    return list(iter_fasta_sequences(path, unknown=unknown, report=report, repair_option=repair_option))
