# Planted-coupling study: synthetic Potts families -> tiny MLM and PMLM encoders per seed -> read-outs
# of the planted couplings on held-out sequences and a supervised contact head scored on held-out
# families -> two tables and one figure over seeds.
#   snakemake --cores 2 --configfile config/coevolution.yaml coevolution         # CI-sized, CPU
#   snakemake --cores 4 --configfile config/coevolution_large.yaml coevolution   # harder, one GPU


rule synthesize_families:
    output:
        directory(f"{COEVOLUTION_DIR}/seed{{seed}}/synth"),
    params:
        args=coevolution_study.synth_args,
    log:
        f"{COEVOLUTION_LOGS}/seed{{seed}}/synthesize_families.log",
    benchmark:
        f"{BENCH}/coevolution/seed{{seed}}/synthesize_families.tsv"
    threads: 1
    resources:
        mem_mb=per_attempt(2000),
        runtime=per_attempt(30),
    conda:
        "../../envs/pmlm.yaml"
    shell:
        "OMP_NUM_THREADS={threads} python -m pmlm synth --out {output:q} --seed {wildcards.seed} {params.args} "
        "> {log:q} 2>&1"


rule tokenize_families:
    input:
        f"{COEVOLUTION_DIR}/seed{{seed}}/synth",
    output:
        train=f"{COEVOLUTION_DIR}/seed{{seed}}/split/train.fasta",
        valid=f"{COEVOLUTION_DIR}/seed{{seed}}/split/valid.fasta",
        shards=directory(f"{COEVOLUTION_DIR}/seed{{seed}}/shards"),
    params:
        split=coevolution_study.split_args,
        shards=coevolution_study.shard_args,
    log:
        f"{COEVOLUTION_LOGS}/seed{{seed}}/tokenize_families.log",
    benchmark:
        f"{BENCH}/coevolution/seed{{seed}}/tokenize_families.tsv"
    threads: 1
    resources:
        mem_mb=per_attempt(2000),
        runtime=per_attempt(30),
    conda:
        "../../envs/pmlm.yaml"
    shell:
        # headers carry cluster=<family>: each family's sequences share one shard
        "(python -m pmlm coevolution split --synth {input:q} --train {output.train:q} --valid {output.valid:q} "
        "{params.split} && python -m pmlm tokenize --input train={output.train:q} --input valid={output.valid:q} "
        "--out-dir {output.shards:q} {params.shards}) > {log:q} 2>&1"


rule pretrain_coevolution:
    input:
        shards=f"{COEVOLUTION_DIR}/seed{{seed}}/shards",
        recipe=coevolution_study.recipe,
    output:
        weights=protected(f"{COEVOLUTION_DIR}/seed{{seed}}/{{objective}}/model.safetensors"),
        info=protected(f"{COEVOLUTION_DIR}/seed{{seed}}/{{objective}}/model.json"),
        scores=f"{COEVOLUTION_DIR}/seed{{seed}}/{{objective}}/final_scores.json",
    params:
        # checkpoints stay outside the declared outputs so a killed job resumes from its last step-N/
        run_dir=f"{COEVOLUTION_DIR}/runs/seed{{seed}}/{{objective}}",
        overrides=coevolution_study.pretrain_overrides,
    log:
        f"{COEVOLUTION_LOGS}/seed{{seed}}/pretrain_{{objective}}.log",
    benchmark:
        f"{BENCH}/coevolution/seed{{seed}}/pretrain_{{objective}}.tsv"
    wildcard_constraints:
        objective=one_of(COEVOLUTION_OBJECTIVES),  # the study compares these (tmlm when coevolution.tmlm is true)
    threads: 1
    resources:
        mem_mb=per_attempt(4000),
        runtime=per_attempt(30),
    conda:
        "../../envs/pmlm.yaml"
    shell:
        "OMP_NUM_THREADS={threads} python -m pmlm pretrain --config {input.recipe:q} --shards {input.shards:q} "
        "--out {params.run_dir:q} --final {output.weights:q} --scores {output.scores:q} {params.overrides} "
        "> {log:q} 2>&1"


rule evaluate_coevolution:
    input:
        unpack(coevolution_study.encoders),
        synth=f"{COEVOLUTION_DIR}/seed{{seed}}/synth",
    output:
        json=f"{COEVOLUTION_DIR}/seed{{seed}}/results.json",
        tsv=f"{COEVOLUTION_DIR}/seed{{seed}}/results.tsv",
    params:
        prefix=output_prefix,
        args=coevolution_study.evaluate_args,
        tmlm=coevolution_study.tmlm_flag,
    log:
        f"{COEVOLUTION_LOGS}/seed{{seed}}/evaluate_coevolution.log",
    benchmark:
        f"{BENCH}/coevolution/seed{{seed}}/evaluate_coevolution.tsv"
    threads: 1
    resources:
        mem_mb=per_attempt(4000),
        runtime=per_attempt(30),
    conda:
        "../../envs/pmlm.yaml"
    shell:
        "OMP_NUM_THREADS={threads} python -m pmlm coevolution --synth {input.synth:q} --mlm {input.mlm:q} "
        "--pmlm {input.pmlm:q} {params.tmlm} --seed {wildcards.seed} --out-prefix {params.prefix:q} {params.args} "
        "> {log:q} 2>&1"


rule report_coevolution:
    input:
        coevolution_study.results(),
    output:
        multiext(f"{COEVOLUTION_DIR}/coevolution", ".md", ".csv", ".tex"),
        report(
            f"{COEVOLUTION_DIR}/coevolution.html",
            caption="../report/coevolution_table.rst",
            category="Co-evolution",
            labels={"item": "table"},
        ),
        multiext(f"{COEVOLUTION_DIR}/coevolution_supervised", ".md", ".csv", ".tex"),
        report(
            f"{COEVOLUTION_DIR}/coevolution_supervised.html",
            caption="../report/coevolution_supervised.rst",
            category="Co-evolution",
            labels={"item": "table: supervised contact head"},
        ),
        multiext(f"{COEVOLUTION_DIR}/coevolution_exact", ".md", ".csv", ".tex"),
        report(
            f"{COEVOLUTION_DIR}/coevolution_exact.html",
            caption="../report/coevolution_exact.rst",
            category="Co-evolution",
            labels={"item": "table: epistasis against the exact Potts values"},
        ),
        f"{COEVOLUTION_DIR}/coevolution.png",
        report(
            f"{COEVOLUTION_DIR}/coevolution.svg",
            caption="../report/coevolution_figure.rst",
            category="Co-evolution",
            labels={"item": "figure"},
        ),
    params:
        prefix=output_prefix,
    log:
        f"{COEVOLUTION_LOGS}/report_coevolution.log",
    conda:
        "../../envs/pmlm.yaml"
    shell:
        "python -m pmlm coevolution report --results {input:q} --out-prefix {params.prefix:q} > {log:q} 2>&1"


rule coevolution:
    input:
        coevolution_study.targets(),
