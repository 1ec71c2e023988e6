"""An objective of one's own, as a user writes it: one ``Objective`` class and ``register``. It trains through the
real pre-training loop, ``pmlm plan`` costs it and the pre-training table reports it, with nothing else changed.

The objective: the released code's ``--pretrain-task pmlm``, the pair head alone on the ordered pairs i != j of
masked residues, without the diagonal and without a token head (none of pmlm's built-in objectives)."""

from __future__ import annotations

import json

import pytest
from tiny_models import pretrain_recipe

from pmlm.cli import main
from pmlm.config.pretraining import TrainConfig
from pmlm.model import objective_registry
from pmlm.model.config import RELEASED_LAYERS
from pmlm.model.objective import Objective, Term, term_outputs
from pmlm.reports.pretrain_scores import pretrain_rows
from pmlm.train import budget
from pmlm.train.pretrain import train
from pmlm.vocabulary import PMLM_PAIR_ONLY


class PairsAlone(Objective):
    name = "pairs_alone"
    layers = PMLM_PAIR_ONLY
    token_head = False

    @property
    def table_scores(self):
        return ("l_pmlm", "acc_pmlm")

    def outputs(self, out, step, cfg, denominators):
        pair = Term(out.pair_ce, out.pair_correct)
        return term_outputs(pair.ce / denominators[1], step.counts, pair=pair)


@pytest.fixture
def pairs_alone(monkeypatch):
    """The objective registered for one test (the registry is the process's: it is restored after)."""
    monkeypatch.setattr(objective_registry, "_OBJECTIVES", dict(objective_registry._OBJECTIVES))
    monkeypatch.setitem(RELEASED_LAYERS, PairsAlone.name, RELEASED_LAYERS[PMLM_PAIR_ONLY])
    return objective_registry.register(PairsAlone())


def test_a_registered_objective_trains_plans_and_reports(tmp_path, shard_dir, pairs_alone, capsys):
    recipe = pretrain_recipe(objective__name=pairs_alone.name, optim__total_steps=3, save_every=0)
    cfg = TrainConfig.from_dict(recipe)
    assert cfg.objective.kind is pairs_alone
    final = tmp_path / "run" / "model.safetensors"
    assert train(cfg, shard_dir, tmp_path / "run", final_path=final) == 0
    scores = json.loads((tmp_path / "run" / "final_scores.json").read_text())
    assert scores["objective"] == pairs_alone.name and scores["l_pmlm"] > 0 and scores["pair_total"] > 0
    assert scores["acc_mlm"] is None and scores["mlm_total"] == 0  # no token term: nothing of it counted

    # the plan: the model it trains (no token head) and its cost
    pmlm = TrainConfig.from_dict(pretrain_recipe(objective__name="pmlm"))
    params = budget.count_parameters(cfg.model_config(), pairs_alone)
    with_token_head = budget.count_parameters(cfg.model_config(), pmlm.objective.kind)
    assert params.total < with_token_head.total
    assert 0 < budget.flops_per_token(cfg) < budget.flops_per_token(pmlm)  # no token head: fewer FLOPs
    assert budget.peak_memory(cfg, params)["total_bytes"] > 0
    recipe_file = tmp_path / "recipe.json"
    recipe_file.write_text(json.dumps(recipe))
    assert main(["plan", "--recipe", str(recipe_file), "--objective", pairs_alone.name, "--gpus", "1"]) == 0
    assert pairs_alone.name in capsys.readouterr().out

    # the pre-training table: its pair columns, no token columns
    row = pretrain_rows([("ours", "demo", str(final))])[-1]
    assert row["l_pmlm"] == scores["l_pmlm"] and row["acc_pmlm"] == scores["acc_pmlm"]
    assert row["l_mlm"] is None and row["acc_mlm"] is None


def test_registering_is_checked(pairs_alone):
    assert objective_registry.register(pairs_alone) is pairs_alone  # the same object again: a no-op
    with pytest.raises(ValueError, match="registered already"):
        objective_registry.register(PairsAlone())
    with pytest.raises(TypeError, match="Objective"):
        objective_registry.register(object())
