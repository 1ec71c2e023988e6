# Released encoders: a pretrain.models entry with release: is downloaded by fetch_source (pmlm fetch: resumable,
# checksummed) and imported into the encoder folder a pre-training run would write; downstream it is one more encoder.


# where a released entry and a pre-training run could name the same folder, the release writes it
ruleorder: import_release > pretrain


rule import_release:
    input:
        released_checkpoint,
    output:
        weights=protected(f"{RESULTS}/pretrain/{{release}}/model.safetensors"),
        info=protected(f"{RESULTS}/pretrain/{{release}}/model.json"),
    params:
        out_dir=output_dir,
        objective=release_objective,
    log:
        f"{LOGS}/import/{{release}}.log",
    benchmark:
        f"{BENCH}/import/{{release}}.tsv"
    wildcard_constraints:
        release=one_of([encoder_id(m) for m in RELEASED]),
    resources:
        mem_mb=import_mem_mb,
        runtime=per_attempt(60),
    conda:
        "../../envs/pmlm.yaml"
    shell:
        "python -m pmlm import {input:q} -o {params.out_dir:q} --objective {params.objective} 2> {log:q}"
