"""The workflow's config defaults: the schema is their one home.

The Snakefile validates the config once with Snakemake's ``validate(..., set_default=True)``, which fills the
schema's defaults, and the rules pass those values to the commands as flags. These tests pin that the
filling reaches the nested sections the rules read, and that no command's own argparse default says
something else than the schema for a flag the workflow fills (so the two cannot drift).
"""

from __future__ import annotations

import argparse
import copy
from dataclasses import fields
from pathlib import Path

import pytest
import yaml
from conftest import reversed_keys, snakemake
from snakemake.exceptions import WorkflowError
from snakemake.utils import validate
from workflow_rules import workflow_config

from pmlm.cli import build_parser
from pmlm.coevolution.curves_config import CurvesConfig
from pmlm.data.normalise import IngestPolicy
from pmlm.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
SCHEMA_PATH = REPO / "workflow" / "schemas" / "config.schema.yaml"
SCHEMA = yaml.safe_load(SCHEMA_PATH.read_text())


def section(path: str) -> dict:
    """The schema node at a slash-separated path (``$defs/cluster``)."""
    node = SCHEMA
    for key in path.split("/"):
        node = node[key]
    return node


def subparser(command: str) -> argparse.ArgumentParser:
    """The parser of ``pmlm <command>`` (``coevolution curves``: a sub-subcommand)."""
    words = command.split()
    parser = build_parser(words[0])
    for word in words:
        action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = action.choices[word]
    return parser


def option_defaults(parser: argparse.ArgumentParser) -> dict[str, object]:
    return {opt: a.default for a in parser._actions for opt in a.option_strings}


# (command, schema section whose keys the workflow passes as that command's --flags): split_args,
# tokenize_args, structure_split_args, kl_args (common.smk). The coevolution section is no command's flags but one
# CurvesConfig, handed over whole (test_the_coevolution_section_is_the_study_config).
FILLED_FROM_CONFIG = [
    ("split", "$defs/cluster"),
    ("tokenize", "$defs/shards"),
    ("split-structures", "properties/task_data/additionalProperties/properties/split"),
    ("kl", "properties/pretrain/properties/kl"),
]
OWN_DEFAULTS: set[tuple[str, str]] = set()  # (command, section) whose command defaults may differ on purpose
# keys the workflow reads itself, not flags of the command (kl.datasets: which --valid sets it passes)
WORKFLOW_KEYS = {("kl", "datasets")}


def _same(a, b) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return list(a) == list(b)
    return a == b


@pytest.mark.parametrize("command, path", FILLED_FROM_CONFIG)
def test_command_defaults_equal_the_schema(command, path):
    defaults = option_defaults(subparser(command))
    props = section(path)["properties"]
    assert props, path
    for key, spec in props.items():
        if (command, key) in WORKFLOW_KEYS:
            continue
        flag = "--" + key.replace("_", "-")
        assert flag in defaults, f"pmlm {command} has no {flag} for config key {path}/{key}"
        assert "default" in spec, f"{path}/{key} has no default in the schema"
        if defaults[flag] is None or (command, path) in OWN_DEFAULTS:
            continue  # no argparse default to drift
        assert _same(defaults[flag], spec["default"]), (
            f"pmlm {command} {flag} defaults to {defaults[flag]!r}, the schema's {path}/{key} to {spec['default']!r}"
        )


def test_ingest_policy_defaults_equal_the_schema():
    # a dataset with no ingest: section gets IngestPolicy's defaults; those must be the schema's
    props = section("$defs/ingest")["properties"]
    policy = {f.name: f.default for f in fields(IngestPolicy) if not f.name.startswith("_")}
    assert policy == {k: v["default"] for k, v in props.items()}


def _validated(config: dict) -> dict:
    config = copy.deepcopy(config)
    validate(config, str(SCHEMA_PATH), set_default=True)
    return config


