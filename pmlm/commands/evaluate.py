"""``pmlm evaluate``: score a fine-tuned head, or the pair head's unsupervised contacts, on test sets."""

from __future__ import annotations

import argparse

from pmlm.commands import add_device, add_precision, labelled_paths
from pmlm.outputs import FILE_OVERWRITE_HELP
from pmlm.tasks.task import FORMATS  # the formats the task types declare (light: numpy only), so the choices follow


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.epilog = (
        "Writes one TSV (long format: one metric per row) for this model, task and head over all --test sets. "
        "Contact metrics: P@{L,L/2,L/5}_{short,medium,long,medium_long,tape_s6}, per-protein means, "
        "plus _pooled variants; ss3: Q3 (pooled over residues, as TAPE) and Q3_per_protein; "
        "remote homology: top1. Every row says in its precision column which arithmetic (fp32, bf16) scored it."
    )
    p.add_argument(
        "--head",
        required=True,
        metavar="HEAD.safetensors|pair-kl|pair-mi",
        help="a fine-tuned head (with its .json sidecar), or an unsupervised read-out of the pair head",
    )
    p.add_argument(
        "--encoder",
        metavar="MODEL",
        help="pre-trained encoder (model.safetensors with model.json, its folder or its model.json); required for pair-kl / pair-mi, "
        "for a head defaults to the one it was fine-tuned on (checked by sha256)",
    )
    p.add_argument(
        "--test",
        action="append",
        required=True,
        metavar="NAME=PATH",
        help="test set label and file (structure JSONL, TAPE JSON/LMDB, RaptorX set, CSV/TSV/Parquet table); "
        "repeatable",
    )
    p.add_argument("--out", required=True, metavar="PATH.tsv", help="the results table")
    p.add_argument("--overwrite", action="store_true", help=FILE_OVERWRITE_HELP)
    p.add_argument("--model", metavar="NAME", help="model label in the table (default: the encoder's folder name)")
    p.add_argument("--batch-size", type=int, default=4, help="proteins per forward pass (heads)")
    p.add_argument(
        "--too-long",
        choices=("windows", "crop", "skip"),
        default="windows",
        help="proteins longer than the encoder's window: score at full length from overlapping windows "
        "(averaged), crop to the first window, or leave out (counted either way)",
    )
    p.add_argument(
        "--mask-pairs",
        action="store_true",
        help="pair-kl / pair-mi: mask each pair as in pre-training (one sequence copy per pair: small proteins only)",
    )
    p.add_argument("--pair-batch", type=int, default=4096, help="pairs per pair-head call (pair-kl / pair-mi)")
    p.add_argument(
        "--format",
        choices=("auto", *FORMATS),
        default="auto",
        help="format of the test files (auto: from name and content)",
    )
    p.add_argument(
        "--contact-atom",
        choices=("auto", "CA", "CB"),
        help="contact atom (auto: the dataset's convention); default: the head's config, auto for pair-*",
    )
    p.add_argument(
        "--contact-threshold",
        type=float,
        help="contact distance in Angstrom; default: the head's config, 8.0 for pair-*",
    )
    add_device(p)
    add_precision(p, "the head's (for pair-kl / pair-mi the encoder's)")


def run(args: argparse.Namespace) -> int:
    # engine imports on use, so that the parsers stay light (pmlm/commands/__init__.py)
    from pmlm.finetune.head_scoring import evaluate
    from pmlm.outputs import file_target

    file_target(args.out, suffixes=(".tsv",), option="--out", what="results table", overwrite=args.overwrite)
    if args.encoder is not None:
        from pmlm.pretrained import encoder_weights

        args.encoder = encoder_weights(args.encoder)  # the weights, their folder or model.json

    tests = dict(labelled_paths(args.test, "--test", form="NAME=PATH"))
    evaluate(
        args.head,
        tests,
        args.out,
        encoder=args.encoder,
        model_label=args.model,
        batch_size=args.batch_size,
        too_long=args.too_long,
        mask_pairs=args.mask_pairs,
        pair_batch=args.pair_batch,
        fmt=args.format,
        contact_atom=args.contact_atom,
        contact_threshold=args.contact_threshold,
        device=args.device,
        precision=args.precision,
    )
    return 0
