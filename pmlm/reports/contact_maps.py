"""Predicted-vs-true contact maps of a few test chains, for the workflow report: a fine-tuned contact head
(its probabilities) or the pair head's unsupervised read-out (KL / MI + APC, as ``pmlm evaluate`` scores it).

The chains are the first ``chains`` records of the test file that fit the encoder's window (file order, so the
same chains appear for every model). Upper triangle: the prediction; lower triangle: the true contacts; the title
gives P@L at s >= 6 with the metric's own definition.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from pmlm.errors import ConfigError, InputError
from pmlm.evaluation.metrics import CONTACT_RANGES, contact_precision
from pmlm.evaluation.pair_readout import unsupervised_contact_scores
from pmlm.figures import FORMATS, draw_contact_map, pyplot, save_figure
from pmlm.finetune.data import evaluation_plan
from pmlm.finetune.head_scoring import PAIR_HEADS
from pmlm.outputs import prefix_targets
from pmlm.pretrained import load_encoder, load_head
from pmlm.reports.staging import staged, staged_outputs
from pmlm.tasks.contact_task import CONTACT
from pmlm.tasks.registry import read_task_data
from pmlm.tokens import max_residues
from pmlm.vocabulary import TASK_CONTACT

# records read from the test file to find ``chains`` that fit the window (reading a whole test set is not needed)
READ_LIMIT_PER_CHAIN = 20


def predicted_maps(
    head: str, encoder: str | None, test: str | Path, chains: int
) -> list[tuple[str, np.ndarray, np.ndarray, np.ndarray, bool]]:
    """[(chain id, scores (L, L), contacts (L, L) bool, valid (L, L) bool, scores are probabilities)]."""
    if chains < 1:
        raise ConfigError(f"--chains must be >= 1, got {chains}")
    unsupervised = head in PAIR_HEADS
    if unsupervised:
        if not encoder:
            raise ConfigError(f"--head {head} reads the encoder's pair head: pass --encoder")
        model, info, _ = load_encoder(encoder)
        if model.pair_head is None:
            raise ConfigError(
                f"{encoder}: the model has no pair head (objective {info['objective']['name']}); "
                f"--head {head} needs a PMLM model"
            )
        task, window = CONTACT, max_residues(model.cfg.max_len)
    else:
        if not Path(head).is_file():
            raise InputError(head, f"no such head file (or use one of {', '.join(PAIR_HEADS)})")
        model, cfg, *_ = load_head(head, encoder=encoder)
        if cfg.task != TASK_CONTACT:
            raise ConfigError(f"{head}: a {cfg.task} head has no contact map")
        task = cfg.configured_task()
        window = max_residues(model.encoder.cfg.max_len)
    data = read_task_data(test, task, limit=chains * READ_LIMIT_PER_CHAIN)
    chosen = [ex for ex in data.examples if len(ex) <= window][:chains]
    if not chosen:
        raise InputError(
            test, f"no test chain of at most {window} residues among the first {len(data.examples)} records"
        )
    plan = evaluation_plan(chosen, 1, window, "skip")  # every chosen chain fits one window
    out = []
    with torch.no_grad():
        for rows in plan.batches:
            batch = plan.collate(rows, task)
            k = batch.lengths[0]
            if unsupervised:
                scores = unsupervised_contact_scores(model, batch.tokens[0, 1 : k + 1].numpy(), PAIR_HEADS[head])
            else:
                scores = torch.sigmoid(model(batch.tokens, batch.mask)[0, :k, :k].float()).double().numpy()
            out.append(
                (
                    batch.ids[0],
                    scores,
                    batch.targets[0, :k, :k].numpy(),
                    batch.valid[0, :k, :k].numpy(),
                    not unsupervised,
                )
            )
    order = {ex.id: n for n, ex in enumerate(chosen)}  # back to file order (batches come by length)
    return sorted(out, key=lambda item: order[item[0]])


def plot(maps, title: str, prefix: str | Path) -> list[Path]:
    plt = pyplot()
    fig, axes = plt.subplots(1, len(maps), figsize=(3.9 * len(maps), 4.3), squeeze=False)
    min_sep = CONTACT_RANGES["tape_all"][0]
    for ax, (chain, scores, contacts, valid, probabilities) in zip(axes[0], maps):
        kind = "P(contact)" if probabilities else "score"
        draw_contact_map(ax, scores, contacts, valid, min_sep=min_sep, label=kind)
        upper = np.triu(np.ones(scores.shape, dtype=bool), k=1)
        precision = contact_precision(scores, contacts, valid, min_sep=min_sep, k_divisor=1)
        ax.set_title(
            f"{chain}  L={scores.shape[0]}  P@L (s >= {min_sep}) = {precision:.2f}\n"
            f"upper: {kind} (max {float(scores[upper].max()):.2g}) and top-L pairs; lower: true",
            fontsize=8,
        )
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return save_figure(fig, prefix)


def write_contact_maps(
    head: str,
    encoder: str | None,
    test: str | Path,
    chains: int,
    label: str,
    prefix: str | Path,
    *,
    overwrite: bool = False,
) -> list[Path]:
    """PREFIX.png and .svg (prefix targets, checked before the model loads; pmlm.outputs)."""
    targets = prefix_targets(prefix, FORMATS, overwrite=overwrite)
    maps = predicted_maps(head, encoder, test, chains)
    kind = f"pair-head read-out {head}" if head in PAIR_HEADS else "fine-tuned head, P(contact)"
    with staged_outputs(targets) as folder:
        plot(maps, f"{label}: {kind}", staged(folder, prefix))
    return targets