def test_validate_fills_the_nested_defaults_the_rules_read():
    config = _validated(
        {
            "sources": {"a": {"url": "file:x.fa"}, "s": {"url": "file:s.jsonl"}},
            "datasets": {"d": {"sources": ["a"], "cluster": {"valid_fraction": 0.03}}},
            "pretrain": {
                "recipes": {"tiny": "r.yaml"},
                "models": [{"dataset": "d", "objective": "pmlm", "preset": "tiny"}],
            },
            "task_data": {"t": {"source": "s", "split": {"seed": 3}}},
            "coevolution": {"seeds": [1]},
        }
    )
    assert config["run"] == "demo" and config["finetune"]["runs"] == {}
    assert config["shards"] == {"num_shards": 8, "row_group_size": 2048, "compression_level": 1}
    assert config["cluster"]["method"] == "linclust" and config["cluster"]["valid_fraction"] == 0.01
    assert config["pretrain"]["kl"] == {"sequences": 64, "pairs": 16, "seed": 0, "datasets": []}
    assert config["task_data"]["t"]["split"] == {
        "seed": 3,
        "fractions": [0.7, 0.1, 0.2],
        "min_seq_id": 0.3,
        "coverage": 0.5,
    }
    assert config["coevolution"]["recipe"] == "config/train/coevolution_tiny.yaml"
    assert (
        config["coevolution"]["evaluate"]["k_divisor"] == 5 and config["coevolution"]["groups"]["L40"]["length"] == 40
    )
    # a dataset's own section is completed from the schema too, so it replaces the global one as a whole
    # (common.smk's dataset_setting): its valid_fraction and the schema's decontamination identity
    assert config["datasets"]["d"]["cluster"]["valid_fraction"] == 0.03
    assert config["datasets"]["d"]["cluster"]["decontam_min_seq_id"] == 0.5
    assert "ingest" not in config and "ingest" not in config["datasets"]["d"]  # see the IngestPolicy test
    # a run's list of encoders defaults to all
    runs = _validated(
        {
            "finetune": {
                "recipes": {"r": "r.yaml"},
                "runs": {"x": {"recipe": "r", "data": "t", "table": "tape_contact", "tests": {"t": "test"}}},
            }
        }
    )["finetune"]["runs"]
    assert runs["x"]["encoders"] == []


def test_the_coevolution_section_is_the_study_config():
    """The schema describes CurvesConfig's keys with its defaults: a section the schema completes is the study
    `pmlm coevolution curves` builds from it (the defaults cannot drift), every study config's included; a config
    without the section has none, so no study."""
    assert _validated({"coevolution": {}})["coevolution"] == CurvesConfig().to_dict()
    arms = {"mlm": {"objective": "mlm"}, "tmlm": {"objective": "tmlm", "set": {"seed": 2}}}
    assert _validated({"coevolution": {"arms": arms, "groups": {"A": {}}}})["coevolution"] == (
        CurvesConfig.from_dict({"arms": arms, "groups": {"A": {}}}).to_dict()
    )
    for path in sorted((REPO / "config").glob("coevolution*.yaml")):
        text = yaml.safe_load(path.read_text())
        if "coevolution" in text:  # a workflow config (a bare study file is pmlm coevolution curves' alone)
            assert _validated(text)["coevolution"] == CurvesConfig.from_yaml(path).to_dict(), path.name
    assert "coevolution" not in _validated({})


def test_invalid_config_is_one_line_naming_the_key():
    bad = {"sources": {"a": {"url": "file:x.fa"}}, "datasets": {"d": {"sources": ["a"], "shards": {"num_shards": 0}}}}
    with pytest.raises(WorkflowError):
        validate(copy.deepcopy(bad), str(SCHEMA_PATH), set_default=True)
    error = workflow_config.schema_error(bad, SCHEMA_PATH)
    assert str(error).startswith("config.datasets.d.shards.num_shards: 0 is less than the minimum")
    with pytest.raises(ConfigError, match=r"config.datasets.d.sources\[0\]: unknown source 'b'"):
        workflow_config.check_references(
            _validated({"sources": {"a": {"url": "file:x.fa"}}, "datasets": {"d": {"sources": ["b"]}}})
        )


def _finetune_config(features, table="tape_contact"):
    return _validated(
        {
            "sources": {"a": {"url": "file:x.fa"}, "s": {"url": "file:s.jsonl"}},
            "datasets": {"d": {"sources": ["a"]}},
            "pretrain": {
                "recipes": {"tiny": "r.yaml"},
                "models": [
                    {"dataset": "d", "objective": "mlm", "preset": "tiny"},
                    {"dataset": "d", "objective": "pmlm", "preset": "tiny"},
                ],
            },
            "task_data": {"t": {"source": "s", "split": {}}},
            "finetune": {
                "recipes": {"r": "r.yaml"},
                "runs": {
                    "x": {"recipe": "r", "data": "t", "table": table, "tests": {"t": "test"}, "features": features}
                },
            },
        }
    )


