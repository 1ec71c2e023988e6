# Named helpers shared by the rules: paths, per-dataset settings, input functions. The Snakefile has
# validated the config and filled every default the schema gives, so they read keys without defaults.
import json
import os
import re
import shlex
from urllib.parse import urlparse

from snakemake import __version__ as SNAKEMAKE_VERSION

from pmlm.train import METRICS_CSV
from pmlm.vocabulary import (
    CONTACT_TABLE_KINDS,
    MLM,
    PMLM,
    PMLM_PAIR_ONLY,
    RESULT_TABLES,
    TABLE_PRECISION_BY_SEPARATION,
    TABLE_PRETRAIN_SCORES,
    TABLE_TASK,
    TABLE_UNSUPERVISED_CONTACT,
    TMLM,
)
from workflow_config import is_transformers_release, readout_run, release_source

RUN = config["run"]
# encoders given by a released checkpoint (pretrain.models entries with release:) instead of a pre-training run
RELEASED = [m for m in config["pretrain"]["models"] if m.get("release")]
# a release's checkpoint is downloaded like any source (fetch_source: resumable, checksummed)
SOURCES = {**config["sources"], **{release_source(m): {"url": m["release"]["url"], "sha256": m["release"]["sha256"]}
                                   for m in RELEASED if not is_transformers_release(m)}}
DATASETS = config["datasets"]
TASK_DATA = config["task_data"]
# task data that split-structures derives (the others are files named in the config)
DERIVED_TASK_DATA = [name for name, spec in TASK_DATA.items() if spec.get("split") and not spec.get("table")]
# labelled tables of one's own task, split by split-table (by their split column or by identity)
TABLE_TASK_DATA = [name for name, spec in TASK_DATA.items() if spec.get("table")]
OBJECTIVE_LABEL = {MLM: "MLM", PMLM: "PMLM", PMLM_PAIR_ONLY: "PMLM-pair", TMLM: "TMLM"}
PAIR_OBJECTIVES = [o for o in OBJECTIVE_LABEL if o != MLM]  # the objectives with a pair head
RESULTS = f"results/{RUN}"
LOGS = f"logs/{RUN}"
BENCH = f"benchmarks/{RUN}"

# Rules call `python -m pmlm` from this checkout, whichever environment (venv or --sdm conda) runs them. A prefix of
# our own replaces Snakemake's `set -euo pipefail; `, which is therefore repeated: without pipefail a training rule's
# `... | tee` would end with tee's 0, whatever the trainers' exit.
shell.prefix(f"set -euo pipefail; export PYTHONPATH={shlex.quote(workflow.basedir)}${{{{PYTHONPATH:+:$PYTHONPATH}}}}; ")


def one_of(names):
    """A wildcard pattern matching exactly these names (never matching when there are none)."""
    return "|".join(map(re.escape, names)) if names else "NONE"


wildcard_constraints:
    source=one_of(SOURCES),
    # encoders' folders: a configured dataset, or the name a release gives (rule pretrain reads configured ones only)
    dataset=one_of(list(dict.fromkeys([*DATASETS, *(m["dataset"] for m in RELEASED)]))),
    taskdata=one_of(DERIVED_TASK_DATA),
    tabledata=one_of(TABLE_TASK_DATA),
    split="train|valid",
    objective=one_of(OBJECTIVE_LABEL),
    preset=r"[A-Za-z0-9_]+",
    seed=r"\d+",
    # a fine-tuning run (finetune.runs) and an unsupervised read-out of the pair head (finetune.unsupervised.readouts):
    # two wildcards, so that no rule or input function tells them apart by the name's spelling
    ft=one_of(config["finetune"]["runs"]),
    readout=one_of(config["finetune"]["unsupervised"]["readouts"]),


def table_prefix(name):
    """A table's path without its extension: the table writers add .md, .csv, .tex and .html."""
    return f"{RESULTS}/tables/{name}"


def output_dir(wildcards, output):
    """The directory of a rule's first output (commands that write several files into one place)."""
    return os.path.dirname(output[0])


def output_prefix(wildcards, output):
    """The first output without its extension (commands that write PREFIX.md, PREFIX.csv, ...)."""
    return os.path.splitext(output[0])[0]


# Params are canonical: a rule's params are built from the config with every mapping in sorted key order, so that
# the same settings written in another order give the same params and rerun nothing (YAML mappings have no order;
# lists keep theirs). tests/test_workflow_config.py plans the demo with every mapping's keys reversed.


