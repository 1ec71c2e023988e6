"""``pmlm finetune``: fine-tune a task head (contact, secondary structure, remote homology) on a pre-trained encoder."""

from __future__ import annotations

import argparse

from pmlm.commands import run_targets
from pmlm.train import EXTEND_HELP, RESUME_NOTE


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = RESUME_NOTE + (" Score the result with `pmlm evaluate --head FINAL`.")
    parser.add_argument("--config", required=True, metavar="CFG.yaml", help="fine-tuning recipe (YAML)")
    parser.add_argument(
        "--encoder",
        required=True,
        metavar="MODEL",
        help="pre-trained encoder: its model.safetensors (with model.json), its folder or its model.json",
    )
    parser.add_argument(
        "--train",
        required=True,
        metavar="PATH",
        help="training set: structure JSONL, TAPE JSON/LMDB split, RaptorX-style contact set or a labelled table "
        "(CSV, TSV, Parquet; docs/tasks.md)",
    )
    parser.add_argument("--valid", metavar="PATH", help="validation set, scored every eval_every steps and at the end")
    parser.add_argument(
        "--out",
        required=True,
        metavar="DIR",
        help="run folder: checkpoints/, metrics.csv; a folder of its own that a rerun resumes (one holding anything "
        "else, '.' or a file is refused)",
    )
    parser.add_argument(
        "--final",
        required=True,
        metavar="PATH",
        help="final head weights (.safetensors); config, encoder path and sha256 go beside it as .json",
    )
    parser.add_argument(
        "--metrics",
        metavar="PATH",
        help="a copy of the run's metrics.csv, written when the run finishes (what the workflow declares and draws)",
    )
    parser.add_argument("--extend", action="store_true", help=EXTEND_HELP)
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config value, e.g. --set optim.head_lr=1e-3 (repeatable)",
    )


def run(args: argparse.Namespace) -> int:
    # engine imports on use, so that the parsers stay light (pmlm/commands/__init__.py)
    from pmlm.config.finetuning import FinetuneConfig
    from pmlm.finetune.finetune import finetune
    from pmlm.pretrained import encoder_weights
    from pmlm.train.run_folder import RUN_FOLDER_NAMES

    run_targets(args, "pmlm finetune", RUN_FOLDER_NAMES)  # before any work: the outputs are the run's own
    encoder = encoder_weights(args.encoder)  # the weights, their folder or model.json: one reading everywhere
    cfg = FinetuneConfig.from_yaml(args.config, args.set)
    return finetune(
        cfg,
        encoder,
        args.train,
        args.out,
        final_path=args.final,
        valid_path=args.valid,
        extend=args.extend,
        metrics_path=args.metrics,
    )
