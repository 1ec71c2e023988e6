# Named helpers of the planted-coupling study's rules (workflow/rules/coevolution.smk).


COEVOLUTION = config["coevolution"]
COEVOLUTION_DIR = f"{RESULTS}/coevolution"
COEVOLUTION_LOGS = f"{LOGS}/coevolution"


def coevolution_seeds():
    return [int(s) for s in COEVOLUTION["seeds"]]


def coevolution_recipe(wildcards):
    """A relative recipe path is resolved against the workflow directory, as for pre-training."""
    path = COEVOLUTION["recipe"]
    return path if os.path.isabs(path) else os.path.join(workflow.basedir, path)


def coevolution_flags(section):
    """A section of the study's config as flags of its command (its keys are the flags)."""
    return as_flags(COEVOLUTION[section])


def coevolution_synth_args(wildcards):
    return coevolution_flags("synth")


def coevolution_split_args(wildcards):
    return coevolution_flags("split")


def coevolution_shard_args(wildcards):
    return coevolution_flags("shards")


def coevolution_evaluate_args(wildcards):
    # the evaluation re-draws the same held-out sequences, so it gets the split settings too
    return f"{coevolution_flags('split')} {coevolution_flags('evaluate')}"


def coevolution_pretrain_overrides(wildcards):
    sets = [f"objective.name={wildcards.objective}", f"seed={wildcards.seed}"]
    sets += [f"{k}={v}" for k, v in COEVOLUTION["set"].items()]
    return " ".join(f"--set {shlex.quote(s)}" for s in sets)


# the objectives the study can compare (rule pretrain_coevolution's objective wildcard); coevolution_objectives picks
COEVOLUTION_OBJECTIVES = (MLM, PMLM, TMLM)


def coevolution_objectives():
    """The encoders trained per seed: MLM and PMLM, and the Triple MLM when coevolution.tmlm is true."""
    return [MLM, PMLM] + ([TMLM] if COEVOLUTION["tmlm"] else [])


def coevolution_encoders(wildcards):
    return {name: f"{COEVOLUTION_DIR}/seed{wildcards.seed}/{name}/model.safetensors"
            for name in coevolution_objectives()}


def coevolution_tmlm_flag(wildcards):
    if TMLM not in coevolution_objectives():
        return ""
    return f"--tmlm {shlex.quote(coevolution_encoders(wildcards)[TMLM])}"


def coevolution_results():
    return [f"{COEVOLUTION_DIR}/seed{s}/results.json" for s in coevolution_seeds()]


def coevolution_targets():
    if not COEVOLUTION:
        return []
    return [f"{COEVOLUTION_DIR}/coevolution.html", f"{COEVOLUTION_DIR}/coevolution_exact.html",
            f"{COEVOLUTION_DIR}/coevolution.svg"]