def canonical(value):
    """``value`` with the keys of its mappings, at any depth, in sorted order."""
    if isinstance(value, dict):
        return {key: canonical(value[key]) for key in sorted(value)}
    if isinstance(value, list):
        return [canonical(v) for v in value]
    return value


def as_flags(settings):
    """``key: value`` pairs as ``--key value`` flags, in the order given (underscores become dashes; lists give
    several values); a config section goes through ``canonical`` first."""
    flags = []
    for key, value in settings.items():
        values = value if isinstance(value, list) else [value]
        flags.append(f"--{key.replace('_', '-')} " + " ".join(shlex.quote(str(v)) for v in values))
    return " ".join(flags)


def as_sets(settings):
    """``key: value`` pairs as ``--set key=value`` options in sorted key order (booleans as YAML's true / false)."""
    pairs = canonical(settings).items()
    return " ".join(f"--set {shlex.quote(f'{k}={str(v).lower() if isinstance(v, bool) else v}')}" for k, v in pairs)


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


def fetch_url(wildcards):
    return source_url(wildcards.source)


def downloaded_archive(wildcards):
    return downloaded(wildcards.source)


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
    if src.get("checksums_from"):
        args += ["--checksums-from", shlex.quote(src["checksums_from"])]
    return " ".join(args)


def dataset_setting(dataset, section):
    """Global section (e.g. cluster:) overlaid with the dataset's own keys."""
    merged = dict(config.get(section) or {})
    merged.update(DATASETS[dataset].get(section) or {})
    return merged


def dataset_sources(wildcards):
    return [source_file(s) for s in DATASETS[wildcards.dataset]["sources"]]


def decontamination_sources(wildcards):
    return [source_file(s) for s in DATASETS[wildcards.dataset]["decontaminate"]]


def decontamination_args(wildcards, input):
    return ("--decontaminate " + " ".join(map(shlex.quote, input.references))) if input.references else ""


def ingest_formats(wildcards):
    """One --format per input, in the order of dataset_sources (auto: detected by content)."""
    return ",".join(SOURCES[s].get("format") or "auto" for s in DATASETS[wildcards.dataset]["sources"])


def ingest_args(wildcards):
    return as_sets(dataset_setting(wildcards.dataset, "ingest"))


def split_args(wildcards):
    """`pmlm split` flags from the cluster settings (their keys are its flags)."""
    return as_flags(canonical(dataset_setting(wildcards.dataset, "cluster")))


def shard_setting(dataset, key):
    return dataset_setting(dataset, "shards")[key]


def tokenize_args(wildcards):
    """`pmlm tokenize` flags from the shard layout (its keys are the flags)."""
    return as_flags(canonical(dataset_setting(wildcards.dataset, "shards")))


def shards_dir(dataset):
    return f"{RESULTS}/data/{dataset}/shards"


def dataset_shards(wildcards):
    return shards_dir(wildcards.dataset)


def data_targets():
    return [shards_dir(d) for d in DATASETS]


# --- pre-training -------------------------------------------------------------------------------

PRETRAIN = config["pretrain"]
PRETRAIN_MODELS = PRETRAIN["models"]


# Every folder of an encoder or a run is named by one helper below. A rule's paths call the same helper with the
# wildcards' names (ENCODER_WILDCARDS, "{ft}"), which gives the rule's pattern; the input functions call it with a
# configured encoder's values.
ENCODER_WILDCARDS = ("{dataset}", "{objective}", "{preset}")


def encoder_path(dataset, objective, preset):
    """DATASET/OBJECTIVE-PRESET: the encoder's part of its folders' paths (and its id in the config)."""
    return f"{dataset}/{objective}-{preset}"


def encoder_parts(m):
    """(dataset, objective, preset) of a pretrain.models entry, the arguments of the path helpers."""
    return m["dataset"], m["objective"], m["preset"]


def encoder_dir(encoder):
    """The folder of encoder ``encoder`` (encoder_path, or a rule's {release}): weights, model.json, scores."""
    return f"{RESULTS}/pretrain/{encoder}"


def model_dir(dataset, objective, preset):
    return encoder_dir(encoder_path(dataset, objective, preset))


def pretrain_run_dir(dataset, objective, preset):
    """A pre-training run's folder: checkpoints, metrics.csv, tb/, train.log; a killed or requeued job resumes here."""
    return f"{RESULTS}/pretrain_runs/{encoder_path(dataset, objective, preset)}"


