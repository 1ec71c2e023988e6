"""The inference outputs as types: each says what its shard jobs run, the files it is gathered into and the rows each
record gets there (``pmlm gather``), and what a sequence costs (``pmlm plan``, figures in pmlm.inference.pricing's
docstring). ``OUTPUTS`` holds one of each by name; the workflow's shard and gather rules ask the same objects."""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pmlm.inference.contacts import Readout, top_count
from pmlm.inference.embedding import PER_SEQUENCE_SUFFIX
from pmlm.inference.saturation import Marginal
from pmlm.tokens import window_starts
from pmlm.vocabulary import OUTPUT_CONTACTS, OUTPUT_EMBEDDINGS, OUTPUT_SUBSTITUTIONS, PMLM

PARQUET = ".parquet"
NUM_SUBSTITUTIONS = 19  # per residue: every other standard residue
JACOBIAN_PASSES = 20  # per residue of a window: each of the 20 residues substituted (plus the window itself)
PER_SEQUENCE_ROW_BYTES = 24  # an embedding's per-sequence row (id, length) besides its 4 C bytes
ALL_PAIRS = "all"  # inference.contacts.top: every pair a window holds, the command's own default


@dataclass(frozen=True)
class Table:
    """One gathered file of an output: its parts' suffix and the rows each of a shard's records gets."""

    suffix: str  # <shard><suffix> in the parts folder; <OUT without .parquet><suffix> gathered
    # rows of a record of L residues, each record in one run and in order; None: in order, at most one run, maybe none
    rows_of: Callable[[int], int] | None = None


@dataclass(frozen=True)
class InferenceOutput(ABC):
    """One output of ``pmlm embed`` / ``score`` / ``contacts`` run per shard and gathered per encoder."""

    name: str
    command: str  # the pmlm command a shard job runs (workflow/rules/inference.smk writes its arguments)
    options: tuple[str, ...]  # the inference section's keys it takes as flags, besides those every shard job takes
    bytes_per_row: int  # on disk (Parquet, zstd), measured on the tests' proteome (pricing's docstring)
    tables: tuple[Table, ...] = (Table(PARQUET),)

    def shard_settings(self, section: dict) -> dict:
        """The section's values of the flags this output's command takes (``options``)."""
        return {key: section[key] for key in self.options}

    def gathered_paths(self, out: str | os.PathLike) -> list[Path]:
        """The files ``pmlm gather`` writes: OUT, and a file beside it per further table."""
        stem = os.fspath(out).removesuffix(PARQUET)
        return [Path(stem + t.suffix) for t in self.tables]

    @abstractmethod
    def cost(self, encoder, length: int, settings) -> tuple[int, float, int]:
        """(forward passes, model FLOPs, rows) for one sequence of ``length`` residues through ``encoder``."""

    def disk_bytes(self, encoder, rows: int, sequences: int) -> float:
        return rows * self.bytes_per_row


def windows(encoder, length: int) -> list[int]:
    """The residues of each window the encoder reads a sequence of ``length`` residues in."""
    return [min(encoder.window, length - s) for s in window_starts(length, encoder.window)]


class Embeddings(InferenceOutput):
    def cost(self, encoder, length: int, settings) -> tuple[int, float, int]:
        runs = windows(encoder, length)
        return len(runs), sum(encoder.passes_flops(w + 2) for w in runs), length

    def disk_bytes(self, encoder, rows: int, sequences: int) -> float:
        # bytes_per_row: id, position, residue; a sequence's row: id, length; each plus 4 C of the embedding
        vector = 4 * encoder.hidden
        return rows * (vector + self.bytes_per_row) + sequences * (vector + PER_SEQUENCE_ROW_BYTES)


class Substitutions(InferenceOutput):
    def cost(self, encoder, length: int, settings) -> tuple[int, float, int]:
        rows = NUM_SUBSTITUTIONS * length
        if settings.marginal is Marginal.MASKED:
            return length, length * encoder.passes_flops(min(length, encoder.window) + 2, 1), rows
        runs = windows(encoder, length)
        return len(runs), sum(encoder.passes_flops(w + 2, w) for w in runs), rows


class Contacts(InferenceOutput):
    def shard_settings(self, section: dict) -> dict:
        """The contacts section; top: all is the command's own default (every pair), given by no --top."""
        return {k: v for k, v in section["contacts"].items() if (k, v) != ("top", ALL_PAIRS)}

    def cost(self, encoder, length: int, settings) -> tuple[int, float, int]:
        runs = windows(encoder, length)
        held = held_pairs(length, encoder.window, settings.min_separation)
        rows = held if settings.top == ALL_PAIRS else min(held, top_count(str(settings.top), length))
        if settings.readout is Readout.JACOBIAN or (settings.readout is Readout.AUTO and not encoder.pair_head):
            passes = sum(JACOBIAN_PASSES * w + 1 for w in runs)
            return passes, sum((JACOBIAN_PASSES * w + 1) * encoder.passes_flops(w + 2, w) for w in runs), rows
        return len(runs), sum(encoder.passes_flops(w + 2, w, PMLM) for w in runs), rows


def held_pairs(length: int, room: int, separation: int) -> int:
    """Pairs i < j with j - i >= ``separation`` that a window of ``room`` residues holds (those pmlm contacts scores)."""
    starts = window_starts(length, room)
    total = k = end = 0
    for i in range(length):
        while k < len(starts) and starts[k] <= i:  # the furthest end of a window holding residue i
            end = max(end, min(length, starts[k] + room))
            k += 1
        total += max(0, end - i - separation)
    return total


OUTPUTS: dict[str, InferenceOutput] = {
    o.name: o
    for o in (
        Embeddings(OUTPUT_EMBEDDINGS, "embed", ("layer", "unknown"), 8,
                   (Table(PARQUET, lambda length: length), Table(PER_SEQUENCE_SUFFIX, lambda length: 1))),
        Substitutions(OUTPUT_SUBSTITUTIONS, "score", ("marginal",), 8),  # id, mutant, position, wt, mut, score
        Contacts(OUTPUT_CONTACTS, "contacts", ("contacts",), 10),  # id, i, j, residue_i, residue_j, separation, score
    )
}  # fmt: skip
