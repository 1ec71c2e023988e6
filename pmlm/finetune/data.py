"""Task data for fine-tuning and evaluation: labelled examples from structure JSONL, TAPE and RaptorX-style
files, and deterministic, cropped, padded batches.

Formats (``data.format: auto`` tells them apart by name and content):

* ``structure_jsonl`` (``.jsonl`` / ``.jsonl.gz`` whose records carry ``dssp``): contact maps
  from C-beta (or C-alpha) coordinates, 3-state secondary structure from DSSP. A residue
  with an unresolved atom takes part in no scored pair; a residue with an unresolved C-alpha
  has no secondary-structure label (DSSP had no backbone for it).
* ``tape`` (``.json`` / ``.json.gz`` / ``.lmdb``): ProteinNet (C-alpha contacts),
  secondary_structure (ss3, NetSurfP's evaluation mask) or remote_homology (fold labels).
* ``raptorx`` (a folder of ``.npz`` / ``.pkl``, one such file, or a ``.jsonl`` without
  ``dssp``): C-beta contact sets, see ``pmlm.tasks.raptorx``.

Training batches follow from ``(seed, epoch)`` alone: the epoch's protein order and every
crop window are drawn from ``numpy.random.default_rng([seed, epoch])``, so the loader's
state is just ``(epoch, position)`` and a resumed run sees the same batches.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from pmlm import alphabet
from pmlm.errors import ConfigError, InputError
from pmlm.evaluation.metrics import IGNORE_LABEL  # per-residue label of unscored residues
from pmlm.tasks.raptorx import read_contact_set
from pmlm.tasks.structures import (
    CONTACT_ATOMS,
    CONTACT_THRESHOLD,
    ReadCounts,
    contact_map,
    read_structure_jsonl,
    ss3_to_labels,
)
from pmlm.tasks.tape import read_tape
from pmlm.tokens import batch_tokens, crop_room, window_starts

# which formats can label which task
FORMAT_TASKS: dict[str, tuple[str, ...]] = {
    "structure_jsonl": ("contact", "ss3"),
    "tape": ("contact", "ss3", "remote_homology"),
    "raptorx": ("contact",),
}
TAPE_TASKS = {"contact": "proteinnet", "ss3": "secondary_structure", "remote_homology": "remote_homology"}
FORMAT_ATOMS = {
    "structure_jsonl": CONTACT_ATOMS["structure_jsonl"],
    "tape": CONTACT_ATOMS["tape_proteinnet"],
    "raptorx": CONTACT_ATOMS["raptorx"],
}
TOO_LONG_CHOICES = ("windows", "crop", "skip")


@dataclass
class Example:
    """One protein and its label for one task."""

    id: str
    residues: np.ndarray  # (L,) uint8 token ids, no specials
    coords: np.ndarray | None = None  # (L, 3) contact atom, NaN rows unresolved (contact from coordinates)
    contacts: np.ndarray | None = None  # (L, L) bool (contact sets that ship a map instead of coordinates)
    valid: np.ndarray | None = None  # (L, L) bool, pairs with a known distance
    labels: np.ndarray | None = None  # (L,) int64 ss3 classes, IGNORE_LABEL = unscored
    label: int | None = None  # remote homology fold

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


def detect_format(path: str | Path) -> str:
    """structure_jsonl | tape | raptorx from the path's name (and a JSONL file's first record)."""
    path = Path(path)
    name = path.name.lower()
    if path.is_dir() and not name.endswith(".lmdb"):
        return "raptorx"
    if name.endswith((".npz", ".pkl")):
        return "raptorx"
    if name.endswith((".json", ".json.gz", ".lmdb")):
        return "tape"
    if name.endswith((".jsonl", ".jsonl.gz")):
        if not path.exists():
            raise InputError(path, "no such file or directory")
        opener = gzip.open if name.endswith(".gz") else open
        try:
            with opener(path, "rt", encoding="utf-8") as fh:
                first = next((line for line in fh if line.strip()), "")
            record = json.loads(first) if first else {}
        except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise InputError(path, f"cannot tell the format from the first record ({exc})", line=1) from None
        return "structure_jsonl" if isinstance(record, dict) and "dssp" in record else "raptorx"
    raise InputError(
        path,
        "cannot tell the format from the name (expected .jsonl[.gz], .json[.gz], .lmdb, .npz, "
        ".pkl or a folder); set data.format",
    )


def _tokens(seq: str) -> np.ndarray:
    return alphabet.encode(seq)  # readers have validated the letters


def read_task_data(
    path: str | Path,
    task: str,
    *,
    fmt: str = "auto",
    contact_atom: str = "auto",
    threshold: float = CONTACT_THRESHOLD,
    on_error: str = "raise",
    limit: int | None = None,
    num_classes: int | None = None,
) -> TaskData:
    """Read labelled examples for ``task`` from ``path``; bad records raise InputError (or are counted with skip)."""
    path = Path(path)
    if fmt == "auto":
        fmt = detect_format(path)
    if task not in FORMAT_TASKS[fmt]:
        raise InputError(path, f"a {fmt} file has no labels for task {task} (it serves {', '.join(FORMAT_TASKS[fmt])})")
    atom = None
    if task == "contact":
        atom = FORMAT_ATOMS[fmt] if contact_atom == "auto" else contact_atom
        if fmt != "structure_jsonl" and atom != FORMAT_ATOMS[fmt]:
            raise ConfigError(
                f"{path}: {fmt} data defines contacts by {FORMAT_ATOMS[fmt]} only; "
                f"data.contact_atom {contact_atom} cannot apply (use auto)"
            )
    counts = ReadCounts()
    examples: list[Example] = []
    if fmt == "structure_jsonl":
        for rec in read_structure_jsonl(path, on_error=on_error, counts=counts):
            ex = Example(rec.name, _tokens(rec.seq))
            if task == "contact":
                ex.coords = rec.coords(atom)
            else:
                labels = ss3_to_labels(rec.ss3)
                labels[~np.isfinite(rec.ca).all(axis=1)] = IGNORE_LABEL
                ex.labels = labels
            examples.append(ex)
            if limit and len(examples) >= limit:
                break
    elif fmt == "tape":
        for rec in read_tape(path, TAPE_TASKS[task], on_error=on_error, counts=counts):
            ex = Example(rec.id, _tokens(rec.primary))
            if task == "contact":
                ex.coords = rec.tertiary
            elif task == "ss3":
                ex.labels = np.where(rec.valid_mask, rec.ss3, IGNORE_LABEL).astype(np.int64)
            else:
                if num_classes is not None and rec.fold_label >= num_classes:
                    raise InputError(
                        path, f"record {rec.id}: fold_label {rec.fold_label} >= head.num_classes {num_classes}"
                    )
                ex.label = rec.fold_label
            examples.append(ex)
            if limit and len(examples) >= limit:
                break
    else:
        for rec in read_contact_set(path, threshold=threshold, on_error=on_error, counts=counts):
            examples.append(Example(rec.id, _tokens(rec.seq), contacts=rec.contacts, valid=rec.valid))
            if limit and len(examples) >= limit:
                break
    if not examples:
        raise InputError(path, f"no usable {task} examples (read {counts.read}, skipped {counts.n_skipped})")
    return TaskData(str(path), fmt, task, examples, atom, counts)


def contact_rate(examples: list[Example], threshold: float, min_separation: int, limit: int) -> float | None:
    """Fraction of contacts among the scored pairs (known distance, j - i >= min_separation) of the
    first ``limit`` examples; None when there is no scored pair."""
    hits = total = 0
    for ex in examples[:limit]:
        contacts, valid = ex.contact_window(0, len(ex), threshold)
        scored = np.triu(valid, k=min_separation)
        hits += int(contacts[scored].sum())
        total += int(scored.sum())
    return hits / total if total else None


@dataclass
class Batch:
    """Padded tensors of a few proteins (or windows of them)."""

    tokens: torch.Tensor  # (B, L + 2) int64: <cls>, residues, <eos>, <pad>
    mask: torch.Tensor  # (B, L) bool, real residues
    targets: torch.Tensor  # contact (B, L, L) bool | ss3 (B, L) int64 | remote homology (B,) int64
    valid: torch.Tensor | None  # contact only: (B, L, L) bool, pairs with a known distance
    ids: list[str]
    lengths: list[int]

    def to(self, device) -> Batch:
        move = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        for name in ("tokens", "mask", "targets", "valid"):
            if move[name] is not None:
                move[name] = move[name].to(device, non_blocking=True)
        return Batch(**move)


def collate(examples: list[Example], windows: list[tuple[int, int]], task: str, threshold: float) -> Batch:
    """Residues [start, stop) of each example -> one padded Batch."""
    n = len(examples)
    rows = batch_tokens([ex.residues[start:stop] for ex, (start, stop) in zip(examples, windows)])
    length = rows.tokens.shape[1] - 2  # the longest window
    valid = None
    if task == "contact":
        targets = np.zeros((n, length, length), dtype=bool)
        valid = np.zeros((n, length, length), dtype=bool)
    elif task == "ss3":
        targets = np.full((n, length), IGNORE_LABEL, dtype=np.int64)
    else:
        targets = np.zeros(n, dtype=np.int64)
    for b, (ex, (start, stop)) in enumerate(zip(examples, windows)):
        k = stop - start
        if task == "contact":
            targets[b, :k, :k], valid[b, :k, :k] = ex.contact_window(start, stop, threshold)
        elif task == "ss3":
            targets[b, :k] = ex.labels[start:stop]
        else:
            targets[b] = ex.label
    return Batch(
        tokens=torch.from_numpy(rows.tokens),
        mask=torch.from_numpy(rows.residue_mask()),
        targets=torch.from_numpy(targets),
        valid=None if valid is None else torch.from_numpy(valid),
        ids=[ex.id for ex in examples],
        lengths=[stop - start for start, stop in windows],
    )


class TaskLoader:
    """Endless stream of training batches; order and crops are a function of (seed, epoch)."""

    def __init__(self, examples: list[Example], task: str, batch_size: int, crop: int, seed: int, threshold: float):
        self.examples = examples
        self.task = task
        self.batch_size = batch_size
        self.crop = crop
        self.seed = seed
        self.threshold = threshold
        self.epoch = 0
        self.position = 0  # batches of the current epoch already handed out
        self._plan: list[list[tuple[int, int]]] | None = None

    def epoch_plan(self, epoch: int) -> list[list[tuple[int, int]]]:
        """Batches of one epoch as lists of (example index, crop start)."""
        rng = np.random.default_rng([self.seed, epoch])
        order = rng.permutation(len(self.examples))
        lengths = np.array([len(self.examples[i]) for i in order])
        # one draw per protein, in order, whether or not it needs a crop: plans stay stable
        starts = (rng.random(order.size) * crop_room(lengths, self.crop)).astype(np.int64)
        items = list(zip(order.tolist(), starts.tolist()))
        return [items[k : k + self.batch_size] for k in range(0, len(items), self.batch_size)]

    def next_batch(self) -> Batch:
        if self._plan is None:
            self._plan = self.epoch_plan(self.epoch)
        if self.position >= len(self._plan):
            self.epoch += 1
            self.position = 0
            self._plan = self.epoch_plan(self.epoch)
        chosen = self._plan[self.position]
        self.position += 1
        examples = [self.examples[i] for i, _ in chosen]
        windows = [(s, min(s + self.crop, len(self.examples[i]))) for i, s in chosen]
        return collate(examples, windows, self.task, self.threshold)

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        self._plan = None


@dataclass
class EvaluationPlan:
    """The order a test set is read in: batches of (protein index, start, stop) windows of ``proteins``."""

    proteins: list[Example]  # the proteins scored, shortest first
    batches: list[list[tuple[int, int, int]]]  # rows of each batch: (index into proteins, start, stop)
    windows: list[int]  # windows per protein (1 unless it is longer than the window)
    n_long: int  # proteins of the test set longer than the window

    def collate(self, rows: list[tuple[int, int, int]], task: str, threshold: float) -> Batch:
        return collate([self.proteins[p] for p, _, _ in rows], [(a, b) for _, a, b in rows], task, threshold)


def evaluation_plan(examples: list[Example], batch_size: int, window: int, too_long: str) -> EvaluationPlan:
    """Test proteins in a fixed order (by length, for little padding), ``batch_size`` rows per batch.

    A protein longer than ``window`` residues is, under ``too_long``:

    * ``windows``: read as the overlapping windows of ``pmlm.tokens.window_starts`` (half a window
      apart, the last flush with its end), one row each, in consecutive rows; the caller averages the
      windows' outputs over their overlap (``pmlm.tokens.WindowMean``) and scores the protein at its
      true length;
    * ``crop``: cut to its first ``window`` residues (and then scored with L = window);
    * ``skip``: left out.

    Either way their number is ``n_long``.
    """
    if too_long not in TOO_LONG_CHOICES:
        raise ValueError(f"too_long must be one of {TOO_LONG_CHOICES}, got {too_long!r}")
    n_long = sum(len(ex) > window for ex in examples)
    kept = sorted((ex for ex in examples if too_long != "skip" or len(ex) <= window), key=len)
    rows, windows = [], []
    for p, ex in enumerate(kept):
        starts = window_starts(len(ex), window) if too_long == "windows" else [0]
        rows.extend((p, start, min(start + window, len(ex))) for start in starts)
        windows.append(len(starts))
    batches = [rows[k : k + batch_size] for k in range(0, len(rows), batch_size)]
    return EvaluationPlan(kept, batches, windows, n_long)
