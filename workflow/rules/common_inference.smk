# The inference rules' helpers (workflow/lib/inference.py), bound once to the config: a FASTA file through trained
# encoders, cut into shards by the checkpoint shard_fasta, one job per shard, output and encoder, gathered per output
# and encoder.
from inference import (
    ONE_FILE_OUTPUTS,
    PER_SEQUENCE,
    Inference,
    gather_mem_mb,
    gather_runtime,
    shard_fasta_mem_mb,
    shard_fasta_runtime,
)

from pmlm.vocabulary import OUTPUT_CONTACTS, OUTPUT_EMBEDDINGS, OUTPUT_SUBSTITUTIONS

inference = Inference(config, RESULTS, pretrained_weights, checkpoints)
