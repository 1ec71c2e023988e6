# The workflow report's figures and pages: training curves, contact maps of a few test chains, precision by
# separation, the run's configuration and versions. `snakemake --report report.html` bundles them with the
# tables (each table once, as its HTML form). All of them take seconds.


rule plot_pretrain_curves:
    input:
        # the runs' metrics logs, outputs of rule pretrain: complete once its job is done
        metrics=[encoders.pretrain_metrics(m) for m in encoders.trained_models()],
    output:
        png=f"{RESULTS}/figures/pretrain_curves.png",
        svg=report(
            f"{RESULTS}/figures/pretrain_curves.svg",
            caption="../report/pretrain_curves.rst",
            category="Pre-training",
            labels={"figure": "training curves"},
        ),
    params:
        runs=report_inputs.pretrain_curve_args,
        prefix=output_prefix,
    log:
        f"{LOGS}/report/pretrain_curves.log",
    conda:
        "../../envs/pmlm.yaml"
    shell:
        "python -m pmlm report curves --kind pretrain {params.runs} --out-prefix {params.prefix:q} 2> {log:q}"


rule plot_finetune_curves:
    input:
        metrics=[runs.finetune_metrics(m, ft) for m, ft in runs.finetuned_runs()],
    output:
        png=f"{RESULTS}/figures/finetune_curves.png",
        svg=report(
            f"{RESULTS}/figures/finetune_curves.svg",
            caption="../report/finetune_curves.rst",
            category="Downstream tasks",
            labels={"item": "fine-tuning curves"},
        ),
    params:
        runs=report_inputs.finetune_curve_args,
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
        unpack(report_inputs.contact_map_inputs),
    output:
        png=f"{paths.contact_map_prefix(*ENCODER_WILDCARDS, '{ft}')}.png",
        svg=report(
            f"{paths.contact_map_prefix(*ENCODER_WILDCARDS, '{ft}')}.svg",
            caption="../report/contact_maps.rst",
            category="Contact maps",
            labels={"encoder": "{objective}-{preset}@{dataset}", "run": "{ft}"},
        ),
    params:
        chains=report_inputs.contact_maps["chains"],
        label=encoders.model_label,
        prefix=output_prefix,
    log:
        f"{LOGS}/report/contact_maps/{{dataset}}/{{objective}}-{{preset}}/{{ft}}.log",
    benchmark:
        f"{BENCH}/report/contact_maps/{{dataset}}/{{objective}}-{{preset}}/{{ft}}.tsv"
    threads: 1
    resources:
        mem_mb=rule_resources.by_encoder(4000, 16000),
        runtime=rule_resources.by_encoder(20, 60),
    conda:
        "../../envs/pmlm.yaml"
    shell:
        "OMP_NUM_THREADS={threads} python -m pmlm report contact-maps --head {input.head:q} --test {input.test:q} "
        "--chains {params.chains} --label {params.label:q} --out-prefix {params.prefix:q} 2> {log:q}"


# an unsupervised read-out of the encoder's pair head (no fine-tuning) on the first chains of the read-outs' first
# test set; named beside the contact runs' maps (readout_run: unsupervised-pair-kl)
rule plot_readout_contact_maps:
    input:
        unpack(report_inputs.readout_map_inputs),
    output:
        png=f"{paths.contact_map_prefix(*ENCODER_WILDCARDS, readout_run('{readout}'))}.png",
        svg=report(
            f"{paths.contact_map_prefix(*ENCODER_WILDCARDS, readout_run('{readout}'))}.svg",
            caption="../report/contact_maps.rst",
            category="Contact maps",
            labels={"encoder": "{objective}-{preset}@{dataset}", "run": readout_run("{readout}")},
        ),
    params:
        chains=report_inputs.contact_maps["chains"],
        label=encoders.model_label,
        prefix=output_prefix,
    log:
        f"{LOGS}/report/contact_maps/{{dataset}}/{{objective}}-{{preset}}/{readout_run('{readout}')}.log",
    benchmark:
        f"{BENCH}/report/contact_maps/{{dataset}}/{{objective}}-{{preset}}/{readout_run('{readout}')}.tsv"
    wildcard_constraints:
        objective=one_of(PAIR_OBJECTIVES),
    threads: 1
    resources:
        mem_mb=rule_resources.by_encoder(4000, 16000),
        runtime=rule_resources.by_encoder(20, 60),
    conda:
        "../../envs/pmlm.yaml"
    shell:
        "OMP_NUM_THREADS={threads} python -m pmlm report contact-maps --head {wildcards.readout} "
        "--encoder {input.encoder:q} --test {input.test:q} --chains {params.chains} --label {params.label:q} "
        "--out-prefix {params.prefix:q} 2> {log:q}"


rule plot_precision_by_separation:
    input:
        report_inputs.contact_tsvs(),
    output:
        png=f"{RESULTS}/figures/precision_by_separation.png",
        svg=report(
            f"{RESULTS}/figures/precision_by_separation.svg",
            caption="../report/precision_by_separation.rst",
            category="Contact maps",
            labels={"encoder": "all", "run": "precision by separation"},
        ),
        table=multiext(paths.table_prefix(TABLE_PRECISION_BY_SEPARATION), ".csv", ".md", ".tex"),
        html=report(
            f"{paths.table_prefix(TABLE_PRECISION_BY_SEPARATION)}.html",
            caption="../report/precision_by_separation.rst",
            category="Downstream tasks",
            labels={"item": "table: precision by separation"},
        ),
    params:
        results=report_inputs.separation_args,
        prefix=output_prefix,
        table_prefix=named_output_prefix("table"),
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
            f"{paths.report_dir}/run_info.html",
            caption="../report/run_info.rst",
            category="Run",
            labels={"page": "configuration and versions"},
        ),
        json=f"{paths.report_dir}/run_info.json",
    params:
        config=report_inputs.run_config_json,
        snakemake_version=SNAKEMAKE_VERSION,
        prefix=output_prefix,
    log:
        f"{LOGS}/report/run_info.log",
    conda:
        "../../envs/pmlm.yaml"
    shell:
        "python -m pmlm report run-info --config-json {params.config:q} --snakemake-version "
        "{params.snakemake_version} --out-prefix {params.prefix:q} 2> {log:q}"
