"""Where ``pmlm contacts`` writes (``pmlm.inference.contacts`` says what): ``-o DIR`` writes per-sequence files
(``NAME.tsv``, ``NAME.npz``, ``NAME.png``), ``-o NAME.parquet`` one table of every sequence's pairs, both through
``pmlm.outputs`` (the target checked before any work; nothing of the user's removed or changed). Also the
structures' true contacts that the rows and the PNG show."""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pmlm.errors import ConfigError, InputError
from pmlm.figures import draw_contact_map, pyplot
from pmlm.inference.sequences import Sequence
from pmlm.outputs import OutputError, file_target, folder_target, writing_files, writing_folder
from pmlm.tasks.structures import CONTACT_ATOMS, CONTACT_THRESHOLD, read_structure_jsonl

COMMAND = "pmlm contacts"
TABLE_SUFFIX = ".parquet"
# names of files, not of the folder -o otherwise names (a TSV or NPZ is written per sequence inside it)
FILE_SUFFIXES = (".tsv", ".npz", ".png", ".csv", ".json", ".txt", ".gz")
# each pair's columns (1-based i < j), as both forms write them; the table's rows start with the sequence's id
COLUMNS = {"i": pa.int32(), "j": pa.int32(), "residue_i": pa.string(), "residue_j": pa.string(),
           "separation": pa.int32(), "score": pa.float32()}  # fmt: skip
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


class Pairs(NamedTuple):
    """One sequence's rows: 0-based residue indices i < j (P,) each, float32 scores (P,), highest first; and how
    many pairs in the separation range were left out as no window holds them."""

    i: np.ndarray
    j: np.ndarray
    score: np.ndarray
    beyond_windows: int


def file_names(records: list[Sequence], fasta: str) -> list[str]:
    """Each record's file name stem in a folder: its id, characters other than letters, digits, ``._-`` as ``_``."""
    names, seen = [], {}
    for r in records:
        name = _UNSAFE.sub("_", r.id)
        if name in seen:
            raise InputError(fasta, f"ids {seen[name]!r} and {r.id!r} give the same file name {name!r}", line=r.line)
        seen[name] = r.id
        names.append(name)
    return names


def true_contacts(path: str | None, records: list[Sequence]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{sequence id: (contacts, valid)} for the FASTA records found in a structure JSONL (by ``id_chain`` or
    ``id``, with the same sequence); C-beta, 8 A."""
    if path is None:
        return {}
    wanted = {r.id: r for r in records}
    found = {}
    for record in read_structure_jsonl(path):
        for key in (record.name, record.id):
            if key in wanted and key not in found:
                if record.seq != wanted[key].letters:
                    raise InputError(path, f"{record.name}: sequence differs from FASTA record {key!r}")
                found[key] = record.contacts(CONTACT_ATOMS["structure_jsonl"], CONTACT_THRESHOLD)
    return found


def _contact_column(pairs: Pairs, known) -> tuple[np.ndarray, np.ndarray]:
    """(P,) int8 contact 1/0 and (P,) bool known (False where a residue is unresolved or there is no structure)."""
    if known is None:
        return np.zeros(len(pairs.i), dtype=np.int8), np.zeros(len(pairs.i), dtype=bool)
    contacts, valid = known
    return contacts[pairs.i, pairs.j].astype(np.int8), valid[pairs.i, pairs.j].astype(bool)


def _columns(record: Sequence, pairs: Pairs) -> list[np.ndarray]:
    """The COLUMNS of one sequence's rows, (P,) each."""
    letters = np.array(list(record.letters))
    return [pairs.i + 1, pairs.j + 1, letters[pairs.i], letters[pairs.j], pairs.j - pairs.i, pairs.score]


def write_tsv(path: Path, record: Sequence, pairs: Pairs, known, with_contact: bool) -> None:
    columns = [c.tolist() for c in _columns(record, pairs)[:-1]]
    columns.append([str(v) for v in pairs.score])  # float32's shortest text, the value the Parquet table holds
    header = list(COLUMNS)
    if with_contact:
        values, resolved = _contact_column(pairs, known)
        columns.append([str(v) if ok else "" for v, ok in zip(values.tolist(), resolved.tolist())])
        header.append("contact")
    with open(path, "w") as fh:
        fh.write("\t".join(header) + "\n")
        fh.writelines("\t".join(map(str, row)) + "\n" for row in zip(*columns))


def plot_map(path: Path, record: Sequence, scores: np.ndarray, known, kind: str, min_separation: int) -> None:
    plt = pyplot()  # matplotlib loads only with --png (the GPU image may lack it)
    length = len(record.letters)
    fig, ax = plt.subplots(figsize=(5, 5))
    contacts, valid = known if known is not None else (None, None)
    draw_contact_map(ax, scores, contacts, valid, min_sep=min_separation, label=kind)
    if known is None:
        ax.set_title(f"{record.id} (L = {length}): {kind}", fontsize=9)
    else:
        title = f"{record.id} (L = {length}): predicted (upper) vs true (lower), |i-j| >= {min_separation}"
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)  # inside the staging folder (pmlm.outputs.writing_folder)
    plt.close(fig)


