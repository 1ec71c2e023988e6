"""``pmlm score MODEL --sequence FASTA --mutations CSV -o SCORES.tsv``: the mutants of a CSV scored against one wild
type (``pmlm.inference.mutations``' rule), written beside the CSV's own columns (docs/cli.md, ``pmlm score``).

The CSV's mutant column is ``mutant`` (the ProteinGym / ESM convention; ``mutation`` is accepted too); blank rows
are skipped. An input column named like one the command adds is an error (line 1 of the CSV). The output is a file
target of ``pmlm.outputs``: checked before anything is read or loaded, written under a temporary name and renamed
at the end.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from pmlm.artefacts import recorded_precision
from pmlm.errors import InputError
from pmlm.inference.mutations import Mutant, far_apart_notes, mutant_scores, parse_mutant
from pmlm.inference.sequences import UNKNOWN_ERROR, UNKNOWN_OPTION, SequenceReport, read_fasta_sequences
from pmlm.outputs import file_target, writing_files
from pmlm.pretrained import load_encoder, pick_device
from pmlm.train.runtime import autocast, evaluation_precision

MUTANT_COLUMNS = ("mutant", "mutation")
SCORE_COLUMNS = ("kind", "score", "additive", "epistasis", "double_from", "triple_from", "multi_from", "precision")
SUFFIXES = (".tsv",)


@dataclass(frozen=True)
class MutationsFile:
    """A mutations CSV as read: its header and each mutant row's cells, as given, and the mutants parsed."""

    header: list[str]
    cells: list[list[str]]
    mutants: list[Mutant]


def read_mutants(path: str | Path, letters: str) -> MutationsFile:
    path = str(path)
    if not Path(path).is_file():
        raise InputError(path, "no such file")
    try:
        with open(path, newline="", encoding="utf-8-sig") as fh:  # spreadsheets start CSVs with a BOM
            reader = csv.reader(fh)
            header = next(reader, None)
            if header is None:
                raise InputError(path, "empty file (expected a header row with a 'mutant' column)", line=1)
            names = [h.strip() for h in header]
            column = next((names.index(c) for c in MUTANT_COLUMNS if c in names), None)
            if column is None:
                raise InputError(path, f"no 'mutant' column in the header {','.join(names)!r}", line=1)
            clash = next((n for n in names if n in SCORE_COLUMNS), None)
            if clash is not None:
                added = ", ".join(SCORE_COLUMNS)
                raise InputError(path, f"column {clash!r} is one that pmlm score adds ({added}); rename it", line=1)
            cells, mutants = [], []
            for row in reader:
                if not any(cell.strip() for cell in row):
                    continue
                if len(row) != len(header):
                    raise InputError(path, f"{len(row)} fields, the header has {len(header)}", line=reader.line_num)
                if not row[column].strip():
                    raise InputError(path, "empty mutant", line=reader.line_num)
                mutants.append(parse_mutant(row[column], letters, path, reader.line_num))
                cells.append(row)
    except UnicodeDecodeError:
        raise InputError(path, "not UTF-8 text") from None
    except csv.Error as exc:
        raise InputError(path, f"malformed CSV: {exc}") from None
    if not mutants:
        raise InputError(path, "no mutants after the header")
    return MutationsFile(header, cells, mutants)


def _cell(value) -> str:
    return "" if value is None else repr(value) if isinstance(value, float) else str(value)


def write_scores(path: str | Path, table: MutationsFile, rows: list[dict]) -> None:
    """The input's columns then ``SCORE_COLUMNS``, one row per mutant (``rows`` in the order of ``table``)."""
    with writing_files([path]) as (tmp,), open(tmp, "w", newline="") as fh:
        writer = csv.writer(fh, delimiter="\t", lineterminator="\n")
        writer.writerow([*table.header, *SCORE_COLUMNS])
        for cells, row in zip(table.cells, rows):
            writer.writerow([*cells, *(_cell(row[c]) for c in SCORE_COLUMNS)])


def score_fasta(
    model: str,
    sequence: str,
    mutations: str,
    out: str,
    *,
    double: str = "auto",
    triple: str = "auto",
    device: str = "auto",
    precision: str = "auto",
    unknown: str = UNKNOWN_ERROR,
    overwrite: bool = False,
    adapter: str | None = None,
) -> dict:
    """Score the mutants listed in the CSV ``mutations`` of the one wild type in FASTA ``sequence`` with encoder
    ``model`` (with ``adapter``'s adapters in it, ``--adapter``) at ``precision`` (``--precision``); ``unknown`` as
    ``--unknown`` (pmlm.inference.sequences); writes the TSV ``out``. Returns the wild type's id, the rows, the
    precision, the notes on mutants scored additively because their sites do not fit one window, and the
    SequenceReport of what was read and repaired as ``report``."""
    target = file_target(out, suffixes=SUFFIXES, what="scores", overwrite=overwrite)
    report = SequenceReport()
    records = read_fasta_sequences(sequence, unknown=unknown, report=report, repair_option=UNKNOWN_OPTION)
    if not records and report.skipped_sequences:
        raise InputError(sequence, f"{UNKNOWN_OPTION} skip left out the wild type (letters outside the alphabet)")
    if len(records) != 1:
        line = records[1].line if len(records) > 1 else None
        raise InputError(sequence, f"expected one sequence (the wild type), found {len(records)}", line=line)
    wild = records[0]
    table = read_mutants(mutations, wild.letters)
    dev = pick_device(device)
    encoder, info, weights = load_encoder(model, dev, adapter=adapter)
    recorded = recorded_precision(info, weights)
    arithmetic = evaluation_precision(dev, recorded, precision, trained="the encoder", command="pmlm score")
    with autocast(arithmetic, dev)():
        scored = mutant_scores(encoder, wild.residues, table.mutants, double=double, triple=triple, device=dev,
                               path=mutations, model_name=str(weights))  # fmt: skip
    rows = [{**row, "precision": arithmetic} for row in scored.rows]
    write_scores(target, table, rows)
    notes = far_apart_notes(scored)
    return {"id": wild.id, "rows": rows, "precision": arithmetic, "notes": notes, "report": report}
