"""Scoring on test sets: a fine-tuned head (``score_task``, also the fine-tuning loop's validation) or the pair
head's unsupervised contacts (``score_unsupervised``), and ``evaluate``, the engine of ``pmlm evaluate``, which
writes one long-format TSV per (model, task, head) over all its test sets.

A test protein longer than the encoder's window is read as ``too_long`` says (``pmlm.finetune.data.evaluation_plan``;
their number is the metric ``n_too_long``): by default at its true length, each residue's, pair's or the protein's
output the mean over the windows that hold it (``pmlm.tokens.WindowMean``; for ``pair-kl`` / ``pair-mi`` each
window's APC-corrected scores). Contact precision takes k = floor(L / divisor), L the protein's length; a pair that
no window holds (residues farther apart than about half a window) has no score and is no candidate, so the picks it
would fill count as misses (``pmlm.evaluation.metrics``, rule 3).

Unsupervised read-out (``pair-kl`` / ``pair-mi``, contact task only): for each protein, ONE forward pass
of the unmasked sequence gives the pair head's joint P(x_i, x_j) for every pair i < j (and, mirrored,
j > i). Nothing is masked by default because that costs one pass per protein instead of one per pair,
and the pair head still has to express through the joint how strongly two positions depend on each
other. The score is KL(P(x_i) P(x_j) || P(x_i, x_j)) (``pair-kl``; marginals from the token head when
the model has one, else from the joint) or the joint's mutual information (``pair-mi``), symmetrised,
with the diagonal zeroed and average-product correction (``unsupervised_contact_scores``).
``mask_pairs`` instead masks exactly i and j for each pair, as in pre-training: L(L-1)/2 sequence
copies per protein, affordable for small proteins only.

Precision: the forward passes run in the precision the head's run recorded (the encoder's for a read-out), fp32
when none is recorded, unless ``precision`` says otherwise; bf16 only on CUDA
(``pmlm.train.runtime.evaluation_precision``). Every row of the TSV says which in its ``precision`` column.
"""

from __future__ import annotations

import csv
import sys
from collections.abc import Iterable, Iterator
from contextlib import nullcontext
from functools import partial
from pathlib import Path

import numpy as np
import torch

from pmlm.artefacts import recorded_precision
from pmlm.errors import ConfigError, InputError
from pmlm.evaluation.pair_readout import unsupervised_contact_scores
from pmlm.files import atomic_output, canonical_sha256, file_digest
from pmlm.finetune.data import EvaluationPlan, evaluation_plan
from pmlm.pretrained import load_encoder, load_head, pick_device
from pmlm.progress import Progress
from pmlm.tasks.contact_task import CONTACT
from pmlm.tasks.registry import read_task_data
from pmlm.tasks.structures import CONTACT_THRESHOLD
from pmlm.tasks.task import PAIR, PROTEIN, Example, ReadOptions, TaskSettings
from pmlm.tokens import WindowMean, max_residues
from pmlm.train.runtime import autocast, evaluation_precision
from pmlm.version import versions
from pmlm.vocabulary import FEATURES_PAIR_JOINT

PAIR_HEADS = {"pair-kl": "kl", "pair-mi": "mi"}
TSV_COLUMNS = (
    "model",
    "task",
    "head",
    "features",
    "test_set",
    "metric",
    "value",
    "n_proteins",
    "precision",
    "config_sha256",
    "encoder_sha256",
    "pmlm_version",
    "torch_version",
    "git_commit",
)


