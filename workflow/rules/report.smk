# The workflow report's figures and pages: training curves, contact maps of a few test chains, precision by
# separation, the run's configuration and versions. `snakemake --report report.html` bundles them with the
# tables (each table once, as its HTML form). All of them take seconds.


rule plot_pretrain_curves:
    input:
        weights=[pretrained_weights(m) for m in trained_models()],
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
        heads=[finetuned_head(m["dataset"], m["objective"], m["preset"], ft) for m, ft in finetuned_runs()],
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


rule plot_contact_maps:
    input:
        unpack(contact_map_inputs),
    output:
        png=f"{RESULTS}/figures/contact_maps/{{dataset}}/{{objective}}-{{preset}}/{{ft}}.png",
        svg=report(
            f"{RESULTS}/figures/contact_maps/{{dataset}}/{{objective}}-{{preset}}/{{ft}}.svg",
            caption="../report/contact_maps.rst",
            category="Contact maps",
            labels={"encoder": "{objective}-{preset}@{dataset}", "run": "{ft}"},
        ),
    params:
        head=contact_map_head,
        chains=CONTACT_MAPS.get("chains", 3),
        label=lambda wildcards: encoder_label(model_of(wildcards)),
        prefix=output_prefix,
    log:
        f"{LOGS}/report/contact_maps/{{dataset}}/{{objective}}-{{preset}}/{{ft}}.log",
    benchmark:
        f"{BENCH}/report/contact_maps/{{dataset}}/{{objective}}-{{preset}}/{{ft}}.tsv"
    wildcard_constraints:
        objective="mlm|pmlm|pmlm_pair_only|tmlm",
        preset=r"[A-Za-z0-9_]+",
        ft=r"[A-Za-z0-9_]+|unsupervised-pair-(kl|mi)",
    threads: 1
    resources:
        mem_mb=by_encoder(4000, 16000),
        runtime=by_encoder(20, 60),
    conda:
        "../../envs/pmlm.yaml"
    shell:
        "OMP_NUM_THREADS={threads} python -m pmlm report contact-maps {params.head} --test {input.test:q} "
        "--chains {params.chains} --label {params.label:q} --out-prefix {params.prefix:q} 2> {log:q}"


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
        table=multiext(f"{RESULTS}/tables/precision_by_separation", ".csv", ".md", ".tex"),
        html=report(
            f"{RESULTS}/tables/precision_by_separation.html",
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
