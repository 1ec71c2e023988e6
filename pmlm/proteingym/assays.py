"""One ProteinGym substitution assay read as published: a CSV with ``mutant`` (``A1P:D2N``: wild type, 1-based
position in ``target_seq``, mutant, sites joined by ``:``), ``mutated_sequence``, ``DMS_score`` (higher is fitter)
and ``DMS_score_bin`` (1: above the assay's fitness cutoff). Other columns are ignored.

Every mutant is checked against the assay's ``target_seq``. A malformed mutant string, a letter that is not one
of the 20 residues, a site listed twice, a position outside ``target_seq``, a missing or non-numeric
``DMS_score`` and a ``DMS_score_bin`` other than 0 / 1 are errors naming file and line. A mutant whose wild
type disagrees with ``target_seq``, or whose ``mutated_sequence`` is not ``target_seq`` with the mutant's
substitutions, is skipped and counted (``mismatch="error"`` makes it an error instead); the counts and the first
line of each kind go into the score file's summary and the log. An assay with no mutant, or none left after
the skips, is an error.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import TextIO

from pmlm import alphabet
from pmlm.errors import ConfigError, InputError
from pmlm.inference.mutations import Site, split_mutant
from pmlm.proteingym.reference import checked_rows

ASSAY_COLUMNS = ("mutant", "mutated_sequence", "DMS_score", "DMS_score_bin")
MISMATCH_POLICIES = ("skip", "error")
WILD_TYPE_MISMATCH = "wild_type_disagrees_with_target_seq"
SEQUENCE_MISMATCH = "mutated_sequence_disagrees"
_BINS = {"0": 0, "1": 1, "0.0": 0, "1.0": 1}


@dataclass(frozen=True)
class AssayMutant:
    text: str
    sites: tuple[Site, ...]  # sorted by position
    dms_score: float
    dms_bin: int
    line: int


@dataclass
class AssayRead:
    """The mutants kept, in file order, and what was skipped (reason -> count, reason -> first 'line: mutant')."""

    mutants: list[AssayMutant]
    rows: int = 0
    skipped: Counter = field(default_factory=Counter)
    first_skipped: dict[str, str] = field(default_factory=dict)


def _sites(text: str, target: str, where: str, line: int) -> tuple[tuple[Site, ...], bool]:
    """The mutant's sites and whether every wild type agrees with ``target``; errors for what cannot be read."""
    parts = split_mutant(text) if text else None
    if parts is None:
        raise InputError(
            where, f"malformed mutant {text!r}: expected sites like A1P joined by ':' (A1P:D2N)", line=line
        )
    sites, agrees = [], True
    for wt, pos, mut in parts:
        for letter in (wt, mut):
            if letter not in alphabet.RESIDUES:
                raise InputError(where, f"mutant {text!r}: {letter!r} is not one of the 20 residues", line=line)
        if not 1 <= pos <= len(target):
            raise InputError(
                where, f"mutant {text!r}: position {pos} is outside target_seq (1..{len(target)})", line=line
            )
        agrees &= target[pos - 1] == wt
        sites.append(Site(pos - 1, alphabet.RESIDUES.index(wt), alphabet.RESIDUES.index(mut)))
    sites.sort(key=lambda s: s.pos)
    if any(a.pos == b.pos for a, b in itertools.pairwise(sites)):
        raise InputError(where, f"mutant {text!r}: a position appears twice", line=line)
    return tuple(sites), agrees


def _mutated(target: str, sites: tuple[Site, ...]) -> str:
    letters = list(target)
    for s in sites:
        letters[s.pos] = alphabet.RESIDUES[s.mut]
    return "".join(letters)


def _score(text: str, where: str, line: int) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not math.isfinite(value):
        raise InputError(where, f"DMS_score {text!r} is not a finite number", line=line)
    return value


def read_assay(fh: TextIO, where: str, target: str, *, mismatch: str = "skip") -> AssayRead:
    """The mutants of one assay CSV (``fh`` open as text; ``where`` names it in errors) checked against ``target``."""
    if mismatch not in MISMATCH_POLICIES:
        raise ConfigError(f"--mismatch must be one of {', '.join(MISMATCH_POLICIES)}, got {mismatch!r}")
    out = AssayRead(mutants=[])
    for line, row in checked_rows(fh, where, ASSAY_COLUMNS):
        out.rows += 1
        text = row["mutant"]
        sites, agrees = _sites(text, target, where, line)
        score = _score(row["DMS_score"], where, line)
        label = _BINS.get(row["DMS_score_bin"])
        if label is None:
            raise InputError(where, f"DMS_score_bin {row['DMS_score_bin']!r} is not 0 or 1", line=line)
        reason = None
        if not agrees:
            reason = WILD_TYPE_MISMATCH
        elif row["mutated_sequence"] != _mutated(target, sites):
            reason = SEQUENCE_MISMATCH
        if reason is not None:
            if mismatch == "error":
                message = (
                    "a wild type disagrees with target_seq"
                    if reason == WILD_TYPE_MISMATCH
                    else "mutated_sequence is not target_seq with the mutant's substitutions"
                )
                raise InputError(where, f"mutant {text!r}: {message}", line=line)
            out.skipped[reason] += 1
            out.first_skipped.setdefault(reason, f"line {line}: {text}")
            continue
        out.mutants.append(AssayMutant(text, sites, score, label, line))
    if out.rows == 0:
        raise InputError(where, "empty assay: no mutants after the header")
    if not out.mutants:
        raise InputError(
            where,
            f"none of the {out.rows} mutants agrees with target_seq "
            f"({', '.join(f'{k}: {v}' for k, v in sorted(out.skipped.items()))})",
        )
    return out