def table_schema(settings: dict, with_contact: bool) -> pa.Schema:
    fields = [("id", pa.string()), *COLUMNS.items(), *([("contact", pa.int8())] if with_contact else [])]
    return pa.schema(fields, metadata={b"pmlm": json.dumps(settings).encode()})


def pair_table(record: Sequence, pairs: Pairs, known, schema: pa.Schema, with_contact: bool) -> pa.Table:
    arrays = [pa.array([record.id] * len(pairs.i), pa.string())]
    arrays += [pa.array(c.astype(t.to_pandas_dtype()), t) for c, t in zip(_columns(record, pairs), COLUMNS.values())]
    if with_contact:
        values, resolved = _contact_column(pairs, known)
        arrays.append(pa.array(values, pa.int8(), mask=~resolved))
    return pa.Table.from_arrays(arrays, schema=schema)


class ContactWriter:
    """The output of one run: checked when made (before any work), written by ``open``'s function per sequence."""

    def __init__(self, out: str | os.PathLike, *, overwrite: bool, png: bool, structure: bool):
        text = os.fspath(out)
        self.out, self.overwrite, self.png, self.structure = text, overwrite, png, structure
        self.folder = not Path(text).name.endswith(TABLE_SUFFIX)
        if self.folder:
            folder_target(text, command=COMMAND, overwrite=overwrite)
            if Path(text).suffix in FILE_SUFFIXES and not Path(text).is_dir():
                raise OutputError(
                    f"-o {text}: -o DIR writes per-sequence files, -o NAME{TABLE_SUFFIX} one table of every "
                    "sequence's pairs; name a folder or a .parquet file"
                )
        else:
            if png:
                raise ConfigError(f"--png writes a PNG per sequence into a folder: -o DIR, not -o {text}")
            file_target(text, suffixes=(TABLE_SUFFIX,), overwrite=overwrite)

    @contextlib.contextmanager
    def open(self, settings: dict) -> Iterator:
        """A function ``write(record, name, scores, pairs, known)`` for each sequence; the outputs appear when the
        block succeeds (none otherwise)."""
        if self.folder:
            with writing_folder(self.out, command=COMMAND, overwrite=self.overwrite) as folder:

                def write(record, name, scores, pairs, known):
                    write_tsv(folder / f"{name}.tsv", record, pairs, known, self.structure)
                    np.savez_compressed(  # a long sequence's map is mostly NaN beyond the windows
                        folder / f"{name}.npz",
                        scores=scores.astype(np.float32),
                        sequence=np.array(record.letters),
                        id=np.array(record.id),
                        score_kind=np.array(settings["score_kind"]),
                        precision=np.array(settings["precision"]),
                        settings=np.array(json.dumps(settings)),
                    )
                    if self.png:
                        kind, separation = settings["score_kind"], settings["min_separation"]
                        plot_map(folder / f"{name}.png", record, scores, known, kind, separation)

                yield write
            return
        schema = table_schema(settings, self.structure)
        with writing_files([self.out]) as [tmp], pq.ParquetWriter(tmp, schema, compression="zstd") as writer:
            yield lambda record, name, scores, pairs, known: writer.write_table(
                pair_table(record, pairs, known, schema, self.structure)
            )
