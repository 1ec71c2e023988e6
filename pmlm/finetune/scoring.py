"""Scores of a fine-tuned task model on a test set, and the head artefact loaded back into a TaskModel.

Shared by the fine-tuning loop (validation) and ``pmlm evaluate`` (test sets).
"""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path

import numpy as np
import torch

from pmlm.artefacts import head_encoder_path, read_head
from pmlm.errors import InputError
from pmlm.evaluation.metrics import CONTACT_RANGES, TOP_K_DIVISORS, contact_metrics, q3_accuracy, top1_accuracy
from pmlm.evaluation.pretrained import load_pretrained
from pmlm.finetune.config import FinetuneConfig
from pmlm.finetune.data import evaluation_batches
from pmlm.finetune.heads import TaskModel, build_head

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


def score_task(model, data, *, batch_size: int, window: int, too_long: str, threshold: float, device,
               autocast=nullcontext, progress=None) -> tuple[dict[str, tuple[float, int]], int]:
    """Metrics of a TaskModel on one test set: ({metric: (value, n_proteins)}, proteins too long).
    ``progress`` (a pmlm.progress.Progress) counts the proteins scored."""
    batches, n_long = evaluation_batches(data.examples, data.task, batch_size, window, too_long, threshold)
    was_training = model.training
    model.eval()

    def predictions():
        with torch.no_grad():
            for batch in batches:
                batch = batch.to(device)
                with autocast():
                    logits = model(batch.tokens, batch.mask)
                if progress is not None:
                    progress.advance(len(batch.lengths))
                yield batch, logits.float().cpu()

    try:
        if data.task == "contact":
            def proteins():
                for batch, logits in predictions():
                    for b, k in enumerate(batch.lengths):
                        yield (logits[b, :k, :k].double().numpy(), batch.targets[b, :k, :k].cpu().numpy(),
                               batch.valid[b, :k, :k].cpu().numpy())

            return contact_summary(proteins()), n_long
        preds, targets = [], []
        for batch, logits in predictions():
            if data.task == "ss3":
                for b, k in enumerate(batch.lengths):
                    preds.append(logits[b, :k].argmax(-1).numpy())
                    targets.append(batch.targets[b, :k].cpu().numpy())
            else:
                preds.append(logits.argmax(-1).numpy())
                targets.append(batch.targets.cpu().numpy())
        if data.task == "ss3":
            acc = q3_accuracy(preds, targets)
            metrics = {"Q3": (acc.pooled, acc.n_proteins), "Q3_per_protein": (acc.per_protein_mean, acc.n_proteins)}
            return metrics, n_long
        pred, labels = np.concatenate(preds), np.concatenate(targets)
        return {"top1": (top1_accuracy(pred, labels), int(labels.size))}, n_long
    finally:
        model.train(was_training)


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
