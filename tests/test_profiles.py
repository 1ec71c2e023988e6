"""The Snakemake profiles as Snakemake reads them: `--profile slurm` resolves from the repository root, the
SLURM profile's keys are the ones in force although the workflow profile (profiles/default) is always loaded
after it, a local run keeps the demo's settings, and every rule that runs as a job has its resources and a
benchmark."""

from __future__ import annotations

import re

import pytest
import yaml
from snakemake.cli import get_profile_dir, parse_args
from workflow_rules import REPO, commented_block, local_rules, read_rules

SLURM_PROFILE = REPO / "profiles" / "slurm" / "config.yaml"
WORKFLOW_PROFILE = REPO / "profiles" / "default" / "config.yaml"
# rule -> resources of the rule's own defaults that make it a GPU job
GPU_RULES = ("pretrain", "finetune", "evaluate", "evaluate_unsupervised", "score_proteingym_assay")
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
    # pre-training runs its shell in the batch script (`mpi`) and requeues through the plugin's own setting
    assert per_rule["pretrain"]["mpi"] == "srun" and per_rule["pretrain"]["tasks_per_node"] > 1
    assert "--requeue" not in per_rule["pretrain"]["slurm_extra"]
    assert re.search(r"--signal=USR1@\d+", per_rule["pretrain"]["slurm_extra"])


def test_every_job_rule_has_resources_and_a_benchmark():
    local = local_rules()
    jobs = {name: rule for name, rule in read_rules().items() if name not in local}
    assert {"evaluate_unsupervised", "split_structures", "synthesize_families", "tokenize_families"} <= jobs.keys()
    missing = {name: sorted({"mem_mb", "runtime"} - rule.resources) for name, rule in jobs.items()}
    assert {name: m for name, m in missing.items() if m} == {}
    assert sorted(name for name, rule in jobs.items() if "benchmark" not in rule.directives) == []


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
