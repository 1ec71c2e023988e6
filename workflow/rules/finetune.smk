# Fine-tuning and evaluation: every pre-trained encoder x every configured run, the pair head's
# unsupervised contacts for PMLM encoders, and the paper's downstream tables.


rule expect_local_file:
    output:
        "resources/local/{filename}",
    log:
        "logs/local/{filename}.log",
    wildcard_constraints:
        filename=r"[^/]+",
    conda:
        "../../envs/pmlm.yaml"
    shell:
        "echo 'resources/local/{wildcards.filename} is data you provide (see the comment at its task_data entry "
        "in the config): place the file there and rerun' | tee {log:q} >&2; exit 1"


rule split_structures:
    input:
        task_data.structure_source,
    output:
        train=f"{RESULTS}/tasks/{{taskdata}}/train.jsonl",
        valid=f"{RESULTS}/tasks/{{taskdata}}/valid.jsonl",
        test=f"{RESULTS}/tasks/{{taskdata}}/test.jsonl",
        stats=f"{RESULTS}/tasks/{{taskdata}}/structure_split_stats.json",
    params:
        out_dir=output_dir,
        options=task_data.structure_split_args,
    log:
        f"{LOGS}/split_structures/{{taskdata}}.log",
    benchmark:
        f"{BENCH}/split_structures/{{taskdata}}.tsv"
    threads: 2
    resources:
        mem_mb=per_attempt(4000),
        runtime=per_attempt(60),
    conda:
        "../../envs/mmseqs2.yaml"
    shell:
        "python -m pmlm split-structures {input:q} --out-dir {params.out_dir:q} {params.options} --threads {threads} "
        "2> {log:q}"


rule finetune:
    input:
        unpack(runs.finetune_inputs),
    output:
        head=protected(f"{paths.finetune_dir(*ENCODER_WILDCARDS, '{ft}')}/head.safetensors"),
        info=protected(f"{paths.finetune_dir(*ENCODER_WILDCARDS, '{ft}')}/head.json"),
        # the finished run's metrics log, copied from its run folder at the end (see rule pretrain)
        metrics=paths.finetune_metrics_path(*ENCODER_WILDCARDS, "{ft}"),
    params:
        # checkpoints outside the declared outputs: a killed job resumes where it stopped
        run_dir=paths.finetune_run_dir(*ENCODER_WILDCARDS, "{ft}"),
        overrides=runs.finetune_overrides,
        # as for pre-training: in a SLURM batch job (`mpi`, see profiles/slurm) the trainer runs in its own srun
        # step, so SLURM's time-limit warning reaches it and not Snakemake, and a saved job is requeued in place
        launcher=finetune_launcher,
    log:
        f"{LOGS}/finetune/{{dataset}}/{{objective}}-{{preset}}/{{ft}}.log",
    benchmark:
        f"{BENCH}/finetune/{{dataset}}/{{objective}}-{{preset}}/{{ft}}.tsv"
    # on few cores the longest jobs go first (the pair read-out, then fine-tuning, then evaluation), so the short
    # ones (tables, figures) fill the gaps at the end
    priority: 2
    threads: 1
    # one GPU here; under --profile slurm the profile decides (docs/slurm.md, "Resources")
    resources:
        gpu=1,
    conda:
        "../../envs/pmlm.yaml"
    # the rule's log holds the job's last run; train.log in the run folder every run of it (tee as for pretrain)
    shell:
        "mkdir -p {params.run_dir:q}; OMP_NUM_THREADS={threads} {params.launcher} -m pmlm finetune "
        "--config {input.recipe:q} --encoder {input.encoder:q} --train {input.train:q} --valid {input.valid:q} "
        "--out {params.run_dir:q} --final {output.head:q} --metrics {output.metrics:q} {params.overrides} 2>&1 "
        "| (trap '' TERM INT; exec tee -a {params.run_dir:q}/train.log) > {log:q}"


rule evaluate:
    input:
        unpack(runs.evaluate_inputs),
    output:
        paths.evaluation_path(*ENCODER_WILDCARDS, "{ft}"),
    params:
        tests=test_args,
        label=encoders.model_label,
    log:
        f"{LOGS}/evaluate/{{dataset}}/{{objective}}-{{preset}}/{{ft}}.log",
    benchmark:
        f"{BENCH}/evaluate/{{dataset}}/{{objective}}-{{preset}}/{{ft}}.tsv"
    priority: 1
    threads: 1
    # one GPU here; under --profile slurm the profile decides (docs/slurm.md, "Resources")
    resources:
        gpu=1,
    conda:
        "../../envs/pmlm.yaml"
    shell:
        "OMP_NUM_THREADS={threads} python -m pmlm evaluate --head {input.head:q} {params.tests} "
        "--model {params.label:q} --out {output:q} > {log:q} 2>&1"


rule evaluate_unsupervised:
    input:
        unpack(runs.unsupervised_inputs),
    output:
        paths.evaluation_path(*ENCODER_WILDCARDS, readout_run("{readout}")),
    params:
        tests=test_args,
        label=encoders.model_label,
    log:
        f"{LOGS}/evaluate/{{dataset}}/{{objective}}-{{preset}}/{readout_run('{readout}')}.log",
    benchmark:
        f"{BENCH}/evaluate/{{dataset}}/{{objective}}-{{preset}}/{readout_run('{readout}')}.tsv"
    wildcard_constraints:
        objective=one_of(PAIR_OBJECTIVES),
    priority: 3
    threads: 1
    # one GPU here; under --profile slurm the profile decides (docs/slurm.md, "Resources")
    resources:
        gpu=1,
    conda:
        "../../envs/pmlm.yaml"
    shell:
        "OMP_NUM_THREADS={threads} python -m pmlm evaluate --head {wildcards.readout} --encoder {input.encoder:q} "
        "{params.tests} --model {params.label:q} --out {output:q} > {log:q} 2>&1"


rule aggregate_tables:
    input:
        runs.evaluation_tsvs(),
    output:
        runs.downstream_tables(),
        # the form the report shows (each table once; Markdown, CSV and LaTeX stay outputs)
        [
            report(
                f"{paths.table_prefix(t)}.html",
                caption="../report/downstream_tables.rst",
                category="Downstream tasks",
                labels={"item": f"table: {t.replace('_', ' ')}"},
            )
            for t in RESULT_TABLES
        ],
    params:
        results=runs.table_args,
        out_dir=output_dir,
        test_label=runs.finetune["test_label"],
    log:
        f"{LOGS}/tables/aggregate_tables.log",
    conda:
        "../../envs/pmlm.yaml"
    # the tables folder also holds the other table rules' files: --overwrite replaces this command's own and keeps them
    shell:
        "python -m pmlm tables results {params.results} --out-dir {params.out_dir:q} --overwrite "
        "--test-label {params.test_label:q} 2> {log:q}"


rule downstream:
    input:
        runs.targets(),
