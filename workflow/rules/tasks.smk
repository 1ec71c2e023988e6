# Tasks of one's own and TAPE's regression tasks: a labelled table split into train / valid / test, and a table
# per run whose `table:` is `task` (tables/<run>.*, the task's metrics for every encoder).


rule split_table:
    input:
        task_data.table_source,
    output:
        train=f"{RESULTS}/tasks/{{tabledata}}/train.parquet",
        valid=f"{RESULTS}/tasks/{{tabledata}}/valid.parquet",
        test=f"{RESULTS}/tasks/{{tabledata}}/test.parquet",
        stats=f"{RESULTS}/tasks/{{tabledata}}/table_split_stats.json",
    params:
        out_dir=output_dir,
        options=task_data.table_split_args,
    log:
        f"{LOGS}/split_table/{{tabledata}}.log",
    benchmark:
        f"{BENCH}/split_table/{{tabledata}}.tsv"
    threads: 2
    resources:
        mem_mb=per_attempt(4000),
        runtime=per_attempt(60),
    conda:
        "../../envs/mmseqs2.yaml"
    shell:
        "python -m pmlm split-table {input:q} --out-dir {params.out_dir:q} {params.options} --threads {threads} "
        "2> {log:q}"


rule task_table:
    input:
        runs.task_table_inputs,
    output:
        [f"{paths.table_prefix('{taskrun}')}.{ext}" for ext in ("md", "csv", "tex")],
        report(
            f"{paths.table_prefix('{taskrun}')}.html",
            caption="../report/downstream_tables.rst",
            category="Downstream tasks",
            labels={"item": "table: {taskrun}"},
        ),
    params:
        results=result_args,
        prefix=output_prefix,
    log:
        f"{LOGS}/tables/task_{{taskrun}}.log",
    wildcard_constraints:
        taskrun=one_of(runs.task_table_runs()),
    conda:
        "../../envs/pmlm.yaml"
    shell:
        "python -m pmlm tables task {params.results} --out-prefix {params.prefix:q} 2> {log:q}"
