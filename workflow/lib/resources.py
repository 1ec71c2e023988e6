"""Resources of the rules: fixed amounts that grow with each retry, those that grow with the input or with the
encoder, and the launcher a training job's resources choose."""

from __future__ import annotations

import os
import re
import shlex

from encoders import Encoders
from sources import Datasets


def per_attempt(amount):
    """A resource that grows with each retry: ``amount`` at the first attempt, twice that at the second..."""

    def scaled(wildcards, attempt):
        return amount * attempt

    return scaled


# --- resources that grow with the input (bench/bench_data_scale.py measured the rates; docs/data.md gives the
# full-scale figures). Before the inputs exist the sizes cannot be read; Snakemake then evaluates these when the job
# is ready to run.


def input_mib(input) -> float:
    return sum(os.path.getsize(f) for f in input) / 2**20


def ingest_mem_mb(wildcards, input, attempt):
    # measured: 105-140 MB plus < 10 bytes per record (10^5 -> 10^6 records), <= 5,000 records per MiB of
    # compressed input; the headroom covers UniRef's largest entries, which are read whole
    return attempt * (1000 + int(0.1 * input_mib(input)))


def ingest_runtime(wildcards, input, attempt):
    # measured: UniRef XML, the slowest format, ~5 MiB of compressed input per second; budget 1 MiB/s
    return attempt * (15 + int(input_mib(input) / 60))


def split_mem_mb(wildcards, input, attempt):
    # measured: MMseqs2 linclust peaks at ~2.8 MiB per MiB of clean FASTA (1.0 GB at 10^6 records)
    return attempt * (2000 + int(4 * input_mib(input)))


def split_runtime(wildcards, input, attempt):
    # measured: ~0.5 s per MiB of clean FASTA on 2 threads; budget 1.5 s per MiB
    return attempt * (30 + int(input_mib(input) / 40))


def tokenize_runtime(wildcards, input, attempt):
    # measured: ~30 MiB of FASTA per second; budget 2 MiB/s
    return attempt * (15 + int(input_mib(input) / 120))


# --- encoders larger than the presets. A released checkpoint holds fp32 weights, so its parameters are its size / 4
# bytes. The steps that run an encoder give one of more than LARGE_ENCODER_PARAMS the second amount, estimates for the
# released PMLM-650M on one GPU (docs/released-model.md).
LARGE_ENCODER_PARAMS = 300e6


def is_large(m: dict) -> bool:
    return bool(m.get("release")) and m["release"]["size"] / 4 > LARGE_ENCODER_PARAMS


class RuleResources:
    """The resources that read the config: the shard layout, the encoders."""

    def __init__(self, datasets: Datasets, encoders: Encoders):
        self.datasets, self.encoders = datasets, encoders

    def tokenize_mem_mb(self, wildcards, input, attempt):
        # measured: ~220 MB at 8 shards, flat in the records; plus the rows waiting for row groups
        # (num_shards x row_group_size, ~500 bytes each, never more than the input)
        setting = self.datasets.shard_setting
        shards = setting(wildcards.dataset, "num_shards") * setting(wildcards.dataset, "row_group_size")
        return attempt * (1000 + int(min(input_mib(input), shards * 500 / 2**20) + 0.1 * input_mib(input)))

    def by_encoder(self, amount, large_amount):
        """A resource that depends on the encoder named by the job's wildcards, times the attempt: ``amount``, or
        ``large_amount`` for a large released encoder."""

        def scaled(wildcards, attempt):
            return attempt * (large_amount if is_large(self.encoders.model_of(wildcards)) else amount)

        return scaled

    def for_kl_models(self, amount, large_amount):
        """As ``by_encoder`` for the KL figure, which reads every PMLM encoder in one job."""

        def scaled(wildcards, attempt):
            return attempt * (large_amount if any(map(is_large, self.encoders.kl_models())) else amount)

        return scaled

    def import_mem_mb(self, wildcards, attempt):
        # measured (bench/bench_import.py): peak RSS within 1.5 x the checkpoint's size, its tensors memory-mapped
        return attempt * (1000 + int(1.5 * self.encoders.release_of(wildcards)["release"]["size"] / 2**20))


# --- the launcher of a training job, from the GPUs its resources give it


def launcher(gpus_per_node: int, resources) -> str:
    """The `pmlm launch ... --` prefix. The site profile's `launch_env` resource ("NAME=VALUE NAME=VALUE", e.g.
    NCCL_SOCKET_IFNAME=ib0) becomes `--env` options: set for the trainers on every node."""
    per_node_flag = f" --gpus-per-node {gpus_per_node}" if gpus_per_node > 0 else ""
    env = "".join(f" --env {shlex.quote(item)}" for item in str(resources.get("launch_env", "") or "").split())
    return f"python -m pmlm launch{per_node_flag}{env} --"


def pretrain_launcher(wildcards, resources) -> str:
    """`pmlm launch` with the job's GPUs per node: one trainer per GPU on every node of the job (torchrun),
    through its own srun step in a SLURM batch job, or the trainer itself for one GPU; in a batch job it
    requeues the job in place when the trainers saved after a stop signal (docs/slurm.md). GPUs per node come
    from `gres: gpu[:type]:N` (a per-node count) or else from `gpu` (the job's total) over `nodes`."""
    nodes = max(1, int(resources.get("nodes", 1) or 1))
    per_node = re.fullmatch(r"gpu(?::[^:]+)?:(\d+)", str(resources.get("gres", "") or ""))
    return launcher(int(per_node.group(1)) if per_node else -(-int(resources.get("gpu", 0) or 0) // nodes), resources)


def finetune_launcher(wildcards, resources) -> str:
    """As for pre-training, with one trainer: fine-tuning runs in one process."""
    return launcher(1, resources)
