# Pre-training: one job per (dataset, objective, preset), then the scores table and the KL figure.


rule pretrain:
    input:
        shards=datasets.dataset_shards,
        recipe=encoders.recipe_file,
    output:
        weights=protected(f"{paths.model_dir(*ENCODER_WILDCARDS)}/model.safetensors"),
        info=protected(f"{paths.model_dir(*ENCODER_WILDCARDS)}/model.json"),
        scores=f"{paths.model_dir(*ENCODER_WILDCARDS)}/final_scores.json",
        # the finished run's metrics log, which the training curves read: the trainer copies its run folder's log
        # here at the end (--metrics). The run folder's own log, which it appends to across resumes and requeues,
        # stays undeclared, so a failed or requeued job (Snakemake restores or removes its outputs) loses no row
        metrics=paths.pretrain_metrics_path(*ENCODER_WILDCARDS),
    params:
        # checkpoints and TensorBoard events live outside the declared outputs, so a killed or requeued job
        # resumes from its last step-N/ checkpoint instead of starting over
        run_dir=paths.pretrain_run_dir(*ENCODER_WILDCARDS),
        overrides=encoders.pretrain_overrides,
        # `pmlm launch`: one trainer per GPU on every node of the job; in a SLURM batch job (the `mpi`
        # resource, see profiles/slurm) it starts its own srun step, so SLURM's warning signal reaches
        # the trainers and not the shell or Snakemake around them, and requeues the job when they saved
        launcher=pretrain_launcher,
    log:
        f"{LOGS}/pretrain/{{dataset}}/{{objective}}-{{preset}}.log",
    benchmark:
        f"{BENCH}/pretrain/{{dataset}}/{{objective}}-{{preset}}.tsv"
    # a configured dataset and recipe: never a released encoder's folder (rule import_release writes those)
    wildcard_constraints:
        dataset=one_of(datasets.datasets),
        preset=one_of(encoders.pretrain["recipes"]),
    # A trainer stopped by SIGUSR1/SIGTERM (time-limit warning, preemption) saves a checkpoint and exits
    # with 99; under the SLURM profile `pmlm launch --requeue` then puts the job back in its queue under the
    # same id and it resumes (docs/slurm.md), as often as it takes. Retries are for real failures (a crash, a
    # lost node), and only the submitting Snakemake retries: inside a SLURM job a retry would rerun the
    # trainer in the same allocation, right past its time-limit warning.
    retries: 3 if workflow.is_main_process else 0
    threads: 1
    # one GPU here (a local run's one trainer); under --profile slurm the profile's set-resources decide
    # the job's GPUs, CPUs, memory and time (docs/slurm.md, "Resources")
    resources:
        gpu=1,
    conda:
        "../../envs/pmlm.yaml"
    # the rule's log holds the job's last run; every run of it (each requeue, each retry) is appended to
    # train.log in the run folder. tee ignores SIGTERM and SIGINT, which SLURM (a requeue, a preemption, the
    # time limit) or Ctrl-C send it too: it copies until the trainers' last line, the one that says they saved
    shell:
        "mkdir -p {params.run_dir:q}; OMP_NUM_THREADS={threads} {params.launcher} -m pmlm pretrain "
        "--config {input.recipe:q} --shards {input.shards:q} --out {params.run_dir:q} --final {output.weights:q} "
        "--scores {output.scores:q} --metrics {output.metrics:q} {params.overrides} 2>&1 "
        "| (trap '' TERM INT; exec tee -a {params.run_dir:q}/train.log) > {log:q}"


rule tabulate_pretrain_scores:
    input:
        weights=encoders.pretrained_targets(),
    output:
        multiext(paths.table_prefix(TABLE_PRETRAIN_SCORES), ".md", ".csv", ".tex"),
        # the form the report shows (each table once; Markdown, CSV and LaTeX stay outputs)
        html=report(
            f"{paths.table_prefix(TABLE_PRETRAIN_SCORES)}.html",
            caption="../report/pretrain_scores.rst",
            category="Pre-training",
            labels={"figure": "table: validation losses and accuracies"},
        ),
    params:
        models=encoders.pretrain_table_args,
        prefix=output_prefix,
    log:
        f"{LOGS}/tables/pretrain_scores.log",
    conda:
        "../../envs/pmlm.yaml"
    shell:
        "python -m pmlm tables pretrain-scores {params.models} --out-prefix {params.prefix:q} 2> {log:q}"


rule plot_kl_histogram:
    input:
        weights=[encoders.pretrained_weights(m) for m in encoders.kl_models()],
        shards=[paths.shards_dir(d) for d in encoders.kl_datasets()],
    output:
        f"{RESULTS}/figures/kl_histogram.png",
        report(
            f"{RESULTS}/figures/kl_histogram.svg",
            caption="../report/kl_histogram.rst",
            category="Pre-training",
            labels={"figure": "KL histogram"},
        ),
        summary=f"{RESULTS}/figures/kl_histogram.json",
    params:
        args=encoders.kl_args,
        prefix=output_prefix,
    log:
        f"{LOGS}/figures/kl_histogram.log",
    benchmark:
        f"{BENCH}/figures/kl_histogram.tsv"
    resources:
        mem_mb=rule_resources.for_kl_models(8000, 16000),
        runtime=rule_resources.for_kl_models(60, 180),
    conda:
        "../../envs/pmlm.yaml"
    shell:
        "OMP_NUM_THREADS={threads} python -m pmlm kl {params.args} --out-prefix {params.prefix:q} 2> {log:q}"


rule pretraining:
    input:
        encoders.targets(),
