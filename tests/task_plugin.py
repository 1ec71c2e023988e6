"""A task kind of one's own, as a user writes it: one module defining a ``Task`` (what it reads, its head, loss,
output and metrics). tests/test_user_tasks.py registers it and fine-tunes, evaluates and tables it through the
same entry points as the built-in tasks, with nothing else changed.

The task: which residues are charged (K, R, D, E), labelled from the sequence column of a table file alone."""

from __future__ import annotations

import numpy as np
import torch.nn.functional as F
from torch import nn

from pmlm import alphabet
from pmlm.evaluation.metrics import IGNORE_LABEL
from pmlm.tasks.labelled import load_table
from pmlm.tasks.task import RESIDUE, TABLE, Example, Task, padded_labels

CHARGED = "KRDE"


class ResidueLinear(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.out = nn.Linear(hidden, 2)

    def forward(self, reps, mask, pair_block=None):
        return self.out(reps)  # (B, L, 2)


class ChargedResidues(Task):
    name = "charged_residues"
    kind = "residue classes"
    heads = ("residue_linear",)
    formats = (TABLE,)
    headline = "accuracy"
    metric_names = ("accuracy",)
    level = RESIDUE
    num_classes = 2

    def read(self, path, options, counts):
        frame = load_table(path, [options.sequence_column], {options.sequence_column: "data.sequence_column"})
        for row, seq in enumerate(frame[options.sequence_column].tolist()):
            labels = np.array([int(c in CHARGED) for c in seq], dtype=np.int64)
            counts.read += 1
            yield Example(str(row + 1), alphabet.encode(seq), labels=labels)

    def build_head(self, cfg, hidden):
        return ResidueLinear(hidden)

    def targets(self, examples, windows, length):
        return padded_labels(examples, windows, length), None

    def terms(self, batch):
        return int(batch.targets.ne(IGNORE_LABEL).sum())

    def loss(self, logits, batch, head=None):
        return F.cross_entropy(
            logits.float().flatten(0, 1), batch.targets.flatten(), ignore_index=IGNORE_LABEL, reduction="sum"
        )

    def output(self, logits, k):
        return logits[:k].numpy()

    def metrics(self, proteins):
        right = total = 0
        n = 0
        for protein, out in proteins:
            right += int((out.argmax(-1) == protein.labels[: out.shape[0]]).sum())
            total += out.shape[0]
            n += 1
        return {"accuracy": (right / total, n)}


TASK = ChargedResidues()
