"""The Snakemake profiles as Snakemake reads them: `--profile slurm` resolves from the repository root, the
SLURM profile's keys are the ones in force although the workflow profile (profiles/default) is always loaded
after it, a local run keeps the demo's settings, one place decides what each job gets (the profile for the GPU
rules, the rule for the others), and the paper config's jobs get what docs/slurm.md says."""

from __future__ import annotations

import collections
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from snakemake.cli import get_profile_dir, parse_args
from workflow_rules import REPO, commented_block, local_rules, read_rules

SLURM_PROFILE = REPO / "profiles" / "slurm" / "config.yaml"
SNAKEMAKE = Path(sys.executable).parent / "snakemake"
WORKFLOW_PROFILE = REPO / "profiles" / "default" / "config.yaml"
# rule -> resources of the rule's own defaults that make it a GPU job
GPU_RULES = (
    "pretrain",
    "finetune",
    "evaluate",
    "evaluate_unsupervised",
    "score_proteingym_assay",
    "embed_shard",
    "score_shard",
    "contacts_shard",
)
# keys whose values are per-resource mappings, compared one resource at a time
RESOURCE_KEYS = ("default-resources", "set-resources")


def _yaml(path) -> dict:
    return yaml.safe_load(path.read_text())


@pytest.fixture
def in_repo(monkeypatch):
    """Snakemake resolves profile names and the workflow profile from the current directory."""
    monkeypatch.chdir(REPO)


def _parse(argv: list[str]):
    _, args = parse_args(argv)
    return args


def _raw(resources) -> dict:
    return {name: resource.raw for name, resource in resources.items()}


def test_profile_name_resolves_from_the_repository_root(in_repo):
    """`snakemake --profile slurm`: Snakemake looks in the current directory first, where `slurm` links to it."""
    _folder, config = get_profile_dir("slurm")
    assert config.resolve() == SLURM_PROFILE
    assert (REPO / "slurm").is_symlink() and (REPO / "slurm").resolve() == SLURM_PROFILE.parent


def test_slurm_profile_settings_are_in_force(in_repo):
    args = _parse(["--profile", "slurm", "--configfile", "config/paper.yaml"])
    profile = _yaml(SLURM_PROFILE)
    # every plain key of the profile reaches Snakemake unchanged (the workflow profile overrides none)
    for key, value in profile.items():
        if key not in RESOURCE_KEYS:
            assert getattr(args, key.replace("-", "_")) == value, key
    assert args.executor == "slurm" and args.latency_wait == 60 and args.keep_going is True
    assert args.retries == 1 and args.jobs == 100 and args.slurm_requeue is True
    defaults = _raw(args.default_resources)
    assert {k: defaults[k] for k in profile["default-resources"]} == profile["default-resources"]
    per_rule = {rule: _raw(res) for rule, res in args.set_resources.items()}
    assert per_rule == profile["set-resources"]
    # the workflow profile was loaded as well: it names the demo config, here replaced by the command line
    assert [str(p) for p in args.configfile] == ["config/paper.yaml"]
    assert args.printshellcmds and args.rerun_incomplete and args.show_failed_logs


def test_workflow_profile_sets_no_key_of_the_slurm_profile_differently():
    """profiles/default is loaded after --profile and its keys win: it may only repeat the SLURM profile's."""
    workflow, slurm = _yaml(WORKFLOW_PROFILE), _yaml(SLURM_PROFILE)
    clashes = {k: (workflow[k], slurm[k]) for k in workflow.keys() & slurm.keys() if workflow[k] != slurm[k]}
    assert clashes == {}
    assert not set(RESOURCE_KEYS) & workflow.keys()  # a resource key there would replace the profile's wholesale


def test_local_run_keeps_the_demo_settings(in_repo):
    args = _parse(["--cores", "2"])
    assert [str(p) for p in args.configfile] == ["config/config.yaml"]
    assert args.executor is None and args.latency_wait == 5 and args.keep_going is False and args.retries == 0
    assert args.printshellcmds and args.rerun_incomplete and args.show_failed_logs
    assert args.default_resources is None and args.set_resources == {}


def test_gpu_rules_get_the_gpu_partition_and_no_task_count(in_repo):
    per_rule = {rule: _raw(res) for rule, res in _parse(["--profile", "slurm"]).set_resources.items()}
    cpu_partition = _raw(_parse(["--profile", "slurm"]).default_resources)["slurm_partition"]
    rules = read_rules()
    gpu_rules = {name for name, rule in rules.items() if "gpu" in rule.resources}
    assert gpu_rules == set(GPU_RULES)
    for name in GPU_RULES:
        res = per_rule[name]
        assert res["slurm_partition"] == per_rule["pretrain"]["slurm_partition"] != cpu_partition, name
        assert res["gpu"] >= 1 and res["cpus_per_gpu"] >= 1 and res["mem_mb"] > 0 and res["runtime"] > 0, name
        # plugin 2.x: `tasks` on a GPU job becomes --ntasks-per-gpu
        assert "tasks" not in res and "tasks_per_gpu" not in res, name
    # the trainers run in the batch script's own srun step (`mpi`), get SLURM's warning before the time limit and
    # requeue through the plugin's own setting (sbatch --requeue)
    for name in ("pretrain", "finetune"):
        assert per_rule[name]["mpi"] == "srun" and per_rule[name]["tasks_per_node"] > 1, name
        assert "--requeue" not in per_rule[name]["slurm_extra"], name
        assert re.search(r"--signal=USR1@\d+", per_rule[name]["slurm_extra"]), name
    for name in ("evaluate", "evaluate_unsupervised", "score_proteingym_assay"):
        assert "mpi" not in per_rule[name] and "slurm_extra" not in per_rule[name], name