def whole_proteins(
    plan: EvaluationPlan, row_outputs: Iterable[tuple[tuple[int, int, int], np.ndarray]], level: str, progress=None
) -> Iterator[tuple[Example, np.ndarray]]:
    """(protein, output over the protein) per protein of ``plan``, from the outputs of its rows in plan order:
    ``(n, ...)`` per residue, ``(n, n, ...)`` per pair, or ``(1, ...)`` for the whole protein (``level``); a
    protein read as several windows gets their mean (per pair: NaN where no window holds a pair) and n = its
    length, else n = its row's length. ``progress`` (a pmlm.progress.Progress) counts the proteins."""
    pending: dict[int, tuple[WindowMean, list[int]]] = {}
    pairs = level == PAIR
    for (p, start, _stop), out in row_outputs:
        if plan.windows[p] > 1:
            length = 1 if level == PROTEIN else len(plan.proteins[p])
            trailing = out.shape[2:] if pairs else out.shape[1:]
            acc, seen = pending.setdefault(p, (WindowMean(length, tuple(trailing), pairs=pairs), [0]))
            acc.add(0 if level == PROTEIN else start, out)
            seen[0] += 1
            if seen[0] < plan.windows[p]:
                continue
            del pending[p]
            out = acc.mean()
        if progress is not None:
            progress.advance()
        yield plan.proteins[p], out


def score_task(
    model,
    data,
    *,
    batch_size: int,
    window: int,
    too_long: str,
    device,
    autocast=nullcontext,
    progress=None,
) -> tuple[dict[str, tuple[float, int]], int]:
    """Metrics of a TaskModel on one test set (its task's, as configured for the read): ({metric: (value, n)},
    proteins too long); ``progress`` as ``whole_proteins``."""
    plan = evaluation_plan(data.examples, batch_size, window, too_long)
    task = data.task
    was_training = model.training
    model.eval()

    def row_outputs():
        with torch.no_grad():
            for rows in plan.batches:
                batch = plan.collate(rows, task).to(device)
                with autocast():
                    logits = model(batch.tokens, batch.mask).float().cpu().double()
                for b, row in enumerate(rows):
                    yield row, task.output(logits[b], batch.lengths[b])

    try:
        return task.metrics(whole_proteins(plan, row_outputs(), task.level, progress)), plan.n_long
    finally:
        model.train(was_training)


def score_unsupervised(
    model,
    data,
    measure: str,
    *,
    window: int,
    too_long: str,
    mask_pairs: bool,
    pair_batch: int,
    device,
    autocast=nullcontext,
    progress=None,
) -> tuple[dict[str, tuple[float, int]], int]:
    """Contact metrics of the unsupervised read-out on one test set (read for the contact task)."""
    plan = evaluation_plan(data.examples, 1, window, too_long)

    def row_scores():
        for ((p, start, stop),) in plan.batches:
            residues = plan.proteins[p].residues[start:stop]
            with autocast():
                scores = unsupervised_contact_scores(
                    model, residues, measure, mask_pairs=mask_pairs, pair_batch=pair_batch, device=device
                )
            yield (p, start, stop), scores

    return data.task.metrics(whole_proteins(plan, row_scores(), PAIR, progress)), plan.n_long


def write_tsv(path: str | Path, rows: list[dict]) -> None:
    def cell(value):
        if isinstance(value, float):
            return repr(value)
        return "" if value is None else str(value)

    with atomic_output(path) as tmp, open(tmp, "w", newline="") as fh:
        writer = csv.writer(fh, delimiter="\t", lineterminator="\n")
        writer.writerow(TSV_COLUMNS)
        for row in rows:
            writer.writerow([cell(row[c]) for c in TSV_COLUMNS])


