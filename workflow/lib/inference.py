"""The inference rules' paths, command flags, targets and CPU resources (workflow/rules/inference.smk): a FASTA file
through trained encoders, cut into shards by the checkpoint shard_fasta, one job per shard, output and encoder,
gathered per output and encoder.

Workflow code, not package code: workflow/rules/common_inference.smk builds one ``Inference`` from the validated
config, and the rules take its methods as input, params and resources functions. What differs between the outputs
(the flags of their commands, the files they are gathered into) is asked of pmlm's output types.
"""

from __future__ import annotations

from flags import as_flags, canonical
from resources import input_mib
from workflow_config import INFERENCE_SHARDS_FOLDER, encoder_weights_path, inference_encoder

from pmlm.inference.fasta_shards import read_manifest
from pmlm.inference.output_types import OUTPUTS, PARQUET
from pmlm.vocabulary import OUTPUT_EMBEDDINGS

SHARD_OPTIONS = ("tokens_per_batch", "device", "precision")  # the inference section's flags of every shard job
# pmlm embed's and pmlm gather's name for the per-sequence file beside OUT.parquet
PER_SEQUENCE = OUTPUTS[OUTPUT_EMBEDDINGS].tables[1].suffix
# the outputs gathered into one file, by rule gather_inference (embeddings and their per-sequence file: gather_embeddings)
ONE_FILE_OUTPUTS = [name for name, output in OUTPUTS.items() if len(output.tables) == 1]


class Inference:
    """The config's ``inference`` section under ``results`` (its folder: results/<run>/inference)."""

    def __init__(self, config: dict, results: str, pretrained_weights, checkpoints):
        self.config = config
        self.section = config["inference"]
        self.dir = f"{results}/inference"
        # the checkpoint's folder: <shard>.fasta and manifest.json (pmlm shard-fasta)
        self.shards = f"{self.dir}/{INFERENCE_SHARDS_FOLDER}"
        self.pretrained_weights = pretrained_weights  # a pretrain.models entry -> its weights (made here first)
        self.checkpoints = checkpoints

    def enabled(self) -> bool:
        """The inference target runs when inference.fasta names sequences (the config checks require encoders then)."""
        return bool(self.section["fasta"])

    def fasta(self, wildcards=None) -> str:
        return self.section["fasta"]

    def encoder_weights(self, wildcards) -> str:
        """The weights of encoder ``wildcards.encoder``: a pretrain.models entry's (made by this workflow first), or
        the file or folder the config names."""
        value = self.section["encoders"][wildcards.encoder]
        m = inference_encoder(self.config, value)
        return self.pretrained_weights(m) if m is not None else encoder_weights_path(value)

    def parts_dir(self, encoder: str, output: str) -> str:
        """The folder of one output's shard files of one encoder (temporary: removed once gathered)."""
        return f"{self.dir}/{encoder}/shards/{output}"

    def part(self, output: str, suffix: str = PARQUET) -> str:
        """A shard job's output file, with the rule's wildcards."""
        return f"{self.parts_dir('{encoder}', output)}/{{shard}}{suffix}"

    def file(self, encoder: str, output: str, suffix: str = PARQUET) -> str:
        """A gathered file: results/<run>/inference/<encoder>/<output>.parquet (embeddings: also .per_sequence)."""
        return f"{self.dir}/{encoder}/{output}{suffix}"

    def shard_names(self) -> list[str]:
        """The shards the checkpoint wrote (its manifest, in input order)."""
        return [s.name for s in read_manifest(self.checkpoints.shard_fasta.get().output[0]).shards]

    def parts(self, output: str | None, suffix: str = PARQUET):
        """An input function: every shard's file of ``output`` (None: the wildcard's) of the job's encoder, after the
        checkpoint."""

        def parts(wildcards) -> list[str]:
            folder = self.parts_dir(wildcards.encoder, output or wildcards.kind)
            return [f"{folder}/{name}{suffix}" for name in self.shard_names()]

        return parts

    def gathered_parts_dir(self, wildcards) -> str:
        return self.parts_dir(wildcards.encoder, getattr(wildcards, "kind", OUTPUT_EMBEDDINGS))

    def shard_fasta_args(self, wildcards) -> str:
        return as_flags({k: self.section[k] for k in ("residues_per_shard", "unknown")})

    def shard_args(self, output: str):
        """A params function: the flags of ``output``'s command (pmlm embed takes --unknown too, so that its settings
        name the policy the shards were read with), then those of every shard job."""
        common = {k: self.section[k] for k in SHARD_OPTIONS}

        def args(wildcards) -> str:
            return as_flags({**canonical(OUTPUTS[output].shard_settings(self.section)), **common})

        return args

    def files(self, encoder: str, output: str) -> list[str]:
        return [self.file(encoder, output, table.suffix) for table in OUTPUTS[output].tables]

    def targets(self) -> list[str]:
        if not self.enabled():
            return []
        return [f for e in self.section["encoders"] for o in self.section["outputs"] for f in self.files(e, o)]


# --- resources of the CPU jobs (the GPU jobs get the profile's blocks, docs/slurm.md)


def shard_fasta_mem_mb(wildcards, input, attempt) -> int:
    # the ids (duplicate check) and one int per record: ~100 bytes per record, <= 1 record per 100 bytes of FASTA
    return attempt * (1000 + int(input_mib(input)))


def shard_fasta_runtime(wildcards, input, attempt) -> int:
    # two passes over the input and its sha256; measured ~10 MiB/s for the check on one core: budget 1 MiB/s
    return attempt * (15 + int(input_mib(input) / 60))


def gather_mem_mb(wildcards, attempt) -> int:
    # one row group at a time: pmlm embed's row groups hold up to 16 x tokens_per_batch residues' embeddings
    return attempt * 8000


def gather_runtime(wildcards, input, attempt) -> int:
    # reads every part once for its ids and once to copy it: budget 20 MiB/s
    return attempt * (15 + int(input_mib(input) / 1200))