def test_one_place_decides_what_each_job_gets():
    """Under the profile a GPU rule gets its set-resources block, all of it (GPUs, CPUs, memory, time); every other
    rule that runs as a job decides its own memory and time (growing with its input and attempt), which the profile
    does not touch. Every job rule has a benchmark."""
    local = local_rules()
    jobs = {name: rule for name, rule in read_rules().items() if name not in local}
    assert {"evaluate_unsupervised", "split_structures", "prepare_coevolution", "run_coevolution_unit"} <= jobs.keys()
    per_rule = _yaml(SLURM_PROFILE)["set-resources"]
    assert set(per_rule) == set(GPU_RULES) <= jobs.keys()
    for name in GPU_RULES:
        assert {"slurm_partition", "gpu", "cpus_per_gpu", "mem_mb", "runtime"} <= per_rule[name].keys(), name
    # the rule's own one GPU is what a run without the profile uses; our training and evaluation rules say nothing else
    for name in ("pretrain", "finetune", "evaluate", "evaluate_unsupervised"):
        assert jobs[name].resources == {"gpu"}, (name, jobs[name].resources)
    missing = {
        name: sorted({"mem_mb", "runtime"} - rule.resources) for name, rule in jobs.items() if name not in per_rule
    }
    assert {name: m for name, m in missing.items() if m} == {}
    assert sorted(name for name, rule in jobs.items() if "benchmark" not in rule.directives) == []


# docs/slurm.md's table of what each job of the paper config gets, and the dry run that must show the same
RESOURCES_DOC = REPO / "docs" / "slurm.md"
RESOURCES_TABLE_HEADER = "| rule | jobs | partition | GPUs | CPUs per GPU | memory (MB) | time limit (min) |"
FROM_THE_INPUT = "from the input"


def _dry_run_resources(argv: list[str]) -> collections.Counter:
    """(rule, partition, GPUs, CPUs per GPU, memory, time limit) of every job the dry run plans, counted."""
    done = subprocess.run([str(SNAKEMAKE), "-n", *argv], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    local, rows, rule = local_rules(), collections.Counter(), None
    for line in done.stdout.splitlines():
        start = re.match(r"^(?:local)?rule (\w+):$", line)
        if start:
            rule = start.group(1)
            continue
        listed = re.match(r"^\s+resources: (.*)$", line)
        if listed and rule is not None and rule not in local:
            res = dict(item.split("=", 1) for item in listed.group(1).split(", "))
            rows[(rule, res["slurm_partition"], res.get("gpu", "-"), res.get("cpus_per_gpu", "-"), res["mem_mb"],
                  res["runtime"])] += 1  # fmt: skip
        if listed:
            rule = None
    return rows


def _documented_resources() -> collections.Counter:
    """The table under docs/slurm.md's RESOURCES_TABLE_HEADER; a cell's first word is the value (the rest says why),
    and an amount computed from the job's input when it runs is 'from the input ...' (the dry run's <TBD>)."""
    lines = RESOURCES_DOC.read_text().splitlines()
    start = lines.index(RESOURCES_TABLE_HEADER) + 2
    rows = collections.Counter()
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        rule = re.fullmatch(r"`(\w+)`.*", cells[0]).group(1)
        values = [
            "<TBD>" if cell.startswith(FROM_THE_INPUT) else cell.split()[0].strip("`").replace(",", "")
            for cell in cells[2:]
        ]
        rows[(rule, *values)] += int(cells[1])
    return rows


def test_the_paper_jobs_get_the_resources_the_docs_state(in_repo):
    """`snakemake -n --profile slurm --configfile config/paper.yaml`: each job's resources line shows what
    docs/slurm.md says it gets."""
    dry_run = _dry_run_resources(["--profile", "slurm", "--configfile", "config/paper.yaml"])
    assert {row[0] for row in dry_run} >= {"pretrain", "finetune", "evaluate", "split_clusters"}
    assert _documented_resources() == dry_run


def test_the_two_node_block_asks_for_gpus_per_node(in_repo):
    """The commented block for two nodes, as a user uncomments it: the default block's settings, with GPUs counted
    per node (`gres`, so that SLURM cannot spread them unevenly) and one task slot per GPU on each node."""
    block = yaml.safe_load(commented_block(SLURM_PROFILE, "  #   pretrain:"))["pretrain"]
    default = _raw(_parse(["--profile", "slurm"]).set_resources["pretrain"])
    per_node = re.fullmatch(r"gpu:(\d+)", block["gres"])
    assert block["nodes"] == 2 and block["gpu"] == 0 and per_node, block
    assert block["tasks_per_node"] == int(per_node.group(1)) == default["gpu"], block
    same = {k: v for k, v in default.items() if k not in ("gpu", "nodes")}
    assert {k: block[k] for k in same} == same