def finetune_dir(dataset, objective, preset, ft):
    """The folder of fine-tuning run ``ft``'s head on an encoder: head.safetensors, head.json."""
    return f"{RESULTS}/finetune/{encoder_path(dataset, objective, preset)}/{ft}"


def finetune_run_dir(dataset, objective, preset, ft):
    """A fine-tuning run's folder: checkpoints, metrics.csv, train.log."""
    return f"{RESULTS}/finetune_runs/{encoder_path(dataset, objective, preset)}/{ft}"


def evaluation_path(dataset, objective, preset, name):
    """The evaluation TSV of run or read-out ``name`` (readout_run) on an encoder."""
    return f"{RESULTS}/evaluation/{encoder_path(dataset, objective, preset)}/{name}.tsv"


def contact_map_prefix(dataset, objective, preset, name):
    """The contact-map figure of run or read-out ``name`` on an encoder, without its extension (.png, .svg)."""
    return f"{RESULTS}/figures/contact_maps/{encoder_path(dataset, objective, preset)}/{name}"


def pretrained_weights(m):
    return f"{model_dir(*encoder_parts(m))}/model.safetensors"


def recipe_file(wildcards):
    """Recipes ship with the workflow: a relative path is resolved against the workflow directory."""
    path = PRETRAIN["recipes"][wildcards.preset]
    return path if os.path.isabs(path) else os.path.join(workflow.basedir, path)


def pretrain_overrides(wildcards):
    return f"--set objective.name={wildcards.objective} {as_sets(PRETRAIN['set'])}".rstrip()


