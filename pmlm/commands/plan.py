"""``pmlm plan``: before submitting, how long each pre-training job of a config takes and whether it fits a GPU."""

from __future__ import annotations

import argparse
import json
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = (
        "Per pre-training job: optimizer steps, tokens (the recipe's tokens_per_step x steps, the same on any number "
        "of GPUs), GPU-hours and wall days at a per-GPU throughput, SLURM jobs of the profile's runtime needed, and "
        "per card size (40 / 80 GB) the micro-batch, the accumulation (tokens_per_step / (micro-batch x GPUs)) and "
        "the peak memory per GPU of the largest micro-batch (sharded when the recipe uses FSDP). docs/gpu.md explains "
        "the figures and their assumptions."
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--configfile", metavar="CONFIG.yaml", help="workflow config, e.g. config/paper.yaml")
    source.add_argument("--recipe", metavar="RECIPE.yaml", help="one training recipe instead (see --objective)")
    parser.add_argument("--objective", default="pmlm", help="objective of --recipe (default: pmlm)")
    parser.add_argument(
        "--profile", default="profiles/slurm", metavar="DIR", help="SLURM profile with the pretrain resources"
    )
    parser.add_argument("--gpus", type=int, metavar="N", help="GPUs per job (default: the profile's)")
    parser.add_argument("--runtime", type=int, metavar="MIN", help="time limit per SLURM job (default: the profile's)")
    parser.add_argument("--tokens-per-second", type=float, metavar="N", help="non-pad tokens/s per GPU for every job")
    parser.add_argument(
        "--throughput",
        default="config/throughput.yaml",
        metavar="FILE.yaml",
        help="per-preset tokens/s per GPU (tokens_per_gpu_second: {preset: N}); default config/throughput.yaml",
    )
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="recipe override for every job (repeatable)"
    )
    parser.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")


def run(args: argparse.Namespace) -> int:
    # engine imports on use, so that the parsers stay light (pmlm/commands/__init__.py)
    from pmlm.errors import ConfigError
    from pmlm.train.planning import plan, pretrain_resources, recipe_job, render, throughput_table, workflow_jobs

    for name in ("gpus", "runtime"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise ConfigError(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.tokens_per_second is not None and args.tokens_per_second <= 0:
        raise ConfigError(f"--tokens-per-second must be > 0, got {args.tokens_per_second}")
    if args.configfile:
        jobs = workflow_jobs(args.configfile)
        if args.set:
            jobs = [recipe_job(j.recipe, j.config.objective.name, args.set, j.name) for j in jobs]
    else:
        jobs = [recipe_job(args.recipe, args.objective, args.set)]
    resources = pretrain_resources(args.profile)
    resources["gpus"] = args.gpus or resources["gpus"]
    resources["runtime_min"] = args.runtime or resources["runtime_min"]
    rows = plan(jobs, resources, args.tokens_per_second, throughput_table(args.throughput))
    if args.json:
        print(json.dumps({"resources": resources, "jobs": rows}, indent=1))
    else:
        sys.stdout.write(render(rows))
    return 0
