"""``pmlm evaluate``: score a fine-tuned head, or the pair head's unsupervised contacts, on test sets, written
as one long-format TSV per (model, task, head).

Unsupervised read-out (``--head pair-kl`` / ``pair-mi``, contact task only): for each protein,
ONE forward pass of the unmasked sequence gives the pair head's joint P(x_i, x_j) for every
pair i < j (and, mirrored, j > i). Nothing is masked by default because that costs one pass
per protein instead of one per pair, and the pair head still has to express through the joint
how strongly two positions depend on each other. The score is KL(P(x_i) P(x_j) || P(x_i, x_j))
(``pair-kl``; marginals from the token head when the model has one, else from the joint) or
the joint's mutual information (``pair-mi``), symmetrised, with the diagonal zeroed and
average-product correction. ``--mask-pairs`` instead masks exactly i and j for each pair, as
in pre-training: L(L-1)/2 sequence copies per protein, affordable for small proteins only.

Proteins longer than the encoder's window (max_len - 2 residues) are read as overlapping windows
and scored at their true length (``--too-long windows``, the default; see
``pmlm.finetune.scoring``; for ``pair-kl`` / ``pair-mi`` each window's APC-corrected scores are
averaged), cropped to their first ``window`` residues and scored with L = window (``crop``), or
left out (``skip``); either way their number is reported as the metric ``n_too_long``.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import sys
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import torch

from pmlm.errors import ConfigError, InputError
from pmlm.evaluation.pair_readout import all_pairs, pair_dependence
from pmlm.evaluation.pretrained import load_pretrained
from pmlm.evaluation.unsupervised import apc, symmetrize
from pmlm.finetune.data import evaluation_plan, read_task_data
from pmlm.finetune.scoring import HEADLINE, contact_items, contact_summary, load_finetuned, score_task, whole_proteins
from pmlm.progress import Progress
from pmlm.tasks.structures import CONTACT_THRESHOLD
from pmlm.utils import atomic_output, file_digest, versions

PAIR_HEADS = {"pair-kl": "kl", "pair-mi": "mi"}
TSV_COLUMNS = ("model", "task", "head", "features", "test_set", "metric", "value", "n_proteins",
               "config_sha256", "encoder_sha256", "pmlm_version", "torch_version", "git_commit")
PAIR_FEATURES = "pair_joint"  # the features column of unsupervised rows


def canonical_sha256(obj) -> str:
    """sha256 of a JSON value with sorted keys: identical settings give identical digests."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def unsupervised_contact_scores(model, residues: np.ndarray, measure: str, *, mask_pairs: bool = False,
                                pair_batch: int = 4096, device="cpu") -> np.ndarray:
    """(L, L) contact scores from the pair head's joints (see the module docstring): both orders of
    every pair i < j, symmetrised, then APC (which zeroes the diagonal)."""
    length = int(residues.size)
    pairs = all_pairs(length)  # (P, 2) rows (i, j), i < j
    values = pair_dependence(model, residues, pairs, mask_pairs=mask_pairs, mirror=True, batch_pairs=pair_batch,
                             device=device)[measure].double()  # (2P,): the (i, j) orders, then (j, i)
    scores = torch.zeros(length, length, dtype=torch.float64)
    i, j = torch.from_numpy(pairs[:, 0]), torch.from_numpy(pairs[:, 1])
    scores[i, j] = values[:len(pairs)]
    scores[j, i] = values[len(pairs):]
    return apc(symmetrize(scores)).numpy()


def score_unsupervised(model, data, measure: str, *, window: int, too_long: str, threshold: float,
                       mask_pairs: bool, pair_batch: int, device,
                       progress=None) -> tuple[dict[str, tuple[float, int]], int]:
    """Contact metrics of the unsupervised read-out on one test set."""
    plan = evaluation_plan(data.examples, 1, window, too_long)

    def row_scores():
        for (p, start, stop), in plan.batches:
            residues = plan.proteins[p].residues[start:stop]
            yield (p, start, stop), unsupervised_contact_scores(model, residues, measure, mask_pairs=mask_pairs,
                                                                 pair_batch=pair_batch, device=device)

    def proteins():
        for protein, scores in whole_proteins(plan, row_scores(), pairs=True):
            if progress is not None:
                progress.advance()
            yield protein, scores

    return contact_summary(contact_items(proteins(), threshold)), plan.n_long


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


