# The workflow report's figures and pages: training curves, contact maps of a few test chains, precision by
# separation, the run's configuration and versions. `snakemake --report report.html` bundles them with the
# tables (each table once, as its HTML form). All of them take seconds.


rule plot_pretrain_curves:
    input:
        # the runs' metrics logs, outputs of rule pretrain: complete once its job is done
        metrics=[pretrain_metrics(m) for m in trained_models()],
    output:
        png=f"{RESULTS}/figures/pretrain_curves.png",
        svg=report(
            f"{RESULTS}/figures/pretrain_curves.svg",
            caption="../report/pretrain_curves.rst",
            category="Pre-training",
            labels={"figure": "training curves"},
        ),
    params:
        runs=pretrain_curve_args,
        prefix=output_prefix,
    log:
        f"{LOGS}/report/pretrain_curves.log",
    conda:
        "../../envs/pmlm.yaml"
    shell:
        "python -m pmlm report curves --kind pretrain {params.runs} --out-prefix {params.prefix:q} 2> {log:q}"


rule plot_finetune_curves:
    input:
        metrics=[finetune_metrics(m, ft) for m, ft in finetuned_runs()],
    output:
        png=f"{RESULTS}/figures/finetune_curves.png",
        svg=report(
            f"{RESULTS}/figures/finetune_curves.svg",
            caption="../report/finetune_curves.rst",
            category="Downstream tasks",
            labels={"item": "fine-tuning curves"},
        ),
    params:
        runs=finetune_curve_args,
        prefix=output_prefix,
    log:
        f"{LOGS}/report/finetune_curves.log",
    conda:
        "../../envs/pmlm.yaml"
    shell:
        "python -m pmlm report curves --kind finetune {params.runs} --out-prefix {params.prefix:q} 2> {log:q}"


# a contact run's head on the first chains of its first test set
rule plot_contact_maps:
    input:
        unpack(contact_map_inputs),
    output:
        png=f"{contact_map_prefix(*ENCODER_WILDCARDS, '{ft}')}.png",
        svg=report(
            f"{contact_map_prefix(*ENCODER_WILDCARDS, '{ft}')}.svg",
            caption="../report/contact_maps.rst",
            category="Contact maps",
            labels={"encoder": "{objective}-{preset}@{dataset}", "run": "{ft}"},
        ),
    params:
        chains=CONTACT_MAPS["chains"],
        label=model_label,
        prefix=output_prefix,
    log:
        f"{LOGS}/report/contact_maps/{{dataset}}/{{objective}}-{{preset}}/{{ft}}.log",
    benchmark:
        f"{BENCH}/report/contact_maps/{{dataset}}/{{objective}}-{{preset}}/{{ft}}.tsv"
    threads: 1
    resources:
        mem_mb=by_encoder(4000, 16000),
        runtime=by_encoder(20, 60),
    conda:
        "../../envs/pmlm.yaml"
    shell:
        "OMP_NUM_THREADS={threads} python -m pmlm report contact-maps --head {input.head:q} --test {input.test:q} "
        "--chains {params.chains} --label {params.label:q} --out-prefix {params.prefix:q} 2> {log:q}"


# an unsupervised read-out of the encoder's pair head (no fine-tuning) on the first chains of the read-outs' first
# test set; named beside the contact runs' maps (readout_run: unsupervised-pair-kl)
rule plot_readout_contact_maps:
    input:
        unpack(readout_map_inputs),
    output:
        png=f"{contact_map_prefix(*ENCODER_WILDCARDS, readout_run('{readout}'))}.png",
        svg=report(
            f"{contact_map_prefix(*ENCODER_WILDCARDS, readout_run('{readout}'))}.svg",
            caption="../report/contact_maps.rst",
            category="Contact maps",
            labels={"encoder": "{objective}-{preset}@{dataset}", "run": readout_run("{readout}")},
        ),
    params:
        chains=CONTACT_MAPS["chains"],
        label=model_label,
        prefix=output_prefix,
    log:
        f"{LOGS}/report/contact_maps/{{dataset}}/{{objective}}-{{preset}}/{readout_run('{readout}')}.log",
    benchmark:
        f"{BENCH}/report/contact_maps/{{dataset}}/{{objective}}-{{preset}}/{readout_run('{readout}')}.tsv"
    wildcard_constraints:
        objective=one_of(PAIR_OBJECTIVES),
    threads: 1
    resources:
        mem_mb=by_encoder(4000, 16000),
        runtime=by_encoder(20, 60),
    conda:
        "../../envs/pmlm.yaml"
    shell:
        "OMP_NUM_THREADS={threads} python -m pmlm report contact-maps --head {wildcards.readout} "
        "--encoder {input.encoder:q} --test {input.test:q} --chains {params.chains} --label {params.label:q} "
        "--out-prefix {params.prefix:q} 2> {log:q}"


rule plot_precision_by_separation:
    input:
        [tsv for _, tsv in contact_results()],
    output:
        png=f"{RESULTS}/figures/precision_by_separation.png",
        svg=report(
            f"{RESULTS}/figures/precision_by_separation.svg",
            caption="../report/precision_by_separation.rst",
            category="Contact maps",
            labels={"encoder": "all", "run": "precision by separation"},
        ),
        table=multiext(table_prefix(TABLE_PRECISION_BY_SEPARATION), ".csv", ".md", ".tex"),
        html=report(
            f"{table_prefix(TABLE_PRECISION_BY_SEPARATION)}.html",
            caption="../report/precision_by_separation.rst",
            category="Downstream tasks",
            labels={"item": "table: precision by separation"},
        ),
    params:
        results=separation_args,
        prefix=output_prefix,
        table_prefix=lambda wildcards, output: os.path.splitext(output.table[0])[0],
    log:
        f"{LOGS}/report/precision_by_separation.log",
    conda:
        "../../envs/pmlm.yaml"
    shell:
        "python -m pmlm report separation {params.results} --out-prefix {params.prefix:q} "
        "--table-prefix {params.table_prefix:q} 2> {log:q}"


rule record_run_info:
    output:
        html=report(
            f"{REPORT_DIR}/run_info.html",
            caption="../report/run_info.rst",
            category="Run",
            labels={"page": "configuration and versions"},
        ),
        json=f"{REPORT_DIR}/run_info.json",
    params:
        config=run_config_json,
        snakemake_version=SNAKEMAKE_VERSION,
        prefix=output_prefix,
    log:
        f"{LOGS}/report/run_info.log",
    conda:
        "../../envs/pmlm.yaml"
    shell:
        "python -m pmlm report run-info --config-json {params.config:q} --snakemake-version "
        "{params.snakemake_version} --out-prefix {params.prefix:q} 2> {log:q}"
