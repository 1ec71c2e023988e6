"""Contact maps: which residue pairs are within ``threshold`` Angstrom, from structure JSONL (C-beta or C-alpha),
TAPE's ProteinNet (C-alpha) or a RaptorX-style contact set (C-beta); a linear (TAPE's) or 2-D ResNet head on pair
features (M, or M+ for an encoder with a pair head); binary cross-entropy over the pairs at least
``data.min_separation`` apart; precision of the top L/k pairs by separation range (``pmlm.evaluation.metrics``).

A residue with an unresolved atom takes part in no scored pair. A pair that no window of a long protein held has
no score and is no candidate (``pmlm.finetune.head_scoring``).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from pmlm import alphabet
from pmlm.errors import ConfigError
from pmlm.evaluation.metrics import CONTACT_RANGES, TOP_K_DIVISORS, contact_metrics
from pmlm.model.task_heads import ContactLinearHead, ContactResNetHead, HeadKind, set_contact_prior
from pmlm.tasks.raptorx import read_contact_set
from pmlm.tasks.structures import CONTACT_ATOMS, read_structure_jsonl
from pmlm.tasks.tape import PROTEINNET, read_tape
from pmlm.tasks.task import PAIR, RAPTORX, STRUCTURE_JSONL, TAPE, Example, ReadOptions, Task
from pmlm.vocabulary import TASK_CONTACT

PRIOR_PROTEINS = 256  # training proteins whose contact rate initialises a contact head's output bias
# the atom each format defines contacts by (structure JSONL holds both; auto takes C-beta)
FORMAT_ATOMS = {
    STRUCTURE_JSONL: CONTACT_ATOMS["structure_jsonl"],
    TAPE: CONTACT_ATOMS["tape_proteinnet"],
    RAPTORX: CONTACT_ATOMS["raptorx"],
}
# metric-name label -> range name in pmlm.evaluation.metrics.CONTACT_RANGES
RANGE_LABELS = {
    "short": "short",
    "medium": "medium",
    "long": "long",
    "medium_long": "medium_long",
    "tape_s6": "tape_all",
}


def far_pairs(length: int, min_separation: int, device) -> torch.Tensor:
    """(L, L) bool, the upper triangle's pairs with j - i >= min_separation."""
    idx = torch.arange(length, device=device)
    return (idx[None, :] - idx[:, None]) >= min_separation


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


def contact_summary(proteins) -> dict[str, tuple[float, int]]:
    """(scores, contacts, valid) per protein -> {metric: (value, n_proteins)} for every range x L/k,
    per-protein means and ``_pooled`` variants."""
    ranges = {label: CONTACT_RANGES[name] for label, name in RANGE_LABELS.items()}
    result = contact_metrics(proteins, ranges=ranges)
    out: dict[str, tuple[float, int]] = {}
    for label in ranges:
        for div in TOP_K_DIVISORS:
            s = result[label][div]
            out[f"P@{div}_{label}"] = (s.mean, s.n_proteins)
            out[f"P@{div}_{label}_pooled"] = (s.pooled, s.n_proteins)
    return out


def contact_items(proteins, threshold: float):
    """(scores, contacts, valid) per (protein, scores) for ``contact_summary``: scores (n, n) over residues
    [0, n); pairs without a score (no window held them) are no candidates."""
    for protein, scores in proteins:
        n = scores.shape[0]
        contacts, valid = protein.contact_window(0, n, threshold)  # (n, n) each
        held = ~np.isnan(scores)
        yield np.where(held, scores, 0.0), contacts, valid & held


class ContactTask(Task):
    name = TASK_CONTACT
    kind = "contact map"
    heads = (HeadKind.LINEAR, HeadKind.RESNET)
    formats = (STRUCTURE_JSONL, TAPE, RAPTORX)
    headline = "P@L/5_medium_long"
    metric_names = tuple(
        f"P@{div}_{label}{pooled}" for label in RANGE_LABELS for div in TOP_K_DIVISORS for pooled in ("", "_pooled")
    )
    level = PAIR
    reads_pairs = True
    num_classes = 1

    def contact_atom(self, path, fmt: str) -> str:
        """The format's atom (auto) or the requested one where the format holds it."""
        requested = self.settings.contact_atom
        atom = FORMAT_ATOMS[fmt] if requested == "auto" else requested
        if fmt != STRUCTURE_JSONL and atom != FORMAT_ATOMS[fmt]:
            raise ConfigError(
                f"{path}: {fmt} data defines contacts by {FORMAT_ATOMS[fmt]} only; "
                f"data.contact_atom {requested} cannot apply (use auto)"
            )
        return atom

    def read(self, path, options: ReadOptions, counts):
        if options.fmt == STRUCTURE_JSONL:
            atom = self.contact_atom(path, options.fmt)
            for rec in read_structure_jsonl(path, on_error=options.on_error, counts=counts):
                yield Example(rec.name, alphabet.encode(rec.seq), coords=rec.coords(atom))
        elif options.fmt == TAPE:
            for rec in read_tape(path, PROTEINNET, on_error=options.on_error, counts=counts):
                yield Example(rec.id, alphabet.encode(rec.primary), coords=rec.tertiary)
        else:
            threshold = self.settings.contact_threshold
            for rec in read_contact_set(path, threshold=threshold, on_error=options.on_error, counts=counts):
                yield Example(rec.id, alphabet.encode(rec.seq), contacts=rec.contacts, valid=rec.valid)

    def build_head(self, cfg, hidden: int):
        h = cfg.head
        build = {
            HeadKind.LINEAR: lambda: ContactLinearHead(hidden, h.dropout, h.pair_chunk_elements),
            HeadKind.RESNET: lambda: ContactResNetHead(
                hidden, h.dropout, h.resnet_channels, h.resnet_blocks, h.resnet_kernel, h.resnet_norm,
                h.pair_chunk_elements,
            ),
        }  # fmt: skip
        return build[h.kind]()

    def prepare_head(self, head, train) -> None:
        """Start the head at the training set's contact rate (``set_contact_prior``)."""
        s = self.settings
        rate = contact_rate(train.examples, s.contact_threshold, s.min_separation, PRIOR_PROTEINS)
        if rate is not None and 0.0 < rate < 1.0:
            set_contact_prior(head, rate)

    def targets(self, examples, windows, length):
        n, threshold = len(examples), self.settings.contact_threshold
        targets = np.zeros((n, length, length), dtype=bool)
        valid = np.zeros((n, length, length), dtype=bool)
        for b, (ex, (start, stop)) in enumerate(zip(examples, windows)):
            k = stop - start
            targets[b, :k, :k], valid[b, :k, :k] = ex.contact_window(start, stop, threshold)
        return targets, valid

    def terms(self, batch) -> int:
        """Valid pairs i < j with j - i >= ``settings.min_separation``."""
        separation = self.settings.min_separation
        return int((batch.valid & far_pairs(batch.valid.shape[-1], separation, batch.valid.device)).sum())

    def loss(self, logits, batch, head=None):
        """BCE over the valid pairs i < j with j - i >= ``settings.min_separation``."""
        scored = batch.valid & far_pairs(logits.shape[-1], self.settings.min_separation, logits.device)  # (B, L, L)
        return F.binary_cross_entropy_with_logits(
            logits.float()[scored], batch.targets[scored].float(), reduction="sum"
        )

    def output(self, logits, k: int) -> np.ndarray:
        return logits[:k, :k].numpy()  # (k, k)

    def metrics(self, proteins):
        return contact_summary(contact_items(proteins, self.settings.contact_threshold))


CONTACT = ContactTask()
