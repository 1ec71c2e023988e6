"""The planted-coupling study's workflow helpers (workflow/lib/coevolution.py): the flags its rules pass, the recipe
path, the encoders per seed (the Triple MLM only when asked for) and the targets."""

from __future__ import annotations

from types import SimpleNamespace

import yaml
from workflow_rules import REPO, workflow_module

from pmlm.vocabulary import MLM, PMLM, TMLM

coevolution = workflow_module("coevolution")


def study(name: str = "coevolution_triplets.yaml", **changes) -> object:
    section = {**yaml.safe_load((REPO / "config" / name).read_text())["coevolution"], **changes}
    return coevolution.CoevolutionStudy(section, "results/run", "/repo")


def test_command_flags_come_from_their_sections():
    s, w = study(), SimpleNamespace(seed=2, objective=PMLM)
    assert s.synth_args(w) == (
        "--families 4 --length 32 --sequences 2000 --coupling-strength 2.0 --triplets 4 --triplet-strength 3.0"
    )
    assert s.split_args(w) == "--valid-fraction 0.1 --split-seed 0"
    assert s.shard_args(w) == "--num-shards 4 --row-group-size 64"
    # the evaluation re-draws the held-out sequences: the split's flags first
    assert s.evaluate_args(w) == "--valid-fraction 0.1 --split-seed 0 --sequences 8 --chain-rule 0 --head-steps 300"


def test_pretraining_overrides_name_the_objective_and_seed_then_the_study_set():
    s = study(set={"optim.total_steps": 2000, "model.overrides.name": "a b"})
    overrides = s.pretrain_overrides(SimpleNamespace(seed=3, objective=MLM))
    assert overrides == (
        f"--set objective.name={MLM} --set seed=3 --set optim.total_steps=2000 --set 'model.overrides.name=a b'"
    )


def test_a_relative_recipe_is_read_from_the_workflow_folder():
    assert study().recipe(None) == "/repo/config/train/coevolution_tiny.yaml"
    assert study(recipe="/abs/recipe.yaml").recipe(None) == "/abs/recipe.yaml"


def test_the_triple_mlm_joins_only_when_asked():
    w = SimpleNamespace(seed=1)
    with_tmlm, without = study(), study(tmlm=False)
    assert with_tmlm.objectives() == [MLM, PMLM, TMLM] and without.objectives() == [MLM, PMLM]
    assert set(coevolution.OBJECTIVES) >= set(with_tmlm.objectives())
    assert with_tmlm.encoders(w) == {
        name: f"results/run/coevolution/seed1/{name}/model.safetensors" for name in (MLM, PMLM, TMLM)
    }
    assert with_tmlm.tmlm_flag(w) == f"--tmlm results/run/coevolution/seed1/{TMLM}/model.safetensors"
    assert without.tmlm_flag(w) == ""


def test_results_per_seed_and_targets_only_with_a_study():
    s = study(seeds=[1, 3])
    assert s.seeds() == [1, 3]
    assert s.results() == ["results/run/coevolution/seed1/results.json", "results/run/coevolution/seed3/results.json"]
    assert s.targets() == [
        "results/run/coevolution/coevolution.html",
        "results/run/coevolution/coevolution_exact.html",
        "results/run/coevolution/coevolution.svg",
    ]
    assert coevolution.CoevolutionStudy({}, "results/run", "/repo").targets() == []