def run(args: argparse.Namespace) -> int:
    tests = {}
    for item in args.test:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise ConfigError(f"--test expects NAME=PATH, got {item!r}")
        if name in tests:
            raise ConfigError(f"--test {name} given twice")
        tests[name] = path
    for name, value in (("--batch-size", args.batch_size), ("--pair-batch", args.pair_batch)):
        if value < 1:
            raise ConfigError(f"{name} must be >= 1, got {value}")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda was requested but no CUDA device is visible")
    device = torch.device("cuda" if args.device != "cpu" and torch.cuda.is_available() else "cpu")
    autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if device.type == "cuda" else nullcontext

    unsupervised = args.head in PAIR_HEADS
    if unsupervised:
        if not args.encoder:
            raise ConfigError(f"--head {args.head} reads the encoder's pair head: pass --encoder")
        model, info = load_pretrained(args.encoder, device)
        if model.pair_head is None:
            raise ConfigError(f"{args.encoder}: the model has no pair head (objective {info['objective']['name']}); "
                              f"--head {args.head} needs a PMLM model")
        encoder_path = Path(args.encoder)
        task, head_name, features = "contact", args.head, PAIR_FEATURES
        atom, threshold = args.contact_atom or "auto", args.contact_threshold or CONTACT_THRESHOLD
        settings = {"head": args.head, "mask_pairs": args.mask_pairs, "apc": True, "contact_atom": atom,
                    "contact_threshold": threshold}
        window = model.cfg.max_len - 2
    else:
        if not Path(args.head).is_file():
            raise InputError(args.head, f"no such head file (or use one of {', '.join(PAIR_HEADS)})")
        model, cfg, info, encoder_path = load_finetuned(args.head, args.encoder, device)
        task, head_name, features = cfg.task, cfg.head.kind, cfg.head.features
        atom = args.contact_atom or cfg.data.contact_atom
        threshold = args.contact_threshold or cfg.data.contact_threshold
        settings = info["config"]  # the head's own config, plus any contact definition changed here
        if (atom, threshold) != (cfg.data.contact_atom, cfg.data.contact_threshold):
            settings = {**settings, "evaluation": {"contact_atom": atom, "contact_threshold": threshold}}
        window = model.encoder.cfg.max_len - 2
    if threshold <= 0:
        raise ConfigError(f"--contact-threshold must be > 0 (Angstrom), got {threshold}")
    label = args.model or encoder_path.parent.name or encoder_path.stem
    v = versions()
    common = {"model": label, "task": task, "head": head_name, "features": features,
              "config_sha256": canonical_sha256(settings), "encoder_sha256": file_digest(encoder_path),
              "pmlm_version": v["pmlm"], "torch_version": v["torch"], "git_commit": v["git_commit"] or ""}

    rows = []
    for name, path in tests.items():
        data = read_task_data(path, task, fmt=args.format, contact_atom=atom, threshold=threshold,
                              num_classes=None if unsupervised else cfg.num_classes)
        with Progress(f"pmlm evaluate {name}", len(data.examples), unit="proteins") as progress:
            if unsupervised:
                metrics, n_long = score_unsupervised(
                    model, data, PAIR_HEADS[args.head], window=window, too_long=args.too_long, threshold=threshold,
                    mask_pairs=args.mask_pairs, pair_batch=args.pair_batch, device=device, progress=progress)
            else:
                metrics, n_long = score_task(
                    model, data, batch_size=args.batch_size, window=window, too_long=args.too_long,
                    threshold=threshold, device=device, autocast=autocast, progress=progress)
        metrics["n_too_long"] = (n_long, len(data.examples))
        for metric, (value, n) in metrics.items():
            rows.append({**common, "test_set": name, "metric": metric, "value": value, "n_proteins": n})
        headline, _ = metrics[HEADLINE[task]]
        atom_note = f", contacts by {data.contact_atom}" if data.contact_atom else ""
        print(f"pmlm evaluate: {label} {head_name} on {name}: {len(data.examples)} proteins "
              f"({n_long} longer than {window}, {args.too_long}{atom_note}), {HEADLINE[task]} {headline:.4f}",
              file=sys.stderr)
    write_tsv(args.out, rows)
    return 0
