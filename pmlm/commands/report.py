"""``pmlm report <item>``: the figures and pages of the workflow report (training curves, contact maps,
precision by separation, run information)."""

from __future__ import annotations

import argparse
import sys

from pmlm.commands import labelled_paths
from pmlm.outputs import OVERWRITE_HELP
from pmlm.reports.training_curves import Curves  # light: its figures import matplotlib when they draw

PAIR_READOUTS = ("pair-kl", "pair-mi")


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="item", required=True, metavar="<item>")
    curves = sub.add_parser("curves", help="training curves (loss, accuracies) from runs' metrics.csv logs")
    curves.add_argument(
        "--kind",
        type=Curves.argument,
        choices=Curves.values(),
        required=True,
        help="pretrain: L_mlm, L_pmlm, Acc_mlm, Acc_pmlm; finetune: loss and the validation metric",
    )
    curves.add_argument(
        "--run",
        action="append",
        required=True,
        metavar="LABEL=METRICS.csv",
        help="a run's label and its metrics.csv; repeatable",
    )
    curves.add_argument("--out-prefix", required=True, help="writes PREFIX.png and PREFIX.svg")

    maps = sub.add_parser("contact-maps", help="predicted vs true contact maps of a few test chains")
    maps.add_argument(
        "--head",
        required=True,
        metavar="HEAD.safetensors|" + "|".join(PAIR_READOUTS),
        help="a fine-tuned contact head, or an unsupervised read-out of the pair head",
    )
    maps.add_argument(
        "--encoder",
        metavar="MODEL",
        help="pre-trained encoder (model.safetensors, its folder or its model.json); required for pair-kl / pair-mi, for a head the one it was tuned on",
    )
    maps.add_argument("--test", required=True, metavar="PATH", help="test set (structure JSONL, TAPE, RaptorX)")
    maps.add_argument("--chains", type=int, default=3, help="chains shown: the first that fit the encoder's window")
    maps.add_argument("--label", required=True, help="model label in the figure's title")
    maps.add_argument("--out-prefix", required=True, help="writes PREFIX.png and PREFIX.svg")

    sep = sub.add_parser("separation", help="contact precision by separation range from evaluation TSVs")
    sep.add_argument(
        "--result",
        action="append",
        required=True,
        metavar="TABLE=TSV",
        help="an evaluation TSV and its table (as for `pmlm tables results`); non-contact ones are skipped",
    )
    sep.add_argument("--out-prefix", required=True, help="writes the figure, PREFIX.png and PREFIX.svg")
    sep.add_argument("--table-prefix", help="writes the table, PREFIX.csv / .md / .tex / .html (default: --out-prefix)")

    info = sub.add_parser("run-info", help="the run's configuration and software versions")
    info.add_argument("--config-json", required=True, help="the workflow's effective configuration as JSON")
    info.add_argument("--snakemake-version", help="version of the Snakemake that runs the workflow")
    info.add_argument("--out-prefix", required=True, help="writes PREFIX.html and PREFIX.json")
    for item in (curves, maps, sep, info):
        item.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)


def run(args: argparse.Namespace) -> int:
    # engine imports on use, by item: a curve or the run page does not wait for torch, which only contact maps
    # need (and the parsers stay light, pmlm/commands/__init__.py)
    if args.item == "curves":
        from pmlm.reports.training_curves import write_curves

        paths = write_curves(args.kind, labelled_paths(args.run, "--run"), args.out_prefix, overwrite=args.overwrite)
    elif args.item == "contact-maps":
        from pmlm.pretrained import encoder_weights
        from pmlm.reports.contact_maps import write_contact_maps

        encoder = encoder_weights(args.encoder) if args.encoder else None  # weights, folder or model.json
        paths = write_contact_maps(
            args.head, encoder, args.test, args.chains, args.label, args.out_prefix, overwrite=args.overwrite
        )
    elif args.item == "separation":
        from pmlm.reports.separation import write_precision_by_separation

        results = labelled_paths(args.result, "--result", unique=False)
        paths = write_precision_by_separation(
            results, args.out_prefix, args.table_prefix or args.out_prefix, overwrite=args.overwrite
        )
    else:
        from pmlm.reports.run_info import write_run_info

        paths = write_run_info(args.config_json, args.snakemake_version, args.out_prefix, overwrite=args.overwrite)
    print(f"pmlm report {args.item}: wrote {', '.join(map(str, paths))}", file=sys.stderr)
    return 0
