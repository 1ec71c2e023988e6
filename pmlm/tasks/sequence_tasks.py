"""A class or a value per protein, from the mean of its residues' representations through an MLP head.

* ``remote_homology``: TAPE's fold classes (1,195), cross-entropy per protein, top-1 accuracy.
* ``sequence_classification``: a user's classes from a table file (``pmlm.tasks.labelled``), the training file's
  distinct labels in sorted order (recorded in the head as ``data.classes``); accuracy and macro-F1 (the mean over
  the classes present in the test set's labels or predictions of each class's F1).
* ``fluorescence`` and ``stability``: TAPE's regression tasks (GFP's log-fluorescence, Rocklin's stability score),
  from TAPE's JSON or LMDB files; ``sequence_regression``: a user's values from a table file. The head predicts
  the value on the training set's scale (its mean and standard deviation, set before the first step and kept in
  the head's weights); the loss is the squared error in units of that deviation; Spearman's rho (TAPE's metric),
  Pearson's r and the mean squared error on the value's own scale.

A protein longer than the encoder's window is scored by the mean of its windows' outputs (logits or values).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from pmlm import alphabet
from pmlm.errors import InputError
from pmlm.evaluation.fitness import spearman
from pmlm.evaluation.metrics import top1_accuracy
from pmlm.model.task_heads import HeadKind, SequenceHead, SequenceRegressionHead
from pmlm.tasks.labelled import LabelKind, read_table, table_classes
from pmlm.tasks.tape import FLUORESCENCE, NUM_FOLDS, REMOTE_HOMOLOGY, STABILITY, read_tape
from pmlm.tasks.task import PROTEIN, TABLE, TAPE, Example, ReadOptions, Task
from pmlm.vocabulary import (
    TASK_FLUORESCENCE,
    TASK_REMOTE_HOMOLOGY,
    TASK_SEQUENCE_CLASSIFICATION,
    TASK_SEQUENCE_REGRESSION,
    TASK_STABILITY,
)


def macro_f1(pred: np.ndarray, labels: np.ndarray) -> float:
    """The mean F1 over the classes that occur among the labels or the predictions (NaN without examples)."""
    if labels.size == 0:
        return math.nan
    scores = []
    for c in np.union1d(pred, labels):
        tp = int(((pred == c) & (labels == c)).sum())
        fp = int(((pred == c) & (labels != c)).sum())
        fn = int(((pred != c) & (labels == c)).sum())
        scores.append(2 * tp / (2 * tp + fp + fn))
    return float(np.mean(scores))


class PerProtein(Task):
    """What every per-protein task shares: the residues' mean through an MLP head, one term per protein, the
    protein's output over its windows."""

    heads = (HeadKind.MLP,)
    level = PROTEIN

    def terms(self, batch) -> int:
        """Proteins."""
        return batch.targets.numel()

    def output(self, logits, k: int) -> np.ndarray:
        return logits[None].numpy()  # (1, classes) or (1,)


class SequenceClassification(PerProtein):
    name = TASK_SEQUENCE_CLASSIFICATION
    kind = "protein class"
    formats = (TABLE,)
    headline = "accuracy"
    metric_names = ("accuracy", "macro_F1")

    def read(self, path, options: ReadOptions, counts):
        yield from read_table(path, LabelKind.CLASS, options, counts)

    def file_classes(self, path, options: ReadOptions) -> tuple[str, ...] | None:
        return None if self.num_classes else table_classes(path, LabelKind.CLASS, options)

    def build_head(self, cfg, hidden: int):
        return SequenceHead(hidden, cfg.head.mlp_hidden, self.head_outputs(cfg), cfg.head.dropout)

    def targets(self, examples, windows, length):
        return np.array([ex.label for ex in examples], dtype=np.int64), None

    def loss(self, logits, batch, head=None):
        """Cross-entropy per protein."""
        return F.cross_entropy(logits.float(), batch.targets, reduction="sum")

    def metrics(self, proteins):
        preds, labels = [], []
        for protein, out in proteins:
            preds.append(int(out[0].argmax(-1)))
            labels.append(protein.label)
        pred, label = np.array(preds, dtype=np.int64), np.array(labels, dtype=np.int64)
        accuracy, f1 = self.metric_names
        return {accuracy: (top1_accuracy(pred, label), int(label.size)), f1: (macro_f1(pred, label), int(label.size))}


