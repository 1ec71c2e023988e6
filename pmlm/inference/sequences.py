"""The sequences the inference commands read: FASTA records checked to be residue sequences (one-line errors
naming file and line).

A FASTA read here must already be clean: residues ``ACDEFGHIKLMNPQRSTVWY`` or ``X``, unique non-empty ids.
Anything else is an error, not a repair: ``pmlm ingest`` is the command that normalises sequences and
counts what it changed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from pmlm import alphabet
from pmlm.data.fasta import read_fasta
from pmlm.errors import InputError


@dataclass(frozen=True)
class Sequence:
    """One FASTA record, checked: its id, letters, residue token ids (uint8) and header line."""

    id: str
    letters: str
    residues: np.ndarray  # (L,) token ids, no specials
    line: int


def check_sequence(path: str | os.PathLike, seq_id: str, letters: str, line: int) -> np.ndarray:
    """Residue token ids of one record, or a one-line error naming the file and the record's line."""
    if not seq_id:
        raise InputError(path, "record without an id", line=line)
    if not letters:
        raise InputError(path, f"record {seq_id!r} has no residues", line=line)
    try:
        return alphabet.encode(letters)
    except ValueError as exc:
        raise InputError(
            path,
            f"record {seq_id!r}: {exc} (expected {alphabet.RESIDUES} or X; pmlm ingest normalises sequences)",
            line=line,
        ) from None


def read_fasta_sequences(path: str | os.PathLike) -> list[Sequence]:
    """Every record of a FASTA / FASTA.gz file, checked (unique ids, residue letters)."""
    out, seen = [], {}
    for record in read_fasta(path):
        if record.id in seen:
            raise InputError(path, f"duplicate id {record.id!r} (first at line {seen[record.id]})", line=record.line)
        seen[record.id] = record.line
        out.append(
            Sequence(
                record.id, record.sequence, check_sequence(path, record.id, record.sequence, record.line), record.line
            )
        )
    return out
