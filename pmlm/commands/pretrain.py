"""``pmlm pretrain``: pre-train an MLM or PMLM encoder from Parquet shards (single process or torchrun)."""

from __future__ import annotations

import argparse

from pmlm.commands import run_targets
from pmlm.train import EXTEND_HELP, RESUME_NOTE


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = RESUME_NOTE + (
        " Multi-GPU / multi-node: run it under `pmlm launch -- -m pmlm pretrain ...` (torchrun, and srun in a SLURM job)."
    )
    parser.add_argument("--config", required=True, metavar="CFG.yaml", help="training config (YAML)")
    parser.add_argument(
        "--shards", required=True, metavar="DIR", help="folder with manifest.json and the train/ and valid/ shards"
    )
    parser.add_argument(
        "--out",
        required=True,
        metavar="DIR",
        help="run folder: checkpoints/, metrics.csv, tb/; a folder of its own that a rerun resumes (one holding "
        "anything else, '.' or a file is refused)",
    )
    parser.add_argument(
        "--final",
        required=True,
        metavar="PATH",
        help="final weights (.safetensors); the model config goes beside it as .json",
    )
    parser.add_argument("--scores", metavar="PATH", help="last validation metrics (default: OUT/final_scores.json)")
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
        help="override a config value, e.g. --set optim.lr=1e-4 (repeatable)",
    )


def run(args: argparse.Namespace) -> int:
    # engine imports on use, so that the parsers stay light (pmlm/commands/__init__.py)
    from pmlm.config.pretraining import TrainConfig
    from pmlm.train.pretrain import train
    from pmlm.train.run_folder import RUN_FOLDER_NAMES

    run_targets(args, "pmlm pretrain", RUN_FOLDER_NAMES)  # before any work: the outputs are the run's own

    cfg = TrainConfig.from_yaml(args.config, args.set)
    return train(
        cfg,
        args.shards,
        args.out,
        final_path=args.final,
        scores_path=args.scores,
        extend=args.extend,
        metrics_path=args.metrics,
    )
