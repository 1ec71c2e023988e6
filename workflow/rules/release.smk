# Released encoders: a pretrain.models entry with release: is imported into the encoder folder a pre-training run
# would write; downstream it is one more encoder. A checkpoint of the released code (release.url) is downloaded by
# fetch_source (pmlm fetch: resumable, checksummed) and imported by import_release; a transformers model
# (release.huggingface: a folder or a hub id, e.g. ESM-2) is imported by import_huggingface.


# where a released entry and a pre-training run could name the same folder, the release writes it
ruleorder: import_release > pretrain
ruleorder: import_huggingface > pretrain


rule import_release:
    input:
        encoders.released_checkpoint,
    output:
        weights=protected(f"{paths.encoder_dir('{release}')}/model.safetensors"),
        info=protected(f"{paths.encoder_dir('{release}')}/model.json"),
    params:
        out_dir=output_dir,
        objective=encoders.release_objective,
    log:
        f"{LOGS}/import/{{release}}.log",
    benchmark:
        f"{BENCH}/import/{{release}}.tsv"
    wildcard_constraints:
        release=one_of([encoder_id(m) for m in encoders.checkpoint_releases()]),
    resources:
        mem_mb=rule_resources.import_mem_mb,
        runtime=per_attempt(60),
    conda:
        "../../envs/pmlm.yaml"
    shell:
        "python -m pmlm import {input:q} -o {params.out_dir:q} --objective {params.objective} 2> {log:q}"


rule import_huggingface:
    input:
        encoders.transformers_inputs,
    output:
        weights=protected(f"{paths.encoder_dir('{release}')}/model.safetensors"),
        info=protected(f"{paths.encoder_dir('{release}')}/model.json"),
    params:
        model=encoders.transformers_model,
        revision=encoders.transformers_revision,
        out_dir=output_dir,
        objective=encoders.release_objective,
    log:
        f"{LOGS}/import/{{release}}.log",
    benchmark:
        f"{BENCH}/import/{{release}}.tsv"
    wildcard_constraints:
        release=one_of([encoder_id(m) for m in encoders.transformers_releases()]),
    resources:
        mem_mb=rule_resources.import_mem_mb,
        runtime=per_attempt(60),
    conda:
        "../../envs/pmlm.yaml"
    shell:
        "python -m pmlm import {params.model:q} -o {params.out_dir:q} --objective {params.objective} {params.revision} "
        "2> {log:q}"