def evaluate(
    head: str,
    tests: dict[str, str],
    out: str | Path,
    *,
    encoder: str | None = None,
    model_label: str | None = None,
    batch_size: int = 4,
    too_long: str = "windows",
    mask_pairs: bool = False,
    pair_batch: int = 4096,
    fmt: str = "auto",
    contact_atom: str | None = None,
    contact_threshold: float | None = None,
    device: str = "auto",
    precision: str = "auto",
) -> list[dict]:
    """Score ``head`` (a fine-tuned head file, or ``pair-kl`` / ``pair-mi`` on ``encoder``) on every test set
    (label -> file) and write the rows to ``out`` (TSV_COLUMNS); returns them. ``contact_atom`` /
    ``contact_threshold`` default to the head's own (``auto`` and 8 A for a read-out); ``precision`` (``auto``,
    ``fp32``, ``bf16``) as the module docstring says."""
    for name, value in (("--batch-size", batch_size), ("--pair-batch", pair_batch)):
        if value < 1:
            raise ConfigError(f"{name} must be >= 1, got {value}")
    dev = pick_device(device)

    unsupervised = head in PAIR_HEADS
    if unsupervised:
        if not encoder:
            raise ConfigError(f"--head {head} reads the encoder's pair head: pass --encoder")
        model, info, encoder_path = load_encoder(encoder, dev)
        if model.pair_head is None:
            raise ConfigError(
                f"{encoder}: the model has no pair head (objective {info['objective']['name']}); "
                f"--head {head} needs a PMLM model"
            )
        head_name, features = head, FEATURES_PAIR_JOINT
        task = CONTACT.configure(TaskSettings(contact_atom or "auto", contact_threshold or CONTACT_THRESHOLD))
        atom, threshold = task.settings.contact_atom, task.settings.contact_threshold
        settings = {
            "head": head,
            "mask_pairs": mask_pairs,
            "apc": True,
            "contact_atom": atom,
            "contact_threshold": threshold,
        }
        window = max_residues(model.cfg.max_len)
        read = ReadOptions(fmt)
        trained, recorded = "the encoder", recorded_precision(info, encoder_path)
    else:
        if not Path(head).is_file():
            raise InputError(head, f"no such head file (or use one of {', '.join(PAIR_HEADS)})")
        model, cfg, info, head_path, encoder_path = load_head(head, dev, encoder=encoder)
        head_name, features = cfg.head.kind, cfg.head.features
        atom = contact_atom or cfg.data.contact_atom
        threshold = contact_threshold or cfg.data.contact_threshold
        task = cfg.configured_task(contact_atom=atom, contact_threshold=threshold)
        settings = info["config"]  # the head's own config, plus any contact definition changed here
        if (atom, threshold) != (cfg.data.contact_atom, cfg.data.contact_threshold):
            settings = {**settings, "evaluation": {"contact_atom": atom, "contact_threshold": threshold}}
        window = max_residues(model.encoder.cfg.max_len)
        read = cfg.read_options(fmt=fmt)
        trained, recorded = "the head", recorded_precision(info, head_path)
    if threshold <= 0:
        raise ConfigError(f"--contact-threshold must be > 0 (Angstrom), got {threshold}")
    arithmetic = evaluation_precision(dev, recorded, precision, trained=trained, command="pmlm evaluate")
    label = model_label or encoder_path.parent.name or encoder_path.stem
    v = versions()
    common = {
        "model": label,
        "task": task.name,
        "head": head_name,
        "features": features,
        "precision": arithmetic,
        "config_sha256": canonical_sha256(settings),
        "encoder_sha256": file_digest(encoder_path),
        "pmlm_version": v["pmlm"],
        "torch_version": v["torch"],
        "git_commit": v["git_commit"] or "",
    }

    shared = {"window": window, "too_long": too_long, "device": dev}
    if unsupervised:
        measure = PAIR_HEADS[head]
        score = partial(score_unsupervised, measure=measure, mask_pairs=mask_pairs, pair_batch=pair_batch, **shared)
    else:
        score = partial(score_task, batch_size=batch_size, **shared)

    rows = []
    for name, path in tests.items():
        data = read_task_data(path, task, read)
        with Progress(f"pmlm evaluate {name}", len(data.examples), unit="proteins") as progress:
            metrics, n_long = score(model, data, autocast=autocast(arithmetic, dev), progress=progress)
        metrics["n_too_long"] = (n_long, len(data.examples))
        for metric, (value, n) in metrics.items():
            rows.append({**common, "test_set": name, "metric": metric, "value": value, "n_proteins": n})
        headline, _ = metrics[task.headline]
        atom_note = f", contacts by {data.contact_atom}" if data.contact_atom else ""
        print(
            f"pmlm evaluate: {label} {head_name} on {name}: {len(data.examples)} proteins ({n_long} longer than "
            f"{window}, {too_long}{atom_note}, {arithmetic}), {task.headline} {headline:.4f}",
            file=sys.stderr,
        )
    write_tsv(out, rows)
    return rows
