# Named helpers of the inference rules (workflow/rules/inference.smk): a FASTA file through trained encoders, cut
# into shards by the checkpoint shard_fasta, one job per shard, output and encoder, gathered per output and encoder.
from pmlm.inference.fasta_shards import read_manifest
from pmlm.vocabulary import OUTPUT_CONTACTS, OUTPUT_EMBEDDINGS, OUTPUT_SUBSTITUTIONS
from workflow_config import encoder_weights_path, inference_encoder, INFERENCE_SHARDS_FOLDER

INFERENCE = config["inference"]
INFERENCE_DIR = f"{RESULTS}/inference"
# the checkpoint's folder: <shard>.fasta and manifest.json (pmlm shard-fasta)
INFERENCE_SHARDS = f"{INFERENCE_DIR}/{INFERENCE_SHARDS_FOLDER}"
# pmlm embed's and pmlm gather's name for the per-sequence file beside OUT.parquet (pmlm.inference.embedding's
# PER_SEQUENCE_SUFFIX; tests/test_inference_workflow.py holds them equal)
PER_SEQUENCE = ".per_sequence.parquet"
# outputs gathered by rule gather_inference (embeddings, with their per-sequence file, by gather_embeddings)
ONE_FILE_OUTPUTS = [OUTPUT_SUBSTITUTIONS, OUTPUT_CONTACTS]
ALL_PAIRS = "all"  # inference.contacts.top: every pair of each sequence


def inference_enabled():
    """The inference target runs when inference.fasta names sequences (the config checks require encoders then)."""
    return bool(INFERENCE["fasta"])


def inference_fasta(wildcards=None):
    return INFERENCE["fasta"]


def inference_encoder_weights(wildcards):
    """The weights of encoder ``wildcards.encoder``: a pretrain.models entry's (made by this workflow first), or the
    file or folder the config names."""
    value = INFERENCE["encoders"][wildcards.encoder]
    m = inference_encoder(config, value)
    return pretrained_weights(m) if m is not None else encoder_weights_path(value)


def inference_parts_dir(encoder, output):
    """The folder of one output's shard files of one encoder (temporary: removed once gathered)."""
    return f"{INFERENCE_DIR}/{encoder}/shards/{output}"


def inference_part(output, suffix=".parquet"):
    """A shard job's output file, with the rule's wildcards."""
    return f"{inference_parts_dir('{encoder}', output)}/{{shard}}{suffix}"


def inference_file(encoder, output, suffix=".parquet"):
    """A gathered file: results/<run>/inference/<encoder>/<output>.parquet (embeddings: also .per_sequence.parquet)."""
    return f"{INFERENCE_DIR}/{encoder}/{output}{suffix}"


def inference_shard_names():
    """The shards the checkpoint wrote (its manifest, in input order)."""
    return [s.name for s in read_manifest(checkpoints.shard_fasta.get().output[0]).shards]


def inference_parts(output, suffix=".parquet"):
    """An input function: every shard's file of ``output`` of the job's encoder (after the checkpoint)."""

    def parts(wildcards):
        folder = inference_parts_dir(wildcards.encoder, output or wildcards.kind)
        return [f"{folder}/{name}{suffix}" for name in inference_shard_names()]

    return parts


def gathered_parts_dir(wildcards):
    return inference_parts_dir(wildcards.encoder, getattr(wildcards, "kind", OUTPUT_EMBEDDINGS))


def shard_fasta_args(wildcards):
    return as_flags({"residues_per_shard": INFERENCE["residues_per_shard"], "unknown": INFERENCE["unknown"]})


def _common_inference_flags():
    """Flags every shard job's command takes."""
    return {k: INFERENCE[k] for k in ("tokens_per_batch", "device", "precision")}


def embed_args(wildcards):
    """pmlm embed's flags; --unknown too, so that its settings name the policy the shards were read with (the shards
    hold the records as read: nothing is left to repair)."""
    return as_flags({"layer": INFERENCE["layer"], "unknown": INFERENCE["unknown"], **_common_inference_flags()})


def score_args(wildcards):
    return as_flags({"marginal": INFERENCE["marginal"], **_common_inference_flags()})


def contacts_args(wildcards):
    """pmlm contacts' flags; top: all is the command's own default (every pair), given by no --top."""
    contacts = {k: v for k, v in canonical(INFERENCE["contacts"]).items() if (k, v) != ("top", ALL_PAIRS)}
    return as_flags({**contacts, **_common_inference_flags()})


def inference_files(encoder, output):
    if output == OUTPUT_EMBEDDINGS:
        return [inference_file(encoder, output), inference_file(encoder, output, PER_SEQUENCE)]
    return [inference_file(encoder, output)]


def inference_targets():
    if not inference_enabled():
        return []
    encoders, outputs = INFERENCE["encoders"], INFERENCE["outputs"]
    return [f for encoder in encoders for output in outputs for f in inference_files(encoder, output)]


# --- resources of the CPU jobs (the GPU jobs get the profile's blocks, docs/slurm.md)


def shard_fasta_mem_mb(wildcards, input, attempt):
    # the ids (duplicate check) and one int per record: ~100 bytes per record, <= 1 record per 100 bytes of FASTA
    return attempt * (1000 + int(input_mib(input)))


def shard_fasta_runtime(wildcards, input, attempt):
    # two passes over the input and its sha256; measured ~10 MiB/s for the check on one core: budget 1 MiB/s
    return attempt * (15 + int(input_mib(input) / 60))


def gather_mem_mb(wildcards, attempt):
    # one row group at a time: pmlm embed's row groups hold up to 16 x tokens_per_batch residues' embeddings
    return attempt * 8000


def gather_runtime(wildcards, input, attempt):
    # reads every part once for its ids and once to copy it: budget 20 MiB/s
    return attempt * (15 + int(input_mib(input) / 1200))
