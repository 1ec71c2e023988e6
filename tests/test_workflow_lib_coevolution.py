"""The co-evolution study's workflow helpers (workflow/lib/coevolution.py): the study each job hands to
``pmlm coevolution curves`` (the section as a CurvesConfig, the recipe resolved against the workflow folder), the
units and the seed each reads, the files the report declares, and no jobs without a section."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import yaml
from workflow_rules import REPO, workflow_module

from pmlm.coevolution.curves_config import CurvesConfig
from pmlm.errors import ConfigError

coevolution = workflow_module("coevolution")


def section(name: str = "coevolution_triplets.yaml", **changes) -> dict:
    return {**yaml.safe_load((REPO / "config" / name).read_text())["coevolution"], **changes}


def study(name: str = "coevolution_triplets.yaml", **changes) -> object:
    return coevolution.CoevolutionStudy(section(name, **changes), "results/run", "/repo")


def test_every_job_gets_the_study_of_the_config_file():
    """The JSON every rule passes is what `pmlm coevolution curves --config FILE` reads from the same file, with the
    recipe resolved against the workflow folder."""
    expected = CurvesConfig.from_yaml(REPO / "config" / "coevolution_triplets.yaml").to_dict()
    expected["recipe"] = "/repo/config/train/coevolution_tiny.yaml"
    assert json.loads(study().json) == expected
    assert study(recipe="/abs/recipe.yaml").recipe(None) == "/abs/recipe.yaml"
    assert study().threads == 1 and study(threads=3).threads == 3


def test_units_are_the_commands_and_read_their_seeds_families():
    s = study(seeds=[1, 3])
    names = [u.name for u in CurvesConfig.from_dict(section(seeds=[1, 3])).units()]
    assert s.units() == names
    # an arm per seed (the Triple MLM beside the MLM and the PMLM) and a seed's baselines
    assert len(names) == 2 * 3 + 2 and "seed3-all-tmlm" in names and "seed1-baseline" in names
    assert s.seeds() == ["1", "3"]
    assert s.unit_data(SimpleNamespace(unit="seed3-all-tmlm")) == "results/run/coevolution/data/seed3"
    assert s.unit_data(SimpleNamespace(unit="seed1-baseline")) == "results/run/coevolution/data/seed1"
    assert s.seed_data() == ["results/run/coevolution/data/seed1", "results/run/coevolution/data/seed3"]
    assert s.unit_results()[-1] == "results/run/coevolution/units/seed3-baseline.tsv"
    # every job's --out, read from its output
    for output in (s.seed_data()[0], s.unit_results()[0]):
        assert coevolution.study_folder(None, [output]) == s.dir == "results/run/coevolution"


def test_targets_are_what_collect_writes_and_only_with_a_study():
    folder = "results/run/coevolution"
    assert study().targets() == [
        f"{folder}/curves.tsv",
        f"{folder}/sequences.tsv",
        f"{folder}/curves.md",
        f"{folder}/curves.png",
        f"{folder}/curves.svg",
    ]
    none = coevolution.CoevolutionStudy(None, "results/run", "/repo")
    assert none.targets() == [] and none.units() == [] and none.seeds() == [] and none.json == ""


def test_a_broken_section_is_one_line_naming_it():
    with pytest.raises(ConfigError, match=r"^config\.coevolution: .*steps must be increasing"):
        study(steps=[1500, 500])
    with pytest.raises(ConfigError, match=r"^config\.coevolution: arms: the study compares with an MLM"):
        study(arms={"pmlm": {"objective": "pmlm"}})
