# A proteome through trained encoders (docs/inference.md): the FASTA checked once and cut into shards balanced by
# residues (a checkpoint: the shard count comes from the residues it reads) -> one job per shard, output and encoder
# (a GPU job under --profile slurm; each shard's file appears whole or not at all, so a killed or failed job is
# redone and no other) -> one Parquet file per output and encoder, in input order.
#   snakemake --cores 2 --configfile config/inference.yaml inference


checkpoint shard_fasta:
    input:
        inference.fasta,
    output:
        directory(inference.shards),
    log:
        f"{LOGS}/inference/shard_fasta.log",
    benchmark:
        f"{BENCH}/inference/shard_fasta.tsv"
    conda:
        "../../envs/pmlm.yaml"
    threads: 1
    resources:
        mem_mb=shard_fasta_mem_mb,
        runtime=shard_fasta_runtime,
    params:
        args=inference.shard_fasta_args,
    shell:
        "python -m pmlm shard-fasta {input:q} -o {output:q} {params.args} 2> {log:q}"


rule embed_shard:
    input:
        fasta=f"{inference.shards}/{{shard}}.fasta",
        model=inference.encoder_weights,
    output:
        residues=temp(inference.part(OUTPUT_EMBEDDINGS)),
        sequences=temp(inference.part(OUTPUT_EMBEDDINGS, PER_SEQUENCE)),
    log:
        f"{LOGS}/inference/{{encoder}}/{OUTPUT_EMBEDDINGS}/{{shard}}.log",
    benchmark:
        f"{BENCH}/inference/{{encoder}}/{OUTPUT_EMBEDDINGS}/{{shard}}.tsv"
    wildcard_constraints:
        encoder=one_of(inference.section["encoders"]),
        shard=r"\d+",
    conda:
        "../../envs/pmlm.yaml"
    threads: 1
    # one GPU here; under --profile slurm the profile decides (docs/slurm.md, "Resources")
    resources:
        gpu=1,
    params:
        args=inference.shard_args(OUTPUT_EMBEDDINGS),
    shell:
        "OMP_NUM_THREADS={threads} python -m pmlm embed {input.model:q} {input.fasta:q} -o {output.residues:q} "
        "--per-sequence {output.sequences:q} {params.args} 2> {log:q}"


rule score_shard:
    input:
        fasta=f"{inference.shards}/{{shard}}.fasta",
        model=inference.encoder_weights,
    output:
        temp(inference.part(OUTPUT_SUBSTITUTIONS)),
    log:
        f"{LOGS}/inference/{{encoder}}/{OUTPUT_SUBSTITUTIONS}/{{shard}}.log",
    benchmark:
        f"{BENCH}/inference/{{encoder}}/{OUTPUT_SUBSTITUTIONS}/{{shard}}.tsv"
    wildcard_constraints:
        encoder=one_of(inference.section["encoders"]),
        shard=r"\d+",
    conda:
        "../../envs/pmlm.yaml"
    threads: 1
    # one GPU here; under --profile slurm the profile decides (docs/slurm.md, "Resources")
    resources:
        gpu=1,
    params:
        args=inference.shard_args(OUTPUT_SUBSTITUTIONS),
    shell:
        "OMP_NUM_THREADS={threads} python -m pmlm score {input.model:q} --saturation --sequence {input.fasta:q} "
        "-o {output:q} {params.args} 2> {log:q}"


rule contacts_shard:
    input:
        fasta=f"{inference.shards}/{{shard}}.fasta",
        model=inference.encoder_weights,
    output:
        temp(inference.part(OUTPUT_CONTACTS)),
    log:
        f"{LOGS}/inference/{{encoder}}/{OUTPUT_CONTACTS}/{{shard}}.log",
    benchmark:
        f"{BENCH}/inference/{{encoder}}/{OUTPUT_CONTACTS}/{{shard}}.tsv"
    wildcard_constraints:
        encoder=one_of(inference.section["encoders"]),
        shard=r"\d+",
    conda:
        "../../envs/pmlm.yaml"
    threads: 1
    # one GPU here; under --profile slurm the profile decides (docs/slurm.md, "Resources")
    resources:
        gpu=1,
    params:
        args=inference.shard_args(OUTPUT_CONTACTS),
    shell:
        "OMP_NUM_THREADS={threads} python -m pmlm contacts {input.model:q} {input.fasta:q} -o {output:q} "
        "{params.args} 2> {log:q}"


rule gather_embeddings:
    input:
        shards=inference.shards,
        # the encoder: its sha256 checked against the parts' (and its training, if any, known before the shards)
        model=inference.encoder_weights,
        residues=inference.parts(OUTPUT_EMBEDDINGS),
        sequences=inference.parts(OUTPUT_EMBEDDINGS, PER_SEQUENCE),
    output:
        residues=inference.file("{encoder}", OUTPUT_EMBEDDINGS),
        sequences=inference.file("{encoder}", OUTPUT_EMBEDDINGS, PER_SEQUENCE),
    log:
        f"{LOGS}/inference/{{encoder}}/gather_{OUTPUT_EMBEDDINGS}.log",
    benchmark:
        f"{BENCH}/inference/{{encoder}}/gather_{OUTPUT_EMBEDDINGS}.tsv"
    wildcard_constraints:
        encoder=one_of(inference.section["encoders"]),
    conda:
        "../../envs/pmlm.yaml"
    threads: 1
    resources:
        mem_mb=gather_mem_mb,
        runtime=gather_runtime,
    params:
        parts=inference.gathered_parts_dir,
        output=OUTPUT_EMBEDDINGS,
    shell:
        "python -m pmlm gather {params.output} --shards {input.shards:q} --parts {params.parts:q} "
        "--model {input.model:q} -o {output.residues:q} 2> {log:q}"


rule gather_inference:
    input:
        shards=inference.shards,
        model=inference.encoder_weights,
        # the wildcard's output
        parts=inference.parts(None),
    output:
        inference.file("{encoder}", "{kind}"),
    log:
        f"{LOGS}/inference/{{encoder}}/gather_{{kind}}.log",
    benchmark:
        f"{BENCH}/inference/{{encoder}}/gather_{{kind}}.tsv"
    wildcard_constraints:
        encoder=one_of(inference.section["encoders"]),
        kind=one_of(ONE_FILE_OUTPUTS),
    conda:
        "../../envs/pmlm.yaml"
    threads: 1
    resources:
        mem_mb=gather_mem_mb,
        runtime=gather_runtime,
    params:
        parts=inference.gathered_parts_dir,
    shell:
        "python -m pmlm gather {wildcards.kind} --shards {input.shards:q} --parts {params.parts:q} "
        "--model {input.model:q} -o {output:q} 2> {log:q}"


rule inference:
    input:
        inference.targets(),