@pytest.mark.parametrize(
    "features, table, message",
    [
        ({"d/pmlm-tiny": "M+", "d/mlm-tiny": "M"}, "tape_contact", None),
        ("M", "secondary_structure", None),
        ({"d/pmlm-tiny": "M+"}, "secondary_structure", "config.finetune.runs.x.features: M+ describes residue pairs"),
        ("M+", "tape_contact", "config.finetune.runs.x.features: M+ needs a pair head; d/mlm-tiny is an MLM encoder"),
        ({"d/pmlm-big": "M"}, "tape_contact", "config.finetune.runs.x.features.d/pmlm-big: not an encoder of this run"),
    ],
)
def test_run_features_are_checked(features, table, message):
    config = _finetune_config(features, table)
    if message is None:
        workflow_config.check_references(config)
    else:
        with pytest.raises(ConfigError) as error:
            workflow_config.check_references(config)
        assert str(error.value).startswith(message)


def test_schema_rejects_unknown_features():
    with pytest.raises(WorkflowError):
        _finetune_config("M++")
    with pytest.raises(WorkflowError):
        _finetune_config({"d/pmlm-tiny": "mplus"})


# -- params are canonical: the same settings in another order plan no job --------------------------------------


def _planned_commands(configfile: Path, workdir: Path) -> list[str]:
    """Every `python -m pmlm` command of the whole DAG, as the dry run prints them (params filled in)."""
    proc = snakemake("-n", "-p", "--forceall", "--cores", "2", "--directory", str(workdir), "--configfile",
                     str(configfile))  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return sorted(line.strip() for line in proc.stdout.splitlines() if "-m pmlm " in line)


def test_the_demo_config_in_another_key_order_gives_the_same_params(tmp_path):
    """Snakemake reruns a job whose params differ from those it recorded: the demo config with every mapping's keys
    reversed must give every job of the demo the same command, params included (a finished run then plans no job;
    tests/test_slurm_workflow.py checks that on a finished run)."""
    demo = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    reordered = tmp_path / "reordered.yaml"
    reordered.write_text(yaml.safe_dump(reversed_keys(demo), sort_keys=False))
    assert list(yaml.safe_load(reordered.read_text())) == list(reversed(list(demo)))
    same = _planned_commands(REPO / "config" / "config.yaml", tmp_path / "a")
    other = _planned_commands(reordered, tmp_path / "b")
    assert len(same) > 20  # the demo's whole DAG: data, pre-training, fine-tuning, evaluation, tables, report
    assert other == same, "\n".join(sorted(set(other) ^ set(same)))


@pytest.mark.parametrize("suffix", [".csv", ".tsv.gz", ".parquet"])
def test_a_tables_columns_are_checked_against_the_users_own_keys(tmp_path, monkeypatch, suffix):
    """A table of one's own names its columns in task_data.<name>.table: a column the file lacks is one line naming
    that key (not the recipe setting a fine-tuning job would name) before any job runs."""
    import gzip

    import pandas as pd

    monkeypatch.chdir(tmp_path)
    frame = pd.DataFrame({"sequence": ["MKV", "GLL"], "charge": [0.1, -0.2]})
    path = tmp_path / f"mine{suffix}"
    if suffix == ".parquet":
        frame.to_parquet(path)
    else:
        with gzip.open(path, "wt") as fh:
            fh.write(frame.to_csv(sep="\t", index=False))
    if suffix == ".csv":
        path.write_text(frame.to_csv(index=False))

    def config(table: dict) -> dict:
        return _validated(
            {
                "sources": {"t": {"url": f"file:{path.name}"}},
                "task_data": {"mine": {"source": "t", "table": table, "split": {"fractions": [0.5, 0.25, 0.25]}}},
            }
        )

    workflow_config.check_references(config({"label_column": "charge"}))
    with pytest.raises(ConfigError, match=r"^config.task_data.mine.table.label_column: no column 'label' in mine"):
        workflow_config.check_references(config({}))  # the default label column
    with pytest.raises(ConfigError, match=r"table.sequence_column: no column 'seq' .*its columns: sequence, charge"):
        workflow_config.check_references(config({"label_column": "charge", "sequence_column": "seq"}))
