"""What a downstream task is: ``Task``, the one type that fine-tuning, evaluation, the heads' scoring and the tables
ask, never a task's name. A task owns how its labelled files are read, the heads it accepts and builds, the targets
of a batch, its loss and the count that loss is divided by, what one protein's output is, and its metrics.

Adding a task is one module that defines a ``Task`` and its registration (``pmlm.tasks.registry.register``, or the
``pmlm.tasks`` entry point of an installed package). The built-in tasks are ``pmlm.tasks.contact_task`` (contact
maps), ``pmlm.tasks.residue_tasks`` (a class per residue: secondary structure, or a user's labels) and
``pmlm.tasks.sequence_tasks`` (a class or a value per protein: remote homology, TAPE's fluorescence and stability,
or a user's labels).

The task's data reaches it as ``Example``s: a protein's residues and its label, in the field that the task reads
(``coords`` / ``contacts`` for contact maps, ``labels`` per residue, ``label`` a class, ``value`` a number).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from pmlm.evaluation.metrics import IGNORE_LABEL
from pmlm.tasks.structures import CONTACT_THRESHOLD, ReadCounts, contact_map

# the formats of labelled files (``data.format``; auto tells them apart by name and content)
STRUCTURE_JSONL = "structure_jsonl"  # structure JSONL (.jsonl[.gz] whose records carry dssp)
TAPE = "tape"  # TAPE's JSON (.json[.gz]) or LMDB (.lmdb) split files
RAPTORX = "raptorx"  # a RaptorX-style contact set (.npz / .pkl, a folder of them, or a .jsonl without dssp)
TABLE = "table"  # a table of sequences and labels: CSV, TSV (optionally gzipped) or Parquet
FORMATS = (STRUCTURE_JSONL, TAPE, RAPTORX, TABLE)

# what one output of a task describes; the windows of a long protein are averaged per pair, per residue, or over
# the whole protein
PAIR = "pair"
RESIDUE = "residue"
PROTEIN = "protein"


@dataclass
class Example:
    """One protein and its label for one task."""

    id: str
    residues: np.ndarray  # (L,) uint8 token ids, no specials
    coords: np.ndarray | None = None  # (L, 3) contact atom, NaN rows unresolved (contact from coordinates)
    contacts: np.ndarray | None = None  # (L, L) bool (contact sets that ship a map instead of coordinates)
    valid: np.ndarray | None = None  # (L, L) bool, pairs with a known distance
    labels: np.ndarray | None = None  # (L,) int64 class per residue, IGNORE_LABEL = unscored
    label: int | None = None  # the protein's class
    value: float | None = None  # the protein's measured value

    def __len__(self) -> int:
        return int(self.residues.size)

    def contact_window(self, start: int, stop: int, threshold: float) -> tuple[np.ndarray, np.ndarray]:
        """(contacts, valid), (n, n) bool, for residues [start, stop)."""
        if self.coords is not None:
            return contact_map(self.coords[start:stop], threshold)
        return self.contacts[start:stop, start:stop], self.valid[start:stop, start:stop]


@dataclass
class TaskData:
    """Examples read from one file, with what was read and how."""

    path: str
    format: str
    task: str
    examples: list[Example]
    contact_atom: str | None  # None outside the contact task
    counts: ReadCounts
    classes: tuple[str, ...] | None = None  # the class names of a user's classification task, in id order


@dataclass(frozen=True)
class ReadOptions:
    """How a task file is read: ``data`` settings of the recipe plus what the head fixes (its classes)."""

    fmt: str  # one of FORMATS (auto resolved by the caller)
    contact_atom: str = "auto"
    threshold: float = CONTACT_THRESHOLD
    on_error: str = "raise"
    limit: int | None = None  # the first N proteins only
    num_classes: int | None = None  # a head's classes: labels at or above are an error
    classes: tuple[str, ...] | None = None  # class names in id order (None: the training file's, sorted)
    sequence_column: str = "sequence"  # table files: the residues
    label_column: str = "label"  # table files: the label
    id_column: str = "id"  # table files: the protein's name (row number when the column is absent)


class Task:
    """A downstream task. Subclasses set the class attributes and implement ``read``, ``build_head``, ``targets``,
    ``loss``, ``terms``, ``output`` and ``metrics``; the rest has defaults. Heads are torch modules and logits torch
    tensors; this module itself imports no torch, so that reading a task's files (``pmlm split-table``) needs
    none."""

    name: str  # as recipes' ``task``, head.json and the evaluation TSVs spell it
    kind: str  # what it predicts: contact map, residue classes, protein class or protein value
    heads: tuple[str, ...]  # head kinds it accepts; the first is what ``auto`` picks
    formats: tuple[str, ...]  # the file formats that label it
    headline: str  # the metric of validation rows and the one-line summaries
    metric_names: tuple[str, ...]  # the metrics ``metrics`` returns, in table order
    level = RESIDUE  # what one output describes: PAIR (L, L), RESIDUE (L, ...) or PROTEIN (1, ...)
    reads_pairs = False  # its heads read pair features, so M+ (the pair head's first block) applies
    num_classes: int | None = None  # fixed classes (None: ``head.num_classes`` or the training file's)

    def read(self, path, options: ReadOptions, counts: ReadCounts) -> Iterable[Example]:
        raise NotImplementedError

    def contact_atom(self, path, fmt: str, requested: str) -> str | None:
        """The atom that defines a contact in ``path`` (``data.contact_atom``, auto resolved); None for a task
        without contacts."""
        return None

    def file_classes(self, path, options: ReadOptions) -> tuple[str, ...] | None:
        """The class names a file's labels define, when the head takes them from its training file (a user's
        classification); None for a task with fixed classes or none."""
        return None

    def resolve(self, cfg, train: TaskData):
        """``cfg`` with what the training data decides: ``data.classes``, the training file's classes, when the file
        defined them (``file_classes``) and the recipe names none."""
        if cfg.data.classes is not None or train.classes is None:
            return cfg
        return dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, classes=tuple(train.classes)))

    def head_outputs(self, cfg) -> int:
        """Output units of the head: ``head.num_classes``, else the task's own classes, else those recorded from the
        training file (``data.classes``), else one."""
        return cfg.head.num_classes or self.num_classes or len(cfg.data.classes or ()) or 1

    def build_head(self, cfg, hidden: int):
        raise NotImplementedError

    def prepare_head(self, head, train: TaskData, cfg) -> None:
        """Set a fresh head's starting point from the training data (a contact prior, a value's scale)."""

    def targets(self, examples: list[Example], windows: list[tuple[int, int]], length: int, threshold: float):
        """(targets, valid or None) as numpy arrays for residues [start, stop) of each example, padded to
        ``length`` residues."""
        raise NotImplementedError

    def terms(self, batch, min_separation: int) -> int:
        """How many terms ``loss`` sums over ``batch``: the count the step's loss is divided by."""
        raise NotImplementedError

    def loss(self, logits, batch, min_separation: int, head=None):
        """The loss of ``batch`` summed over its ``terms`` (0 for an empty selection); ``head``, the head that gave
        ``logits`` (a regression head's scale)."""
        raise NotImplementedError

    def output(self, logits, k: int) -> np.ndarray:
        """One row's output over its ``k`` residues, the unit that windows of a long protein average: (k, k) per
        pair, (k, ...) per residue, or (1, ...) for the protein."""
        raise NotImplementedError

    def metrics(self, proteins: Iterable[tuple[Example, np.ndarray]], threshold: float) -> dict[str, tuple]:
        """{metric: (value, n)} of (protein, output over the protein) pairs."""
        raise NotImplementedError


def padded_labels(examples: list[Example], windows: list[tuple[int, int]], length: int) -> np.ndarray:
    """(n, length) int64 per-residue labels of each window, IGNORE_LABEL beyond it."""
    targets = np.full((len(examples), length), IGNORE_LABEL, dtype=np.int64)
    for b, (ex, (start, stop)) in enumerate(zip(examples, windows)):
        targets[b, : stop - start] = ex.labels[start:stop]
    return targets
