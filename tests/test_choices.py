"""The named choices as types (pmlm.choices and the enums beside their engines): they print, format and serialise
as their names, are checked once at the boundary with one-line messages, and carry the dispatch the strings did."""

from __future__ import annotations

import argparse
import json

import pytest
import torch

from pmlm.choices import Choice, Device, Precision
from pmlm.config.pretraining import TrainConfig
from pmlm.config.tree import to_plain
from pmlm.errors import ConfigError
from pmlm.finetune.cost import FinetuneMode
from pmlm.hf_export import HfLayout
from pmlm.inference.options import ADDITIVE, PAIRS, TRIPLE_JOINT, DoubleScore, Marginal, Readout, TripleScore
from pmlm.model.config import Norm, model_config
from pmlm.model.layout import Layout
from pmlm.train.budget import Arithmetic, MicroBatch
from pmlm.train.launch import LaunchMode, LaunchPlan
from pmlm.train.runtime import DTYPES, autocast, evaluation_precision

CHOICES = (Precision, Device, Layout, Norm, DoubleScore, TripleScore, Readout, Marginal, LaunchMode, HfLayout)


@pytest.mark.parametrize("kind", CHOICES)
def test_a_choice_reads_as_its_name_in_text_json_and_argparse(kind):
    member = list(kind)[-1]
    assert issubclass(kind, Choice) and kind.values() == tuple(m.value for m in kind)
    assert str(member) == f"{member}" == f"{member:s}" == member.value == member
    assert json.dumps({"k": member}) == json.dumps({"k": member.value})
    assert to_plain({"k": [member]}) == {"k": [member.value]} and type(to_plain(member)) is str
    assert kind.parse(member.value, "key") is member and kind.parse(member, "key") is member


def test_a_bad_name_is_one_line_naming_the_key_and_the_choices():
    with pytest.raises(ConfigError, match=r"^--precision must be one of auto, fp32, bf16, got 'fp16'$"):
        Precision.parse("fp16", "--precision")
    with pytest.raises(ConfigError, match=r"^model.norm must be one of post, pre, got \['pre'\]$"):
        Norm.parse(["pre"], "model.norm")
    with pytest.raises(ConfigError, match="device must be one of auto, cpu, cuda, got 'gpu'"):
        TrainConfig.from_dict({"device": "gpu"})


def test_argparse_takes_the_member_and_refuses_in_its_own_words(capsys):
    parser = argparse.ArgumentParser(prog="p")
    parser.add_argument("--readout", type=Readout.argument, choices=Readout.values(), default=Readout.AUTO)
    assert parser.parse_args(["--readout", "pair"]).readout is Readout.PAIR
    assert parser.parse_args([]).readout is Readout.AUTO
    assert "{auto,pair,jacobian}" in parser.format_help()
    with pytest.raises(SystemExit):
        parser.parse_args(["--readout", "kl"])
    assert "invalid choice: 'kl' (choose from 'auto', 'pair', 'jacobian')" in capsys.readouterr().err


def test_a_recipe_keeps_bf16_true_false_auto_and_its_config_stays_plain():
    assert [Precision.of_recipe(v) for v in (True, False, "auto")] == [Precision.BF16, Precision.FP32, Precision.AUTO]
    with pytest.raises(ConfigError, match="bf16 must be auto, true or false, got 1"):
        Precision.of_recipe(1)
    cfg = TrainConfig.from_dict({"bf16": False, "device": "cpu", "attention": "padded"})
    assert (cfg.precision, cfg.device, cfg.attention) == (Precision.FP32, Device.CPU, Layout.PADDED)
    plain = cfg.to_dict()
    assert (plain["bf16"], plain["device"], plain["attention"]) == (False, "cpu", "padded")
    assert all(type(plain[k]) is str for k in ("device", "attention"))


def test_precision_resolves_on_a_device_and_owns_its_bytes_and_autocast():
    assert Precision.AUTO.on("cuda") is Precision.BF16 and Precision.AUTO.on("cpu") is Precision.FP32
    with pytest.raises(ConfigError, match="bf16 autocast is supported on CUDA only"):
        Precision.BF16.on("cpu")
    assert (Precision.FP32.bytes, Precision.BF16.bytes) == (4, 2)
    assert DTYPES[Precision.FP32] is torch.float32 and DTYPES[Precision.BF16] is torch.bfloat16
    with autocast(Precision.AUTO, torch.device("cpu"))():
        assert not torch.is_autocast_enabled("cpu")
    cpu = torch.device("cpu")
    assert evaluation_precision(cpu, Precision.FP32, "auto", trained="t", command="c") is Precision.FP32
    assert evaluation_precision(cpu, Precision.BF16, Precision.FP32, trained="t", command="c") is Precision.FP32


def test_the_step_arithmetic_of_the_memory_count():
    batch = MicroBatch(rows=2, width=10, residues=6, masked=2)
    gpu, cpu = Arithmetic(Precision.BF16), Arithmetic(Precision.FP32, "cpu")
    assert (gpu.act, gpu.bf16, gpu.cuda, gpu.processed(batch), gpu.dropout_mask(2)) == (2, True, True, 16, 1)
    assert (cpu.act, cpu.bf16, cpu.cuda, cpu.processed(batch), cpu.dropout_mask(4)) == (4, False, False, 20, 4)


def test_the_score_rules_of_multi_site_mutants():
    both, none = (True, True), (False, False)
    assert DoubleScore.AUTO.joint(True, True) and not DoubleScore.AUTO.joint(True, False)
    assert DoubleScore.PAIR.joint(False, False) and not DoubleScore.ADDITIVE.joint(True, True)
    assert TripleScore.AUTO.source(3, both, True) == TRIPLE_JOINT and TripleScore.AUTO.source(4, both, True) == PAIRS
    assert TripleScore.AUTO.source(3, both, False) == ADDITIVE == TripleScore.AUTO.source(3, none, True)
    assert (
        TripleScore.PAIRS.source(3, none, False) == PAIRS and TripleScore.TRIPLE.source(5, none, True) == TRIPLE_JOINT
    )
    assert Marginal.MASKED.masks and not Marginal.WILDTYPE.masks


def test_readouts_norms_layouts_and_export_layouts_carry_their_dispatch():
    assert (Readout.PAIR.score_kind, Readout.JACOBIAN.score_kind) == ("pair_kl_apc", "jacobian_apc")
    assert Norm.PRE.final and not Norm.POST.final and Layout.PACKED.packs and not Layout.AUTO.packs
    released_mlm = model_config("tiny", "mlm", pair_head=False)
    assert HfLayout.of(released_mlm) is HfLayout.ROBERTA and not HfLayout.ROBERTA.own_names
    assert HfLayout.of(model_config("tiny", "pmlm")) is HfLayout.PMLM and HfLayout.PMLM.own_names
    assert model_config("tiny", "mlm", norm="pre").norm is Norm.PRE


def test_launch_modes_and_fine_tuning_modes():
    plan = LaunchPlan("srun", ["srun"], 1, 1, None)
    assert plan.mode is LaunchMode.SRUN and plan.mode.srun_step and plan.mode.supervised
    assert not LaunchMode.EXEC.supervised and not LaunchMode.TORCHRUN.srun_step
    with pytest.raises(ConfigError, match="launch mode must be one of exec, torchrun, srun, got 'ssh'"):
        LaunchPlan("ssh", [], 1, 1, None)
    assert FinetuneMode.values() == ("frozen", "adapter", "full")