class RemoteHomology(SequenceClassification):
    """TAPE's remote homology: the fold of a domain, tested on folds, superfamilies and families held out."""

    name = TASK_REMOTE_HOMOLOGY
    formats = (TAPE,)
    headline = "top1"
    metric_names = ("top1", "macro_F1")
    num_classes = NUM_FOLDS

    def read(self, path, options: ReadOptions, counts):
        for rec in read_tape(path, REMOTE_HOMOLOGY, on_error=options.on_error, counts=counts):
            if options.num_classes is not None and rec.fold_label >= options.num_classes:
                raise InputError(
                    path, f"record {rec.id}: fold_label {rec.fold_label} >= head.num_classes {options.num_classes}"
                )
            yield Example(rec.id, alphabet.encode(rec.primary), label=rec.fold_label)


class SequenceRegression(PerProtein):
    name = TASK_SEQUENCE_REGRESSION
    kind = "protein value"
    formats = (TABLE,)
    headline = "spearman"
    metric_names = ("spearman", "pearson", "mse")
    num_classes = 1

    def read(self, path, options: ReadOptions, counts):
        yield from read_table(path, LabelKind.VALUE, options, counts)

    def build_head(self, cfg, hidden: int):
        return SequenceRegressionHead(hidden, cfg.head.mlp_hidden, cfg.head.dropout)

    def prepare_head(self, head, train) -> None:
        """The training set's mean and standard deviation (1 when the values do not vary)."""
        values = np.array([ex.value for ex in train.examples], dtype=np.float64)
        scale = float(values.std()) if values.size > 1 and values.std() > 0 else 1.0
        head.set_scale(float(values.mean()), scale)

    def targets(self, examples, windows, length):
        return np.array([ex.value for ex in examples], dtype=np.float32), None

    def loss(self, logits, batch, head=None):
        """Squared error in units of the training set's standard deviation (the head's scale), per protein."""
        return torch.sum(((logits.float() - batch.targets.float()) / head.target_scale.float()) ** 2)

    def metrics(self, proteins):
        preds, values = [], []
        for protein, out in proteins:
            preds.append(float(out[0]))
            values.append(protein.value)
        pred, value = np.array(preds), np.array(values)
        n = int(value.size)
        pearson = float(np.corrcoef(pred, value)[0, 1]) if n > 1 and pred.std() > 0 and value.std() > 0 else math.nan
        return {
            "spearman": (spearman(value, pred) if n > 1 else math.nan, n),
            "pearson": (pearson, n),
            "mse": (float(np.mean((pred - value) ** 2)) if n else math.nan, n),
        }


class TapeRegression(SequenceRegression):
    """One of TAPE's regression tasks, read from its own split files (``<task>/<task>_<split>.json``)."""

    formats = (TAPE,)

    def __init__(self, name: str, tape_task: str):
        self.name = name
        self.tape_task = tape_task

    def read(self, path, options: ReadOptions, counts):
        for rec in read_tape(path, self.tape_task, on_error=options.on_error, counts=counts):
            yield Example(rec.id, alphabet.encode(rec.primary), value=rec.value)


SEQUENCE_CLASSIFICATION = SequenceClassification()
REMOTE_HOMOLOGY_TASK = RemoteHomology()
SEQUENCE_REGRESSION = SequenceRegression()
FLUORESCENCE_TASK = TapeRegression(TASK_FLUORESCENCE, FLUORESCENCE)
STABILITY_TASK = TapeRegression(TASK_STABILITY, STABILITY)
