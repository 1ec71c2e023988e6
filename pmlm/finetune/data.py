"""Batches of task data for fine-tuning and evaluation: deterministic, cropped, padded batches whose targets the task
makes (``pmlm.tasks``: what a task reads and labels), and the order a test set is read in.

Training batches follow from ``(seed, epoch)`` alone: the epoch's protein order and every
crop window are drawn from ``numpy.random.default_rng([seed, epoch])``, so the loader's
state is just ``(epoch, position)`` and a resumed run sees the same batches.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from pmlm.tasks.task import Example, Task
from pmlm.tokens import batch_tokens, crop_room, window_starts

TOO_LONG_CHOICES = ("windows", "crop", "skip")


@dataclass
class Batch:
    """Padded tensors of a few proteins (or windows of them)."""

    tokens: torch.Tensor  # (B, L + 2) int64: <cls>, residues, <eos>, <pad>
    mask: torch.Tensor  # (B, L) bool, real residues
    targets: torch.Tensor  # the task's: per pair (B, L, L) bool, per residue (B, L) int64, per protein (B,)
    valid: torch.Tensor | None  # contact only: (B, L, L) bool, pairs with a known distance
    ids: list[str]
    lengths: list[int]

    def to(self, device) -> Batch:
        move = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        for name in ("tokens", "mask", "targets", "valid"):
            if move[name] is not None:
                move[name] = move[name].to(device, non_blocking=True)
        return Batch(**move)


def collate(examples: list[Example], windows: list[tuple[int, int]], task: Task) -> Batch:
    """Residues [start, stop) of each example -> one padded Batch with ``task``'s targets."""
    rows = batch_tokens([ex.residues[start:stop] for ex, (start, stop) in zip(examples, windows)])
    length = rows.tokens.shape[1] - 2  # the longest window
    targets, valid = task.targets(examples, windows, length)
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

    def __init__(self, examples: list[Example], task: Task, batch_size: int, crop: int, seed: int):
        self.examples = examples
        self.task = task
        self.batch_size = batch_size
        self.crop = crop
        self.seed = seed
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
        return collate(examples, windows, self.task)

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

    def collate(self, rows: list[tuple[int, int, int]], task: Task) -> Batch:
        return collate([self.proteins[p] for p, _, _ in rows], [(a, b) for _, a, b in rows], task)


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
