# Named helpers shared by the rules: paths, per-dataset settings, input functions.
import os
import re
import shlex
from urllib.parse import urlparse

RUN = config.get("run", "demo")
SOURCES = config["sources"]
DATASETS = config["datasets"]
RESULTS = f"results/{RUN}"
LOGS = f"logs/{RUN}"
BENCH = f"benchmarks/{RUN}"

# Rules call `python -m pmlm` from this checkout, whichever environment (venv or --sdm conda) runs them.
shell.prefix(f"export PYTHONPATH={shlex.quote(workflow.basedir)}${{{{PYTHONPATH:+:$PYTHONPATH}}}}; ")


wildcard_constraints:
    source="|".join(map(re.escape, SOURCES)) if SOURCES else "NONE",
    dataset="|".join(map(re.escape, DATASETS)) if DATASETS else "NONE",
    split="train|valid",


def source_url(name):
    """A relative file: URL names a file of this repository (the demo data)."""
    url = SOURCES[name]["url"]
    parsed = urlparse(url)
    if parsed.scheme == "file" and not url.startswith("file://"):
        return "file://" + os.path.abspath(os.path.join(workflow.basedir, parsed.path))
    return url


def source_filename(name):
    return os.path.basename(urlparse(SOURCES[name]["url"]).path) or f"{name}.download"


def downloaded(name):
    return f"resources/sources/{name}/{source_filename(name)}"


def source_file(name):
    """The file a dataset reads: the download itself, or the configured member of a tar archive."""
    member = SOURCES[name].get("member")
    if member:
        return f"resources/sources/{name}/members/{member}"
    return downloaded(name)


def checksum_args(wildcards):
    src = SOURCES[wildcards.source]
    args = []
    for algo in ("md5", "sha256"):
        if src.get(algo):
            args += [f"--{algo}", src[algo]]
    return " ".join(args)


def dataset_setting(dataset, section):
    """Global section (e.g. cluster:) overlaid with the dataset's own keys."""
    merged = dict(config.get(section) or {})
    merged.update(DATASETS[dataset].get(section) or {})
    return merged


def dataset_sources(wildcards):
    return [source_file(s) for s in DATASETS[wildcards.dataset]["sources"]]


def decontamination_sources(wildcards):
    return [source_file(s) for s in DATASETS[wildcards.dataset].get("decontaminate") or []]


def ingest_args(wildcards):
    policy = dataset_setting(wildcards.dataset, "ingest")
    return " ".join(f"--set {shlex.quote(f'{k}={str(v).lower() if isinstance(v, bool) else v}')}" for k, v in policy.items())


def split_args(wildcards):
    c = dataset_setting(wildcards.dataset, "cluster")
    flags = {
        "method": "--method", "min_seq_id": "--min-seq-id", "coverage": "--coverage", "cov_mode": "--cov-mode",
        "valid_fraction": "--valid-fraction", "seed": "--seed",
        "decontam_min_seq_id": "--decontam-min-seq-id", "decontam_coverage": "--decontam-coverage",
    }
    return " ".join(f"{flags[k]} {shlex.quote(str(v))}" for k, v in c.items())


def shard_setting(dataset, key, default):
    return dataset_setting(dataset, "shards").get(key, default)


def shards_dir(dataset):
    return f"{RESULTS}/data/{dataset}/shards"


def data_targets():
    return [shards_dir(d) for d in DATASETS]


# --- pre-training -------------------------------------------------------------------------------

PRETRAIN = config.get("pretrain") or {}
PRETRAIN_MODELS = PRETRAIN.get("models") or []
OBJECTIVE_LABEL = {"mlm": "MLM", "pmlm": "PMLM", "pmlm_pair_only": "PMLM-pair"}


def model_dir(dataset, objective, preset):
    return f"{RESULTS}/pretrain/{dataset}/{objective}-{preset}"


def pretrained_weights(m):
    return f"{model_dir(m['dataset'], m['objective'], m['preset'])}/model.safetensors"


def recipe_file(wildcards):
    """Recipes ship with the workflow: a relative path is resolved against the workflow directory."""
    path = PRETRAIN["recipes"][wildcards.preset]
    return path if os.path.isabs(path) else os.path.join(workflow.basedir, path)


def pretrain_overrides(wildcards):
    sets = [f"objective.name={wildcards.objective}"]
    sets += [f"{k}={v}" for k, v in (PRETRAIN.get("set") or {}).items()]
    return " ".join(f"--set {shlex.quote(s)}" for s in sets)


def pretrain_launcher(wildcards, resources):
    """One process per GPU through torchrun when a job holds several GPUs; a plain process otherwise."""
    gpus = int(resources.get("gpu", 0) or 0)
    if gpus > 1:
        return f"python -m torch.distributed.run --standalone --nproc_per_node {gpus}"
    return "python"


def pretrained_targets():
    return [pretrained_weights(m) for m in PRETRAIN_MODELS]


def pretrain_table_args(wildcards, input):
    models = []
    for m, weights in zip(PRETRAIN_MODELS, input.weights):
        label = f"{OBJECTIVE_LABEL[m['objective']]}-{m['preset']}"
        spec = f"{label}:{m['dataset']}:{weights}"
        models.append(f"--model {shlex.quote(spec)}")
    return " ".join(models)


def kl_models():
    return [m for m in PRETRAIN_MODELS if m["objective"] != "mlm"]


def kl_args(wildcards, input):
    args = []
    for m in kl_models():
        name = f"{OBJECTIVE_LABEL[m['objective']]}-{m['preset']}/{m['dataset']}"
        weights, shards = f"{name}={pretrained_weights(m)}", f"{name}={shards_dir(m['dataset'])}"
        args.append(f"--model {shlex.quote(weights)} --shards {shlex.quote(shards)}")
    kl = PRETRAIN.get("kl") or {}
    for key in ("sequences", "pairs", "seed"):
        if key in kl:
            args.append(f"--{key} {kl[key]}")
    return " ".join(args)


def pretraining_targets():
    if not PRETRAIN_MODELS:
        return []
    targets = pretrained_targets() + [f"{RESULTS}/tables/pretrain_scores.md"]
    if kl_models():
        targets.append(f"{RESULTS}/figures/kl_histogram.png")
    return targets
