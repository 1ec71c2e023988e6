# Zero-shot mutation effects on ProteinGym: the published assays archive and reference file (fetch_source) ->
# the assays to score -> every mutant of every assay scored by every configured encoder -> ProteinGym's
# aggregation -> tables beside the published models, and figures.
#   snakemake --cores 2 --configfile config/proteingym.yaml


checkpoint select_proteingym_assays:
    input:
        reference=proteingym.reference,
        archive=proteingym.archive,
    output:
        proteingym.selection,
    params:
        args=proteingym.select_args,
    log:
        f"{LOGS}/proteingym/select_assays.log",
    conda:
        "../../envs/pmlm.yaml"
    shell:
        "python -m pmlm proteingym select --reference {input.reference:q} --archive {input.archive:q} {params.args} "
        "-o {output:q} 2> {log:q}"


rule score_proteingym_assay:
    input:
        unpack(proteingym.score_inputs),
    output:
        tsv=f"{proteingym.dir}/scores/{{dataset}}/{{objective}}-{{preset}}/{{assay}}.tsv",
        json=f"{proteingym.dir}/scores/{{dataset}}/{{objective}}-{{preset}}/{{assay}}.json",
    params:
        prefix=output_prefix,
        args=proteingym.score_args,
    log:
        f"{LOGS}/proteingym/{{dataset}}/{{objective}}-{{preset}}/{{assay}}.log",
    benchmark:
        f"{BENCH}/proteingym/{{dataset}}/{{objective}}-{{preset}}/{{assay}}.tsv"
    wildcard_constraints:
        # the encoders of pretrain.models, trained or released (whose dataset need not be a configured one)
        dataset=one_of(sorted({m["dataset"] for m in proteingym.scoring_encoders()})),
        assay=r"[A-Za-z0-9_.+-]+",
    threads: 1
    resources:
        gpu=1,
        mem_mb=per_attempt(16000),
        runtime=per_attempt(120),
    conda:
        "../../envs/pmlm.yaml"
    shell:
        "OMP_NUM_THREADS={threads} python -m pmlm proteingym score {input.weights:q} --archive {input.archive:q} "
        "--assays {input.assays:q} --assay {wildcards.assay:q} --out-prefix {params.prefix:q} {params.args} "
        "2> {log:q}"


rule aggregate_proteingym:
    input:
        assays=proteingym.selection,
        scores=proteingym.score_files,
    output:
        summary=f"{proteingym.dir}/summary.tsv",
        assays=f"{proteingym.dir}/summary_assays.tsv",
    params:
        encoders=proteingym.aggregate_args,
        prefix=output_prefix,
    log:
        f"{LOGS}/proteingym/aggregate.log",
    conda:
        "../../envs/pmlm.yaml"
    shell:
        "python -m pmlm proteingym aggregate --assays {input.assays:q} {params.encoders} "
        "--out-prefix {params.prefix:q} 2> {log:q}"


rule tabulate_proteingym:
    input:
        summary=rules.aggregate_proteingym.output.summary,
        assays=rules.aggregate_proteingym.output.assays,
    output:
        multiext(f"{RESULTS}/tables/proteingym", ".md", ".csv", ".tex"),
        html=report(
            f"{RESULTS}/tables/proteingym.html",
            caption="../report/proteingym_table.rst",
            category="ProteinGym",
            labels={"item": "table: zero-shot fitness beside published models"},
        ),
        categories=multiext(f"{RESULTS}/tables/proteingym_categories", ".md", ".csv", ".tex", ".html"),
        assays=multiext(f"{RESULTS}/tables/proteingym_assays", ".md", ".csv", ".tex", ".html"),
        doubles=multiext(f"{RESULTS}/tables/proteingym_doubles", ".md", ".csv", ".tex"),
        doubles_html=report(
            f"{RESULTS}/tables/proteingym_doubles.html",
            caption="../report/proteingym_doubles.rst",
            category="ProteinGym",
            labels={"item": "table: double mutants, pair joint vs additive"},
        ),
        png=f"{RESULTS}/figures/proteingym_categories.png",
        svg=report(
            f"{RESULTS}/figures/proteingym_categories.svg",
            caption="../report/proteingym_categories.rst",
            category="ProteinGym",
            labels={"item": "figure: per function category"},
        ),
        doubles_png=f"{RESULTS}/figures/proteingym_doubles.png",
        doubles_svg=report(
            f"{RESULTS}/figures/proteingym_doubles.svg",
            caption="../report/proteingym_doubles.rst",
            category="ProteinGym",
            labels={"item": "figure: double mutants, pair joint vs additive"},
        ),
    params:
        table_prefix=output_prefix,
        figure_prefix=proteingym.figure_prefix,
    log:
        f"{LOGS}/proteingym/tables.log",
    conda:
        "../../envs/pmlm.yaml"
    shell:
        "python -m pmlm proteingym tables --summary {input.summary:q} --assays-scored {input.assays:q} "
        "--table-prefix {params.table_prefix:q} --figure-prefix {params.figure_prefix:q} 2> {log:q}"


rule proteingym:
    input:
        proteingym.targets(),
