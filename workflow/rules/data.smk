# Data stage: download -> ingest (normalise) -> MMseqs2 cluster + decontaminate + split -> Parquet shards.


rule fetch_source:
    output:
        "resources/sources/{source}/{filename}",
    params:
        url=sources.fetch_url,
        checksums=sources.checksum_args,
    log:
        "logs/fetch/{source}/{filename}.log",
    wildcard_constraints:
        filename=r"[^/]+",
    retries: 2
    conda:
        "../../envs/pmlm.yaml"
    shell:
        "python -m pmlm fetch {params.url:q} -o {output:q} {params.checksums} 2> {log:q}"


rule extract_member:
    input:
        sources.downloaded_archive,
    output:
        "resources/sources/{source}/members/{member}",
    log:
        "logs/extract/{source}/{member}.log",
    wildcard_constraints:
        # a path inside the archive; nested tar archives on the way are opened in place
        member=r"[^/].*",
    conda:
        "../../envs/pmlm.yaml"
    shell:
        "python -m pmlm extract {input:q} {wildcards.member:q} -o {output:q} 2> {log:q}"


rule ingest_sequences:
    input:
        datasets.dataset_sources,
    output:
        fasta=f"{RESULTS}/data/{{dataset}}/clean.fasta",
        stats=f"{RESULTS}/data/{{dataset}}/ingest_stats.json",
    params:
        policy=datasets.ingest_args,
        formats=datasets.ingest_formats,
    log:
        f"{LOGS}/ingest/{{dataset}}.log",
    benchmark:
        f"{BENCH}/ingest/{{dataset}}.tsv"
    resources:
        mem_mb=ingest_mem_mb,
        runtime=ingest_runtime,
    conda:
        "../../envs/pmlm.yaml"
    shell:
        "python -m pmlm ingest {input:q} -o {output.fasta:q} --stats {output.stats:q} --format {params.formats} "
        "{params.policy} 2> {log:q}"


rule split_clusters:
    input:
        fasta=rules.ingest_sequences.output.fasta,
        references=datasets.decontamination_sources,
    # the split FASTAs are kept (about the clean FASTA's size again): a temporary split would be planned again by any
    # rerun of tokenize_shards (another shard count, row-group size or compression), re-clustering UniRef50
    output:
        train=f"{RESULTS}/data/{{dataset}}/split/train.fasta",
        valid=f"{RESULTS}/data/{{dataset}}/split/valid.fasta",
        stats=f"{RESULTS}/data/{{dataset}}/split/split_stats.json",
    params:
        out_dir=output_dir,
        options=datasets.split_args,
        references=datasets.decontamination_args,
    log:
        f"{LOGS}/split/{{dataset}}.log",
    benchmark:
        f"{BENCH}/split/{{dataset}}.tsv"
    # before split_structures when both are ready: the shards and all of pre-training wait on this split, the
    # structure split only on pre-training's end
    priority: 1
    threads: 8
    resources:
        mem_mb=split_mem_mb,
        runtime=split_runtime,
    conda:
        "../../envs/mmseqs2.yaml"
    shell:
        "python -m pmlm split {input.fasta:q} --out-dir {params.out_dir:q} {params.options} {params.references} "
        "--threads {threads} 2> {log:q}"


rule tokenize_shards:
    input:
        train=rules.split_clusters.output.train,
        valid=rules.split_clusters.output.valid,
    output:
        directory(f"{RESULTS}/data/{{dataset}}/shards"),
    params:
        layout=datasets.tokenize_args,
    log:
        f"{LOGS}/tokenize/{{dataset}}.log",
    benchmark:
        f"{BENCH}/tokenize/{{dataset}}.tsv"
    resources:
        mem_mb=rule_resources.tokenize_mem_mb,
        runtime=tokenize_runtime,
    conda:
        "../../envs/pmlm.yaml"
    shell:
        "python -m pmlm tokenize --input train={input.train:q} --input valid={input.valid:q} --out-dir {output:q} "
        "{params.layout} 2> {log:q}"


rule data:
    input:
        datasets.targets(),
