"""``pmlm plan``: before submitting, how long each pre-training job of a config takes and whether it fits a GPU,
and what its inference section costs (GPU-hours and disk per encoder and output)."""

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
        "the figures and their assumptions. A config whose sources state their size (sources.<name>.estimate) first "
        "gets its data stage: CPU-hours, wall time, peak memory and disk of ingest, clustering and tokenization per "
        "dataset (docs/data.md). A config with an inference section (a FASTA and encoders) also gets, per "
        "encoder and output, the forward passes, model FLOPs, GPU-hours, shard jobs and hours per job against the "
        "profile's time limit, rows and disk (docs/inference.md), from the FASTA's lengths or --proteins and "
        "--mean-length."
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--configfile",
        nargs="+",
        metavar="CONFIG.yaml",
        help="workflow config, e.g. config/paper.yaml; several are merged in order, as Snakemake merges them",
    )
    source.add_argument("--recipe", metavar="RECIPE.yaml", help="one training recipe instead (see --objective)")
    source.add_argument(
        "--finetune",
        metavar="RECIPE.yaml",
        help="a fine-tuning recipe: trainable parameters, peak memory per GPU and time per epoch with the encoder "
        "frozen, adapted (LoRA) and fully fine-tuned, on --encoder or --preset, for --train or --proteins",
    )
    parser.add_argument("--objective", default="pmlm", help="objective of --recipe and --preset (default: pmlm)")
    parser.add_argument("--encoder", metavar="MODEL", help="--finetune: the encoder to fine-tune (a pmlm encoder)")
    parser.add_argument("--preset", metavar="PRESET", help="--finetune: an encoder of this size preset instead")
    parser.add_argument("--train", metavar="FILE", help="--finetune: the training file (its proteins' lengths)")
    parser.add_argument(
        "--profile", default="profiles/slurm", metavar="DIR", help="SLURM profile with the pretrain resources"
    )
    parser.add_argument("--gpus", type=int, metavar="N", help="GPUs per job (default: the profile's)")
    parser.add_argument("--runtime", type=int, metavar="MIN", help="time limit per SLURM job (default: the profile's)")
    parser.add_argument(
        "--tokens-per-second",
        action="append",
        default=[],
        metavar="[PRESET[/OBJECTIVE]=]N",
        help="non-pad tokens/s per GPU of a preset (base=12000), of one objective of it (base/mlm=14000) or, bare, of "
        "the first job's; jobs of other presets take a rate derived at the same model-FLOP rate (marked ~); "
        "repeatable; replaces config/throughput.yaml's rates",
    )
    parser.add_argument(
        "--throughput",
        default="config/throughput.yaml",
        metavar="FILE.yaml",
        help="measured tokens/s per GPU by preset and objective (pmlm throughput writes it); default %(default)s",
    )
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="recipe override for every job (repeatable)"
    )
    parser.add_argument(
        "--proteins",
        type=int,
        metavar="N",
        help="inference: price N sequences (with --mean-length) instead of the FASTA",
    )
    parser.add_argument("--mean-length", type=int, metavar="L", help="inference: residues of each of --proteins")
    parser.add_argument(
        "--inference-flops",
        type=float,
        metavar="N",
        help="inference: model FLOP/s per GPU for every encoder (default: config/throughput.yaml's measured figure "
        "for the precision, else an assumed one, marked *)",
    )
    parser.add_argument(
        "--schema",
        default="workflow/schemas/config.schema.yaml",
        metavar="FILE.yaml",
        help="the workflow's config schema, whose defaults fill the inference section (default: %(default)s)",
    )
    parser.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")


def run(args: argparse.Namespace) -> int:
    # engine imports on use, so that the parsers stay light (pmlm/commands/__init__.py)
    from pmlm.data.stage_cost import plan_data
    from pmlm.data.stage_cost import render as render_data
    from pmlm.errors import ConfigError
    from pmlm.inference.pricing import plan_inference, pretrains
    from pmlm.inference.pricing import render as render_inference
    from pmlm.train.jobs import WorkflowConfig, pretrain_resources, recipe_job, workflow_jobs
    from pmlm.train.planning import plan, render
    from pmlm.train.throughput import read_rates

    for name in ("gpus", "runtime", "proteins", "mean_length"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.inference_flops is not None and args.inference_flops <= 0:
        raise ConfigError(f"--inference-flops must be > 0, got {args.inference_flops}")
    if args.finetune:
        return _finetune(args)
    inference = config = None
    if args.configfile:
        config = WorkflowConfig.load(args.configfile)
        inference = plan_inference(
            config, args.schema, args.profile, args.throughput, args.proteins, args.mean_length, args.inference_flops
        )
    jobs = []
    if args.recipe:
        jobs = [recipe_job(args.recipe, args.objective, args.set)]
    elif inference is None or pretrains(config):
        jobs = workflow_jobs(config)  # a config without pre-training or inference: its one-line error
        if args.set:
            jobs = [recipe_job(j.recipe, j.config.objective.name, args.set, j.name) for j in jobs]
    resources = pretrain_resources(args.profile)
    resources["gpus"] = args.gpus or resources["gpus"]
    resources["runtime_min"] = args.runtime or resources["runtime_min"]
    rows = plan(jobs, resources, args.tokens_per_second, read_rates(args.throughput)) if jobs else []
    data, missing = plan_data(config.values, config.name) if config is not None else ([], [])
    if args.json:
        print(json.dumps({"resources": resources, "data": data, "jobs": rows, "inference": inference and inference[0]},
                         indent=1))  # fmt: skip
        return 0
    parts = [render_data(data, missing)] if data else []
    parts += [render(rows)] if rows else []
    parts += [render_inference(*inference)] if inference is not None else []
    sys.stdout.write("\n".join(parts))
    return 0


def _finetune(args: argparse.Namespace) -> int:
    """``--finetune``: the recipe priced frozen, adapted and fully fine-tuned (pmlm.finetune.cost)."""
    # engine imports on use, as in run
    from pmlm.config.finetuning import FinetuneConfig
    from pmlm.errors import ConfigError
    from pmlm.finetune.cost import encoder_spec, flop_rate, plan_finetune, render
    from pmlm.tasks.registry import read_task_data
    from pmlm.train.throughput import read_rates

    if (args.encoder is None) == (args.preset is None):
        raise ConfigError("--finetune prices a recipe on an encoder: give --encoder MODEL or --preset PRESET")
    if (args.train is None) == (args.proteins is None) or (args.proteins is not None) != (args.mean_length is not None):
        raise ConfigError("--finetune needs its training set: --train FILE, or --proteins N with --mean-length L")
    cfg = FinetuneConfig.from_yaml(args.finetune, args.set)
    spec = encoder_spec(args.encoder, args.preset, args.objective)
    if args.train is not None:
        lengths = [len(e) for e in read_task_data(args.train, cfg.configured_task(), cfg.read_options()).examples]
    else:
        lengths = [args.mean_length] * args.proteins
    rate, note = flop_rate(spec, read_rates(args.throughput))
    rows = plan_finetune(cfg, spec, lengths, rate, note)
    if args.json:
        print(json.dumps({"encoder": spec.label, "task": cfg.task, "proteins": len(lengths), "modes": rows}, indent=1))
        return 0
    sys.stdout.write(render(rows, spec, cfg.task, len(lengths)))
    return 0
