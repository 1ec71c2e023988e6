"""Scores of a fine-tuned task model on a test set, and the head artefact loaded back into a TaskModel.

Shared by the fine-tuning loop (validation) and ``pmlm evaluate`` (test sets).

A test protein longer than the encoder's window is scored at its true length by default
(``too_long="windows"``, see ``pmlm.finetune.data.evaluation_plan``): the model reads overlapping
windows, and each residue's logits (ss3), each pair's contact logit (contact) or the protein's
logits (remote homology) are the mean over the windows that hold it (``pmlm.tokens.WindowMean``).
Contact precision then takes k = floor(L / divisor) with L the protein's length. A pair that no
window holds (residues farther apart than about half a window) has no score and is no candidate: it
ranks after every scored pair, and when fewer than k scored candidates exist the picks it would fill
count as misses (``pmlm.evaluation.metrics``, rule 3), whether or not it is a contact.
"""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path

from collections.abc import Iterable, Iterator

import numpy as np
import torch

from pmlm.artefacts import head_encoder_path, read_head
from pmlm.errors import InputError
from pmlm.evaluation.metrics import CONTACT_RANGES, TOP_K_DIVISORS, contact_metrics, q3_accuracy, top1_accuracy
from pmlm.evaluation.pretrained import load_pretrained
from pmlm.finetune.config import FinetuneConfig
from pmlm.finetune.data import EvaluationPlan, Example, evaluation_plan
from pmlm.finetune.heads import TaskModel, build_head
from pmlm.tokens import WindowMean

# metric-name label -> range name in pmlm.evaluation.metrics.CONTACT_RANGES
RANGE_LABELS = {"short": "short", "medium": "medium", "long": "long", "medium_long": "medium_long",
                "tape_s6": "tape_all"}
HEADLINE = {"contact": "P@L/5_medium_long", "ss3": "Q3", "remote_homology": "top1"}


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


def whole_proteins(plan: EvaluationPlan, row_outputs: Iterable[tuple[tuple[int, int, int], np.ndarray]],
                   pairs: bool) -> Iterator[tuple[Example, np.ndarray]]:
    """(protein, output over its residues [0, n)) per protein of ``plan``, from the outputs of its rows in plan
    order: ``(n, ...)`` per residue or, with ``pairs``, ``(n, n, ...)`` per pair; a protein read as several
    windows gets their mean (NaN where no window holds a pair) and n = its length, else n = its row's length."""
    pending: dict[int, tuple[WindowMean, list[int]]] = {}
    for (p, start, stop), out in row_outputs:
        if plan.windows[p] == 1:
            yield plan.proteins[p], out
            continue
        length = len(plan.proteins[p])
        trailing = out.shape[2:] if pairs else out.shape[1:]
        acc, seen = pending.setdefault(p, (WindowMean(length, tuple(trailing), pairs=pairs), [0]))
        acc.add(start, out)
        seen[0] += 1
        if seen[0] == plan.windows[p]:
            del pending[p]
            yield plan.proteins[p], acc.mean()


def score_task(model, data, *, batch_size: int, window: int, too_long: str, threshold: float, device,
               autocast=nullcontext, progress=None) -> tuple[dict[str, tuple[float, int]], int]:
    """Metrics of a TaskModel on one test set: ({metric: (value, n_proteins)}, proteins too long).
    ``progress`` (a pmlm.progress.Progress) counts the proteins scored."""
    plan = evaluation_plan(data.examples, batch_size, window, too_long)
    task = data.task
    was_training = model.training
    model.eval()

    def row_outputs():
        with torch.no_grad():
            for rows in plan.batches:
                batch = plan.collate(rows, task, threshold).to(device)
                with autocast():
                    logits = model(batch.tokens, batch.mask).float().cpu().double()
                for b, row in enumerate(rows):
                    k = batch.lengths[b]
                    if task == "contact":
                        yield row, logits[b, :k, :k].numpy()  # (k, k)
                    elif task == "ss3":
                        yield row, logits[b, :k].numpy()  # (k, 3)
                    else:
                        yield row, logits[b, None].numpy()  # (1, classes): one "residue" per window, averaged

    def proteins():
        for protein, out in whole_proteins(plan, row_outputs(), pairs=task == "contact"):
            if progress is not None:
                progress.advance()
            yield protein, out

    try:
        if task == "contact":
            return contact_summary(contact_items(proteins(), threshold)), plan.n_long
        preds, targets = [], []
        for protein, out in proteins():
            if task == "ss3":
                preds.append(out.argmax(-1))
                targets.append(protein.labels[:out.shape[0]])
            else:
                preds.append(out[0].argmax(-1, keepdims=True))
                targets.append(np.array([protein.label]))
        if task == "ss3":
            acc = q3_accuracy(preds, targets)
            metrics = {"Q3": (acc.pooled, acc.n_proteins), "Q3_per_protein": (acc.per_protein_mean, acc.n_proteins)}
            return metrics, plan.n_long
        pred, labels = np.concatenate(preds), np.concatenate(targets)
        return {"top1": (top1_accuracy(pred, labels), int(labels.size))}, plan.n_long
    finally:
        model.train(was_training)


def contact_items(proteins: Iterable[tuple[Example, np.ndarray]], threshold: float):
    """(scores, contacts, valid) per protein for ``contact_summary``: scores (n, n) over residues [0, n); pairs
    without a score (no window held them) are no candidates (module docstring)."""
    for protein, scores in proteins:
        n = scores.shape[0]
        contacts, valid = protein.contact_window(0, n, threshold)  # (n, n) each
        held = ~np.isnan(scores)
        yield np.where(held, scores, 0.0), contacts, valid & held


def load_finetuned(head_path: str | Path, encoder_path: str | Path | None = None, device="cpu"):
    """Rebuild a TaskModel from a head artefact: (model, FinetuneConfig, info, encoder path).

    The encoder defaults to the one recorded at fine-tuning time; its sha256 must match.
    """
    info, state = read_head(head_path)
    cfg = FinetuneConfig.from_dict(info["config"])
    encoder_path = head_encoder_path(head_path, info, encoder_path)
    encoder, _ = load_pretrained(encoder_path)
    model = TaskModel(encoder, build_head(cfg, encoder.cfg.hidden), cfg.task, cfg.head.features, cfg.freeze_encoder)
    try:
        model.trainable().load_state_dict(state)
    except RuntimeError as exc:
        first = str(exc).splitlines()[0]
        raise InputError(head_path, f"weights do not match the head in the sidecar: {first}") from None
    return model.to(device).eval(), cfg, info, encoder_path
