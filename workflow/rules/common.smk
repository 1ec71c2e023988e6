# The rules' named helpers, bound once to the config: the modules of workflow/lib (unit-tested in
# tests/test_workflow_lib.py). The Snakefile has validated the config and filled every default the schema gives, so
# they read keys without defaults. Rules name a helper by its object: `encoders.recipe_file`, `runs.finetune_inputs`.
import shlex

from snakemake import __version__ as SNAKEMAKE_VERSION

from encoders import OBJECTIVE_LABEL, PAIR_OBJECTIVES, Encoders, encoder_id
from flags import named_output_prefix, one_of, output_dir, output_prefix, result_args, test_args
from paths import ENCODER_WILDCARDS, Paths
from proteingym_inputs import ProteinGym
from report_inputs import Report
from resources import (
    RuleResources,
    finetune_launcher,
    ingest_mem_mb,
    ingest_runtime,
    per_attempt,
    pretrain_launcher,
    split_mem_mb,
    split_runtime,
    tokenize_runtime,
)
from runs import Runs, TaskData
from sources import Datasets, Sources
from workflow_config import readout_run

from pmlm.vocabulary import RESULT_TABLES, TABLE_PRECISION_BY_SEPARATION, TABLE_PRETRAIN_SCORES

paths = Paths(config["run"])
sources = Sources(config, workflow.basedir)
datasets = Datasets(config, sources, paths)
encoders = Encoders(config, paths, sources, workflow.basedir)
task_data = TaskData(config, paths, sources)
runs = Runs(config, paths, encoders, task_data, workflow.basedir)
report_inputs = Report(config, paths, encoders, task_data, runs)
proteingym = ProteinGym(config, paths, sources, encoders, checkpoints)
rule_resources = RuleResources(datasets, encoders)

RESULTS, LOGS, BENCH = paths.results, paths.logs, paths.bench
pretrained_weights = encoders.pretrained_weights  # workflow/rules/common_inference.smk binds its helpers to it

# Rules call `python -m pmlm` from this checkout, whichever environment (venv or --sdm conda) runs them. A prefix of
# our own replaces Snakemake's `set -euo pipefail; `, which is therefore repeated: without pipefail a training rule's
# `... | tee` would end with tee's 0, whatever the trainers' exit.
shell.prefix(f"set -euo pipefail; export PYTHONPATH={shlex.quote(workflow.basedir)}${{{{PYTHONPATH:+:$PYTHONPATH}}}}; ")


wildcard_constraints:
    source=one_of(sources.sources),
    # encoders' folders: a configured dataset, or the name a release gives (rule pretrain reads configured ones only)
    dataset=one_of(encoders.folder_datasets()),
    taskdata=one_of(task_data.derived),
    tabledata=one_of(task_data.tables),
    split="train|valid",
    objective=one_of(OBJECTIVE_LABEL),
    preset=r"[A-Za-z0-9_]+",
    seed=r"\d+",
    # a fine-tuning run (finetune.runs) and an unsupervised read-out of the pair head (finetune.unsupervised.readouts):
    # two wildcards, so that no rule or input function tells them apart by the name's spelling
    ft=one_of(runs.runs),
    readout=one_of(runs.unsupervised["readouts"]),
