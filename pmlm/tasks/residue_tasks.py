"""A class per residue: 3-state secondary structure (``ss3``: DSSP's H/E/C from structure JSONL, TAPE's
secondary_structure files) and a user's per-residue labels (``residue_classification``: a table file whose label
column holds one class per residue). A per-residue MLP or TAPE's convolutional head; cross-entropy per labelled
residue; accuracy pooled over all scored residues (what TAPE reports as Q3) and its mean per protein.
"""

from __future__ import annotations

import numpy as np
import torch.nn.functional as F

from pmlm import alphabet
from pmlm.evaluation.metrics import IGNORE_LABEL, q3_accuracy
from pmlm.model.task_heads import HeadKind, SecondaryStructureHead, TapeConvHead
from pmlm.tasks.labelled import LabelKind, read_table, table_classes
from pmlm.tasks.structures import SS3_STATES, read_structure_jsonl, ss3_to_labels
from pmlm.tasks.tape import SECONDARY_STRUCTURE, read_tape
from pmlm.tasks.task import STRUCTURE_JSONL, TABLE, TAPE, Example, ReadOptions, Task, padded_labels
from pmlm.vocabulary import TASK_RESIDUE_CLASSIFICATION, TASK_SS3


class ResidueClassification(Task):
    """A user's per-residue classes from a table file (``pmlm.tasks.labelled``); the classes are the training
    file's distinct labels in sorted order, recorded in the head (``data.classes``)."""

    name = TASK_RESIDUE_CLASSIFICATION
    kind = "residue classes"
    heads = (HeadKind.MLP, HeadKind.CONV)
    formats = (TABLE,)
    headline = "accuracy"
    metric_names = ("accuracy", "accuracy_per_protein")

    def read(self, path, options: ReadOptions, counts):
        yield from read_table(path, LabelKind.RESIDUE_LABELS, options, counts)

    def file_classes(self, path, options: ReadOptions) -> tuple[str, ...] | None:
        return None if self.num_classes else table_classes(path, LabelKind.RESIDUE_LABELS, options)

    def build_head(self, cfg, hidden: int):
        h = cfg.head
        head, width = {
            HeadKind.MLP: (SecondaryStructureHead, h.mlp_hidden),
            HeadKind.CONV: (TapeConvHead, h.conv_hidden),
        }[h.kind]
        return head(hidden, width, self.head_outputs(cfg), h.dropout)

    def targets(self, examples, windows, length):
        return padded_labels(examples, windows, length), None

    def terms(self, batch) -> int:
        """Labelled residues."""
        return int(batch.targets.ne(IGNORE_LABEL).sum())

    def loss(self, logits, batch, head=None):
        """Cross-entropy per labelled residue."""
        return F.cross_entropy(
            logits.float().flatten(0, 1), batch.targets.flatten(), ignore_index=IGNORE_LABEL, reduction="sum"
        )

    def output(self, logits, k: int) -> np.ndarray:
        return logits[:k].numpy()  # (k, classes)

    def metrics(self, proteins):
        preds, targets = [], []
        for protein, out in proteins:
            preds.append(out.argmax(-1))
            targets.append(protein.labels[: out.shape[0]])
        acc = q3_accuracy(preds, targets)
        pooled, per_protein = self.metric_names
        return {pooled: (acc.pooled, acc.n_proteins), per_protein: (acc.per_protein_mean, acc.n_proteins)}


class SecondaryStructure(ResidueClassification):
    """H, E, C (TAPE's encoding: 0, 1, 2). From structure JSONL a residue without a C-alpha has no label (DSSP
    had no backbone for it); from TAPE's files, residues outside NetSurfP's evaluation mask have none."""

    name = TASK_SS3
    kind = "residue classes"
    formats = (STRUCTURE_JSONL, TAPE)
    headline = "Q3"
    metric_names = ("Q3", "Q3_per_protein")
    num_classes = len(SS3_STATES)

    def read(self, path, options: ReadOptions, counts):
        if options.fmt == STRUCTURE_JSONL:
            for rec in read_structure_jsonl(path, on_error=options.on_error, counts=counts):
                labels = ss3_to_labels(rec.ss3)
                labels[~np.isfinite(rec.ca).all(axis=1)] = IGNORE_LABEL
                yield Example(rec.name, alphabet.encode(rec.seq), labels=labels)
        else:
            for rec in read_tape(path, SECONDARY_STRUCTURE, on_error=options.on_error, counts=counts):
                labels = np.where(rec.valid_mask, rec.ss3, IGNORE_LABEL).astype(np.int64)
                yield Example(rec.id, alphabet.encode(rec.primary), labels=labels)


RESIDUE_CLASSIFICATION = ResidueClassification()
SS3 = SecondaryStructure()
