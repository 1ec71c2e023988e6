# The co-evolution study on synthetic Potts families (pmlm coevolution curves, docs/coevolution.md): per seed, the
# families of every group sampled, split and tokenized; one job per unit (one arm of one seed: an encoder trained and
# read out at every budget; a seed's classical baselines); then the tables and the figure over every unit.
#   snakemake --cores 2 coevolution --configfile config/coevolution.yaml         # CI-sized, CPU
#   snakemake --cores 4 coevolution --configfile config/coevolution_large.yaml   # harder, one GPU
# Every job runs `pmlm coevolution curves` on the study's folder, the whole study handed over as JSON; logs and
# benchmarks stay outside that folder, which the command keeps for itself.


rule prepare_coevolution:
    output:
        directory(coevolution_study.data("{seed}")),
    params:
        study=coevolution_study.json,
        out=study_folder,
    log:
        f"{COEVOLUTION_LOGS}/seed{{seed}}/prepare_coevolution.log",
    benchmark:
        f"{BENCH}/coevolution/seed{{seed}}/prepare_coevolution.tsv"
    wildcard_constraints:
        seed=one_of(coevolution_study.seeds()),
    threads: 1
    resources:
        mem_mb=per_attempt(2000),
        runtime=per_attempt(30),
    conda:
        "../../envs/pmlm.yaml"
    shell:
        "OMP_NUM_THREADS={threads} python -m pmlm coevolution curves --config-json {params.study:q} "
        "--out {params.out:q} --prepare {wildcards.seed} > {log:q} 2>&1"


rule run_coevolution_unit:
    input:
        data=coevolution_study.unit_data,
        recipe=coevolution_study.recipe,
    output:
        coevolution_study.unit_result("{unit}"),
    params:
        study=coevolution_study.json,
        out=study_folder,
    log:
        f"{COEVOLUTION_LOGS}/units/{{unit}}.log",
    benchmark:
        f"{BENCH}/coevolution/units/{{unit}}.tsv"
    wildcard_constraints:
        unit=one_of(coevolution_study.units()),  # an arm of a seed (seed1-all-pmlm) or a seed's baselines
    threads: coevolution_study.threads
    resources:
        mem_mb=per_attempt(4000),
        runtime=per_attempt(60),
    conda:
        "../../envs/pmlm.yaml"
    shell:
        "OMP_NUM_THREADS={threads} python -m pmlm coevolution curves --config-json {params.study:q} "
        "--out {params.out:q} --unit {wildcards.unit} > {log:q} 2>&1"


rule report_coevolution:
    input:
        units=coevolution_study.unit_results(),
        data=coevolution_study.seed_data(),
    output:
        tsv=coevolution_study.results(),
        sequences=coevolution_study.sequences(),
        md=report(
            coevolution_study.results(".md"),
            caption="../report/coevolution_table.rst",
            category="Co-evolution",
            labels={"item": "tables"},
        ),
        png=coevolution_study.results(".png"),
        svg=report(
            coevolution_study.results(".svg"),
            caption="../report/coevolution_figure.rst",
            category="Co-evolution",
            labels={"item": "figure"},
        ),
    params:
        study=coevolution_study.json,
        out=output_dir,
    log:
        f"{COEVOLUTION_LOGS}/report_coevolution.log",
    conda:
        "../../envs/pmlm.yaml"
    shell:
        "python -m pmlm coevolution curves --config-json {params.study:q} --out {params.out:q} --collect "
        "> {log:q} 2>&1"


rule coevolution:
    input:
        coevolution_study.targets(),
