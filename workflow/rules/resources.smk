# Resources of the rules: fixed amounts that grow with each retry, and those that grow with the input.


def per_attempt(amount):
    """A resource that grows with each retry: ``amount`` at the first attempt, twice that at the second..."""

    def scaled(wildcards, attempt):
        return amount * attempt

    return scaled


# --- resources that grow with the input (bench/bench_data_scale.py measured the rates; README
# "Reproducing the paper: data" gives the full-scale figures). Before the inputs exist the sizes
# cannot be read; Snakemake then evaluates these when the job is ready to run.


def input_mib(input):
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


def tokenize_mem_mb(wildcards, input, attempt):
    # measured: ~220 MB at 8 shards, flat in the records; plus the rows waiting for row groups
    # (num_shards x row_group_size, ~500 bytes each, never more than the input)
    shards = shard_setting(wildcards.dataset, "num_shards") * shard_setting(wildcards.dataset, "row_group_size")
    return attempt * (1000 + int(min(input_mib(input), shards * 500 / 2**20) + 0.1 * input_mib(input)))


def tokenize_runtime(wildcards, input, attempt):
    # measured: ~30 MiB of FASTA per second; budget 2 MiB/s
    return attempt * (15 + int(input_mib(input) / 120))
