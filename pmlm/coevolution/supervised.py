"""Supervised contact prediction on planted families, the protocol of the paper's claim: a linear contact
head (TAPE's, ``pmlm.model.task_heads.ContactLinearHead``) on pair features of a frozen encoder, fitted on
the planted contacts of some families and scored on held-out families it never saw.

Features, as in fine-tuning (``pmlm.model.task_heads``): ``M`` = concat(h_i * h_j, h_i - h_j) of the encoder
outputs h (MLM and PMLM), ``M+`` = the PMLM pair head's first block on them (``PairHead.first_block_grid``).
Each sequence is one training example with the family's planted map as its label, as each protein is in
TAPE's contact task; the score of a family is its precision averaged over its evaluation sequences.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from pmlm.coevolution.curves_config import CurveEvaluation
from pmlm.coevolution.heldout import FamilyData
from pmlm.coevolution.readouts import model_device, sequence_tokens
from pmlm.model.task_heads import ContactLinearHead, TaskModel, set_contact_prior
from pmlm.vocabulary import TASK_CONTACT

PAIR_CHUNK_ELEMENTS = 1 << 26  # one chunk at the study's sizes: no activation checkpointing


def family_folds(names: list[str], seed: int) -> list[list[str]]:
    """Families in two halves by a seeded shuffle; fewer than two families gives no folds."""
    if len(names) < 2:
        return []
    order = np.random.default_rng(seed).permutation(sorted(names)).tolist()
    half = len(order) // 2
    return [sorted(order[:half]), sorted(order[half:])]


def _batch(family: FamilyData, cfg: CurveEvaluation, min_separation: int, device: torch.device):
    """Tokens (n, L + 2), residue mask (n, L), labels (n, L, L), the scored-pair mask (L, L) and the
    sequence ids of one family's evaluation sequences."""
    rows, ids = family.evaluation_rows(cfg)
    tokens = sequence_tokens(rows).to(device)
    n, length = rows.shape
    mask = torch.ones(n, length, dtype=torch.bool, device=device)
    labels = torch.from_numpy(family.contacts).float().to(device).expand(n, length, length)
    scored = torch.ones(length, length, dtype=torch.bool, device=device).triu(min_separation)  # one triangle
    return tokens, mask, labels, scored, ids


def fit_contact_head(encoder, features: str, train: list[FamilyData], cfg: CurveEvaluation, seed: int) -> TaskModel:
    """A linear contact head on a frozen encoder, fitted by full-batch Adam on the families ``train``.

    Loss: binary cross-entropy over pairs |i-j| >= min_separation of every evaluation sequence, each
    family weighted by its number of sequences. The output bias starts at the planted base rate.
    """
    torch.manual_seed(seed)
    device = model_device(encoder)
    head = ContactLinearHead(encoder.cfg.hidden, cfg.head_dropout, PAIR_CHUNK_ELEMENTS).to(device)
    model = TaskModel(encoder, head, TASK_CONTACT, features, freeze_encoder=True)
    batches = [_batch(f, cfg, cfg.min_separation, device) for f in train]
    positives = sum(float(labels[:, scored].sum()) for _, _, labels, scored, _ in batches)
    total = sum(labels.shape[0] * int(scored.sum()) for _, _, labels, scored, _ in batches)
    set_contact_prior(head, min(max(positives / max(total, 1), 1e-4), 1 - 1e-4))
    optimizer = torch.optim.Adam(head.parameters(), lr=cfg.head_lr)
    model.train()
    with torch.enable_grad():
        for _ in range(cfg.head_steps):
            optimizer.zero_grad()
            loss = torch.zeros((), device=device)
            for tokens, mask, labels, scored, _ in batches:
                logits = model(tokens, mask)  # (n, L, L)
                part = F.binary_cross_entropy_with_logits(logits[:, scored], labels[:, scored], reduction="sum")
                loss = loss + part / total
            loss.backward()
            optimizer.step()
    return model.eval()


@torch.no_grad()
def family_scores(model: TaskModel, family: FamilyData, cfg: CurveEvaluation) -> tuple[np.ndarray, list[str]]:
    """The head's contact scores on each evaluation sequence of ``family``, (n, L, L), and their ids."""
    tokens, mask, _, _, ids = _batch(family, cfg, cfg.min_separation, model_device(model.encoder))
    parts = [
        model(tokens[start : start + cfg.batch_rows], mask[start : start + cfg.batch_rows]).double().cpu().numpy()
        for start in range(0, len(tokens), cfg.batch_rows)
    ]
    return np.concatenate(parts), ids


def fold_heads(models: dict, families: list[FamilyData], cfg, seed: int, heads):
    """The paper's protocol: per fold, a head per (read-out, model,
    features) of ``heads`` fitted on the fold's families; yields (read-out, model, head, the other fold's families).
    ``cfg``: the read-out settings (sequences, min_separation, head_steps, head_lr, head_dropout, batch_rows). The
    head of each (read-out, fold) starts from the same seed for every encoder, so heads differ only in features."""
    by_name = {f.name: f for f in families}
    folds = family_folds(list(by_name), seed)
    for k, (fit_on, score_on) in enumerate(((folds[0], folds[1]), (folds[1], folds[0])) if folds else ()):
        for readout, name, features in heads:
            head = fit_contact_head(models[name], features, [by_name[f] for f in fit_on], cfg, seed=seed * 1000 + k)
            yield readout, name, head, [by_name[f] for f in score_on]
