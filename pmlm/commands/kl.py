"""``pmlm kl``: histogram of KL(P(x_i)P(x_j) || P(x_i,x_j)) of a PMLM model on validation pairs."""

from __future__ import annotations

import argparse
import sys

from pmlm.commands import labelled_paths
from pmlm.outputs import OVERWRITE_HELP


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        action="append",
        required=True,
        metavar="NAME=WEIGHTS",
        help="label and final weights (model.safetensors with its .json); repeatable",
    )
    p.add_argument(
        "--shards",
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="shards folder for the model of the same NAME (its validation split is used)",
    )
    p.add_argument(
        "--valid",
        action="append",
        default=[],
        metavar="LABEL=DIR",
        help="a validation set (shards folder) every model is read on: one panel each; repeatable",
    )
    p.add_argument("--out-prefix", required=True, help="writes PREFIX.png, PREFIX.svg, PREFIX.json")
    p.add_argument("--sequences", type=int, default=64, help="validation sequences per model")
    p.add_argument("--pairs", type=int, default=16, help="sampled pairs per sequence")
    p.add_argument("--max-residues", type=int, default=254, help="crop of each sequence (model max_len - 2)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--split", default="valid")
    p.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)


def run(args: argparse.Namespace) -> int:
    # engine imports on use, so that the parsers stay light (pmlm/commands/__init__.py)
    from pmlm.evaluation.kl import kl_histograms
    from pmlm.pretrained import encoder_weights

    models = {n: str(encoder_weights(p)) for n, p in labelled_paths(args.model, "--model", form="NAME=WEIGHTS")}
    shards = dict(labelled_paths(args.shards, "--shards", form="NAME=DIR"))
    valid = dict(labelled_paths(args.valid, "--valid", form="LABEL=DIR"))
    summary = kl_histograms(
        models,
        valid,
        shards,
        args.out_prefix,
        split=args.split,
        sequences=args.sequences,
        pairs=args.pairs,
        max_residues=args.max_residues,
        seed=args.seed,
        overwrite=args.overwrite,
    )
    for panel, by_model in summary.items():
        for name, s in by_model.items():
            print(
                f"kl: {name} on {panel}: {s['all']['pairs']} pairs, median {s['all'].get('median', float('nan')):.3e} nats",
                file=sys.stderr,
            )
    return 0
