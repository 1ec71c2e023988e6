"""What a downstream task is: ``Task``, the one type that fine-tuning, evaluation, the heads' scoring and the tables
ask, never a task's name. A task owns how its labelled files are read, the heads it accepts and builds, the targets
of a batch, its loss and the count that loss is divided by, what one protein's output is, and its metrics. Adding a
task is one module that defines a ``Task`` and its registration (``pmlm.tasks.registry``).

The task's data reaches it as ``Example``s: a protein's residues and its label, in the field that the task reads
(``coords`` / ``contacts`` for contact maps, ``labels`` per residue, ``label`` a class, ``value`` a number).
"""

from __future__ import annotations

import abc
import copy
import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from pmlm.evaluation.metrics import IGNORE_LABEL
from pmlm.tasks.structures import CONTACT_THRESHOLD, ReadCounts, contact_map

# the built-in formats of labelled files (``data.format``; ``pmlm.tasks.registry`` tells them apart by name and
# content, and takes a plug-in's own)
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
    task: Task  # as configured for the read (its settings)
    examples: list[Example]
    contact_atom: str | None  # None outside the contact task
    counts: ReadCounts
    classes: tuple[str, ...] | None = None  # the class names of a user's classification task, in id order


@dataclass(frozen=True)
class ReadOptions:
    """How a task file is read: ``data`` settings of the recipe plus what the head fixes (its classes)."""

    fmt: str  # a registered format's name (auto resolved by the caller)
    on_error: str = "raise"
    limit: int | None = None  # the first N proteins only
    num_classes: int | None = None  # a head's classes: labels at or above are an error
    classes: tuple[str, ...] | None = None  # class names in id order (None: the training file's, sorted)
    sequence_column: str = "sequence"  # table files: the residues
    label_column: str = "label"  # table files: the label
    id_column: str = "id"  # table files: the protein's name (row number when the column is absent)


@dataclass(frozen=True)
class TaskSettings:
    """What a run or an evaluation sets about its task once, when it configures it (``Task.configure``): how a
    contact is defined and which pairs the loss scores."""

    contact_atom: str = "auto"  # ``data.contact_atom``: auto = the format's own atom
    contact_threshold: float = CONTACT_THRESHOLD  # Angstrom; contact when distance <= this
    min_separation: int = 6  # the loss scores pairs with j - i >= this


class Task(abc.ABC):
    """A downstream task. Subclasses set the class attributes and implement the abstract methods; the rest has
    defaults. Heads are torch modules and logits torch tensors; this module itself imports no torch, so that
    reading a task's files (``pmlm split-table``) needs none. A registered task holds the default ``settings``;
    ``configure`` gives the copy a run or an evaluation works with."""

    name: str  # as recipes' ``task``, head.json and the evaluation TSVs spell it
    kind: str  # what it predicts: contact map, residue classes, protein class or protein value
    heads: tuple[str, ...]  # head kinds it accepts; the first is what ``auto`` picks
    formats: tuple[str, ...]  # the built-in file formats that label it (its ``read`` takes them)
    headline: str  # the metric of validation rows and the one-line summaries
    metric_names: tuple[str, ...]  # the metrics ``metrics`` returns, in table order
    level = RESIDUE  # what one output describes: PAIR (L, L), RESIDUE (L, ...) or PROTEIN (1, ...)
    reads_pairs = False  # its heads read pair features, so M+ (the pair head's first block) applies
    num_classes: int | None = None  # fixed classes (None: ``head.num_classes`` or the training file's)
    settings = TaskSettings()

    def configure(self, settings: TaskSettings) -> Task:
        """This task with ``settings`` bound (the registered one keeps the defaults)."""
        task = copy.copy(self)
        task.settings = settings
        return task

    @abc.abstractmethod
    def read(self, path, options: ReadOptions, counts: ReadCounts) -> Iterable[Example]:
        """The examples of a file in one of the task's ``formats`` (``options.fmt``)."""

    def contact_atom(self, path, fmt: str) -> str | None:
        """The atom that defines a contact in ``path`` (``settings.contact_atom``, auto resolved); None for a task
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

    @abc.abstractmethod
    def build_head(self, cfg, hidden: int):
        """A fresh head of kind ``cfg.head.kind`` on ``hidden``-wide representations."""

    def prepare_head(self, head, train: TaskData) -> None:  # noqa: B027 (a hook: most heads start as built)
        """Set a fresh head's starting point from the training data (a contact prior, a value's scale)."""

    @abc.abstractmethod
    def targets(self, examples: list[Example], windows: list[tuple[int, int]], length: int):
        """(targets, valid or None) as numpy arrays for residues [start, stop) of each example, padded to
        ``length`` residues."""

    @abc.abstractmethod
    def terms(self, batch) -> int:
        """How many terms ``loss`` sums over ``batch``: the count the step's loss is divided by."""

    @abc.abstractmethod
    def loss(self, logits, batch, head=None):
        """The loss of ``batch`` summed over its ``terms`` (0 for an empty selection); ``head``, the head that gave
        ``logits`` (a regression head's scale)."""

    @abc.abstractmethod
    def output(self, logits, k: int) -> np.ndarray:
        """One row's output over its ``k`` residues, the unit that windows of a long protein average: (k, k) per
        pair, (k, ...) per residue, or (1, ...) for the protein."""

    @abc.abstractmethod
    def metrics(self, proteins: Iterable[tuple[Example, np.ndarray]]) -> dict[str, tuple]:
        """{metric: (value, n)} of (protein, output over the protein) pairs."""


def padded_labels(examples: list[Example], windows: list[tuple[int, int]], length: int) -> np.ndarray:
    """(n, length) int64 per-residue labels of each window, IGNORE_LABEL beyond it."""
    targets = np.full((len(examples), length), IGNORE_LABEL, dtype=np.int64)
    for b, (ex, (start, stop)) in enumerate(zip(examples, windows)):
        targets[b, : stop - start] = ex.labels[start:stop]
    return targets