def pretrain_launcher(wildcards, resources):
    """`pmlm launch` with the job's GPUs per node: one trainer per GPU on every node of the job (torchrun),
    through its own srun step in a SLURM batch job, or the trainer itself for one GPU; in a batch job it
    requeues the job in place when the trainers saved after a stop signal (docs/slurm.md). GPUs per node come
    from `gres: gpu[:type]:N` (a per-node count) or else from `gpu` (the job's total) over `nodes`."""
    nodes = max(1, int(resources.get("nodes", 1) or 1))
    per_node = re.fullmatch(r"gpu(?::[^:]+)?:(\d+)", str(resources.get("gres", "") or ""))
    return launcher(int(per_node.group(1)) if per_node else -(-int(resources.get("gpu", 0) or 0) // nodes), resources)


def finetune_launcher(wildcards, resources):
    """As for pre-training, with one trainer: fine-tuning runs in one process."""
    return launcher(1, resources)


def launcher(gpus_per_node, resources):
    """The `pmlm launch ... --` prefix. The site profile's `launch_env` resource ("NAME=VALUE NAME=VALUE", e.g.
    NCCL_SOCKET_IFNAME=ib0) becomes `--env` options: set for the trainers on every node."""
    per_node_flag = f" --gpus-per-node {gpus_per_node}" if gpus_per_node > 0 else ""
    env = "".join(f" --env {shlex.quote(item)}" for item in str(resources.get("launch_env", "") or "").split())
    return f"python -m pmlm launch{per_node_flag}{env} --"


def pretrained_targets():
    return [pretrained_weights(m) for m in PRETRAIN_MODELS]


def trained_models():
    """The encoders this workflow pre-trains (not released checkpoints)."""
    return [m for m in PRETRAIN_MODELS if not m.get("release")]


def release_of(wildcards):
    """The released encoder ``wildcards.release`` (DATASET/OBJECTIVE-PRESET) names."""
    return next(m for m in RELEASED if encoder_id(m) == wildcards.release)


def released_checkpoint(wildcards):
    return downloaded(release_source(release_of(wildcards)))


def checkpoint_releases():
    """The releases given as a checkpoint of the released code (downloaded, then imported by import_release)."""
    return [m for m in RELEASED if not is_transformers_release(m)]


def transformers_releases():
    """The releases given as a transformers model, a folder or a hub id (imported by import_huggingface)."""
    return [m for m in RELEASED if is_transformers_release(m)]


def transformers_model(wildcards):
    """The folder (made absolute: the rule runs pmlm from the working directory) or hub id of a transformers release."""
    name = release_of(wildcards)["release"]["huggingface"]
    return os.path.abspath(name) if os.path.isdir(name) else name


def transformers_inputs(wildcards):
    """A local folder's config.json, so a missing folder stops the DAG at once (a hub id has no input file)."""
    model = transformers_model(wildcards)
    return [os.path.join(model, "config.json")] if os.path.isdir(model) else []


def transformers_revision(wildcards):
    revision = release_of(wildcards)["release"].get("revision")
    return f"--revision {shlex.quote(revision)}" if revision else ""


def release_objective(wildcards):
    """The objective the entry says its release was trained with; `pmlm import` checks the file agrees."""
    return release_of(wildcards)["objective"]


def pretrain_table_args(wildcards, input):
    models = []
    for m, weights in zip(PRETRAIN_MODELS, input.weights):
        label = f"{OBJECTIVE_LABEL[m['objective']]}-{m['preset']}"
        spec = f"{label}:{m['dataset']}:{weights}"
        models.append(f"--model {shlex.quote(spec)}")
    return " ".join(models)


def kl_models():
    return [m for m in PRETRAIN_MODELS if m["objective"] in PAIR_OBJECTIVES]


def kl_datasets():
    """The validation sets of the KL figure: the configured ones, else those the PMLM encoders were trained on."""
    # a release's dataset names no validation set of this config
    return PRETRAIN["kl"]["datasets"] or list(dict.fromkeys(m["dataset"] for m in kl_models() if m["dataset"] in DATASETS))


def kl_args(wildcards, input):
    """Every PMLM encoder on every validation set (one panel per set), and the sampling settings."""
    args = [f"--model {shlex.quote(f'{encoder_label(m)}={pretrained_weights(m)}')}" for m in kl_models()]
    args += [f"--valid {shlex.quote(f'{d}={shards_dir(d)}')}" for d in kl_datasets()]
    args.append(as_flags(canonical({k: v for k, v in PRETRAIN["kl"].items() if k != "datasets"})))
    return " ".join(args)


def pretraining_targets():
    if not PRETRAIN_MODELS:
        return []
    targets = pretrained_targets() + [f"{table_prefix(TABLE_PRETRAIN_SCORES)}.html"]
    if kl_models() and kl_datasets():
        targets.append(f"{RESULTS}/figures/kl_histogram.svg")
    return targets


# --- fine-tuning and evaluation -----------------------------------------------------------------

FINETUNE = config["finetune"]
FINETUNE_RUNS = FINETUNE["runs"]
UNSUPERVISED = FINETUNE["unsupervised"]


def encoder_id(m):
    return encoder_path(*encoder_parts(m))


def encoder_label(m):
    return f"{OBJECTIVE_LABEL[m['objective']]}-{m['preset']}@{m['dataset']}"


def model_label(wildcards):
    """The label of the table rows: OBJECTIVE-preset@dataset."""
    return encoder_label(model_of(wildcards))


def model_of(wildcards):
    for m in PRETRAIN_MODELS:
        if (m["dataset"], m["objective"], m["preset"]) == (wildcards.dataset, wildcards.objective, wildcards.preset):
            return m
    raise ValueError(f"no pre-trained model {wildcards.dataset}/{wildcards.objective}-{wildcards.preset}")


def task_file(data, split):
    """A split of a task dataset: derived by split-structures, or a file (archive member / local path) from config."""
    spec = TASK_DATA[data]
    if spec.get("table"):
        return f"{RESULTS}/tasks/{data}/{split}.parquet"
    if spec.get("split"):
        return f"{RESULTS}/tasks/{data}/{split}.jsonl"
    entry = spec["files"][split]
    if entry.get("path"):
        return entry["path"]
    return f"resources/sources/{entry['source']}/members/{entry['member']}"


def runs_for(m):
    """Fine-tuning runs that apply to encoder ``m`` (all, unless a run lists its encoders)."""
    return [name for name, run in canonical(FINETUNE_RUNS).items() if not run["encoders"] or encoder_id(m) in run["encoders"]]


def structure_source(wildcards):
    return source_file(TASK_DATA[wildcards.taskdata]["source"])


def table_source(wildcards):
    return source_file(TASK_DATA[wildcards.tabledata]["source"])


def table_split_args(wildcards):
    """`pmlm split-table` flags: the table's sequence and split columns, else its split: settings."""
    spec = canonical(TASK_DATA[wildcards.tabledata])
    flags = {"sequence_column": spec["table"]["sequence_column"]}
    if spec["table"]["split_column"]:
        flags["split_column"] = spec["table"]["split_column"]
    else:
        flags.update(spec.get("split") or {})
    return as_flags(flags)


def structure_split_args(wildcards):
    """`pmlm split-structures` flags from the task data's split: settings (their keys are its flags)."""
    return as_flags(canonical(TASK_DATA[wildcards.taskdata]["split"]))


def finetune_recipe(wildcards):
    path = FINETUNE["recipes"][FINETUNE_RUNS[wildcards.ft]["recipe"]]
    return path if os.path.isabs(path) else os.path.join(workflow.basedir, path)


def finetune_inputs(wildcards):
    run = FINETUNE_RUNS[wildcards.ft]
    return {
        "encoder": pretrained_weights(model_of(wildcards)),
        "train": task_file(run["data"], "train"),
        "valid": task_file(run["data"], "valid"),
        "recipe": finetune_recipe(wildcards),
    }


def run_features(m, ft):
    """M, M+ or auto: the features run ``ft`` gives encoder ``m`` (config finetune.runs.<ft>.features)."""
    spec = FINETUNE_RUNS[ft]["features"]
    return spec.get(encoder_id(m), "auto") if isinstance(spec, dict) else spec


def finetune_overrides(wildcards):
    sets = dict(FINETUNE["set"])
    features = run_features(model_of(wildcards), wildcards.ft)
    if features != "auto":  # auto: the recipe's own head.features
        sets["head.features"] = features
    table = TASK_DATA[FINETUNE_RUNS[wildcards.ft]["data"]].get("table")
    if table:  # a labelled table: the columns the recipe reads
        sets.update({f"data.{k}": v for k, v in table.items() if k != "split_column"})
    return as_sets(sets)


def test_inputs(data, tests):
    return {label: task_file(data, split) for label, split in tests.items()}


def evaluate_inputs(wildcards):
    run = FINETUNE_RUNS[wildcards.ft]
    return {"head": finetuned_head(model_of(wildcards), wildcards.ft),
            **{f"test_{k}": v for k, v in test_inputs(run["data"], run["tests"]).items()}}


def unsupervised_inputs(wildcards):
    return {"encoder": pretrained_weights(model_of(wildcards)),
            **{f"test_{k}": v for k, v in test_inputs(UNSUPERVISED["data"], UNSUPERVISED["tests"]).items()}}


def test_args(wildcards, input):
    """--test LABEL=PATH for every named input test_<LABEL>."""
    prefix = "test_"
    args = []
    for key, path in input.items():
        if key.startswith(prefix):
            spec = f"{key[len(prefix):]}={path}"
            args.append(f"--test {shlex.quote(spec)}")
    return " ".join(args)


def finetuned_head(m, ft):
    return f"{finetune_dir(*encoder_parts(m), ft)}/head.safetensors"


def evaluation_tsv(m, name):
    return evaluation_path(*encoder_parts(m), name)


def evaluation_results():
    """(table kind, TSV) for every evaluation the config asks for."""
    out = []
    for m in PRETRAIN_MODELS:
        for ft in runs_for(m):
            if FINETUNE_RUNS[ft]["table"] != TABLE_TASK:  # a table of its own: task_table_runs
                out.append((FINETUNE_RUNS[ft]["table"], evaluation_tsv(m, ft)))
        if m["objective"] in PAIR_OBJECTIVES:
            for readout in UNSUPERVISED["readouts"]:
                out.append((TABLE_UNSUPERVISED_CONTACT, evaluation_tsv(m, readout_run(readout))))
    return out


def table_args(wildcards, input):
    return " ".join(f"--result {shlex.quote(f'{kind}={path}')}" for (kind, _), path in zip(evaluation_results(), input))


def downstream_tables():
    """Every file `pmlm tables results` writes: each of its tables as Markdown, CSV and LaTeX."""
    return [f"{table_prefix(t)}.{ext}" for t in RESULT_TABLES for ext in ("md", "csv", "tex")]


def downstream_targets():
    targets = [f"{table_prefix(run)}.html" for run in task_table_runs()]
    if not evaluation_results():
        return targets
    return [f"{table_prefix(t)}.html" for t in RESULT_TABLES] + targets


def task_table_runs():
    """The runs with a table of their own (table: task), fine-tuned on at least one encoder."""
    return [ft for ft in FINETUNE_RUNS if FINETUNE_RUNS[ft]["table"] == TABLE_TASK and task_table_tsvs(ft)]


def task_table_tsvs(ft):
    return [evaluation_tsv(m, ft) for m in PRETRAIN_MODELS if ft in runs_for(m)]


def task_table_inputs(wildcards):
    return task_table_tsvs(wildcards.taskrun)


def task_table_args(wildcards, input):
    return " ".join(f"--result {shlex.quote(path)}" for path in input)


# --- the report's figures and pages -------------------------------------------------------------

REPORT = config["report"]
CONTACT_MAPS = REPORT["contact_maps"]
REPORT_DIR = f"{RESULTS}/report"


def finetuned_runs():
    """(encoder, run) for every fine-tuning the config asks for."""
    return [(m, ft) for m in PRETRAIN_MODELS for ft in runs_for(m)]


def pretrain_metrics_path(dataset, objective, preset):
    """A finished pre-training run's metrics log, beside its weights (the trainer copies it from the run folder)."""
    return f"{model_dir(dataset, objective, preset)}/{METRICS_CSV}"


def finetune_metrics_path(dataset, objective, preset, ft):
    """A finished fine-tuning run's metrics log, beside its head."""
    return f"{finetune_dir(dataset, objective, preset, ft)}/{METRICS_CSV}"


def pretrain_metrics(m):
    """The metrics log of encoder ``m``'s pre-training run (an output of rule pretrain)."""
    return pretrain_metrics_path(*encoder_parts(m))


def finetune_metrics(m, ft):
    """The metrics log of fine-tuning run ``ft`` on encoder ``m`` (an output of rule finetune)."""
    return finetune_metrics_path(*encoder_parts(m), ft)


def pretrain_curve_args(wildcards, input):
    """--run LABEL=metrics.csv for every pre-training run, in the order of the rule's input."""
    runs = [f"{encoder_label(m)}={path}" for m, path in zip(trained_models(), input.metrics)]
    return " ".join(f"--run {shlex.quote(r)}" for r in runs)


def finetune_curve_args(wildcards, input):
    """--run 'LABEL RUN=metrics.csv' for every fine-tuning run, in the order of the rule's input."""
    runs = [f"{encoder_label(m)} {ft}={path}" for (m, ft), path in zip(finetuned_runs(), input.metrics)]
    return " ".join(f"--run {shlex.quote(r)}" for r in runs)


def contact_map_figures(m):
    """The contact maps of encoder ``m`` to draw: its contact runs' (rule plot_contact_maps) and, with a pair head,
    its read-outs' (rule plot_readout_contact_maps); those report.contact_maps.runs names, else all."""
    names = [ft for ft in runs_for(m) if FINETUNE_RUNS[ft]["table"] in CONTACT_TABLE_KINDS]
    if m["objective"] in PAIR_OBJECTIVES:
        names += [readout_run(r) for r in UNSUPERVISED["readouts"]]
    wanted = CONTACT_MAPS.get("runs")
    return [f"{contact_map_prefix(*encoder_parts(m), n)}.svg" for n in names if wanted is None or n in wanted]


def first_test(data, tests):
    """The first test set of a run or of the read-outs: the chains a contact map draws."""
    return next(iter(test_inputs(data, tests).values()))


def contact_map_inputs(wildcards):
    """A contact run's head and its first test set."""
    run = FINETUNE_RUNS[wildcards.ft]
    return {"head": finetuned_head(model_of(wildcards), wildcards.ft), "test": first_test(run["data"], run["tests"])}


def readout_map_inputs(wildcards):
    """The encoder whose pair head is read out and the read-outs' first test set."""
    return {
        "encoder": pretrained_weights(model_of(wildcards)),
        "test": first_test(UNSUPERVISED["data"], UNSUPERVISED["tests"]),
    }


def contact_results():
    """(table kind, TSV) of the evaluations that score contacts."""
    kinds = (*CONTACT_TABLE_KINDS, TABLE_UNSUPERVISED_CONTACT)
    return [(kind, tsv) for kind, tsv in evaluation_results() if kind in kinds]


def separation_args(wildcards, input):
    return " ".join(f"--result {shlex.quote(f'{kind}={path}')}" for (kind, _), path in zip(contact_results(), input))


def run_config_json(wildcards):
    """The effective configuration (files, profile and --config merged; schema defaults filled in)."""
    return json.dumps(config, sort_keys=True, default=str)


def report_targets():
    targets = [f"{REPORT_DIR}/run_info.html"]
    if trained_models():
        targets.append(f"{RESULTS}/figures/pretrain_curves.svg")
    if finetuned_runs():
        targets.append(f"{RESULTS}/figures/finetune_curves.svg")
    if contact_results():
        targets.append(f"{RESULTS}/figures/precision_by_separation.svg")
    targets += [figure for m in PRETRAIN_MODELS for figure in contact_map_figures(m)]
    return targets
