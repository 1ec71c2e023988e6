"""The GPU benchmarks' CPU modes: the FLOP formula on a hand-counted case, the throughput smoke run
(synthetic and shard lengths; HF ESM when transformers is installed) and the pair-loss step share; the Triple
MLM bench at toy dims."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

from pmlm.model.objective_registry import objective_named
from pmlm.train import budget

BENCH = Path(__file__).resolve().parent.parent / "bench"


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_model_flops_on_a_hand_counted_batch():
    # one layer of C = 4, F = 8; two sequences of 3 and 5 tokens; 1 and 2 masked residues
    encoder = 6 * (4 * 16 + 2 * 4 * 8) * 8  # 6 x (4C^2 + 2CF) x T
    attention = 12 * 4 * (3 * 3 + 5 * 5)  # 12 x layers x C x sum n^2
    token_head = 6 * (16 + 20 * 4) * 3  # 6 x (C^2 + 20C) x M
    assert budget.model_flops(1, 4, 8, objective_named("mlm"), [3, 5], [1, 2]) == encoder + attention + token_head
    # pair head: U = 2 positions with a partner, P = 1 unordered pair, 2P = 2 ordered rows of K = 400 classes
    pair_head = 6 * (2 * 16 * (2 + 1) + 2 * 4 * 400 * 2)
    pmlm = objective_named("pmlm")
    assert budget.model_flops(1, 4, 8, pmlm, [3, 5], [1, 2]) == encoder + attention + token_head + pair_head


def _has_transformers() -> bool:
    return importlib.util.find_spec("transformers") is not None


def test_throughput_smoke_run_writes_its_tables(tmp_path, shard_dir):
    gpu = load("bench_gpu_throughput")
    out = tmp_path / "gpu_throughput"
    assert gpu.main(["--smoke", "--shards", str(shard_dir), "--peak-tflops", "1", "--out", str(out)]) == 0
    result = json.loads(out.with_suffix(".json").read_text())
    assert "| tiny | ours | pmlm | 512 x 4 | packed |" in out.with_suffix(".md").read_text()
    ours = [r for r in result["rows"] if r["model"] == "ours"]
    # the recipe's step (2,048 tokens in the smoke run) at two micro-batches, both layouts
    assert {(r["objective"], r["micro_tokens"], r["accumulation"], r["layout"]) for r in ours} == {
        (o, m, 2048 // m, lay) for o in ("mlm", "pmlm") for m in (512, 1024) for lay in ("padded", "packed")
    }
    for row in ours:
        assert row["non_pad_tokens_per_s"] > 0 and row["mfu"] > 0 and row["padding_fraction"] > 0
        assert row["syncs_counted"] == 0, row["sync_sites"]  # the step's micro-batches read nothing back
        assert row["auto"] == (row["layout"] == "padded")  # training on a CPU: auto pads
    by = {(r["objective"], r["micro_tokens"], r["layout"]): r for r in ours}
    # the pair head adds model FLOPs on the same sequences and masks; neither the layout nor the micro-batch changes them
    assert by["pmlm", 512, "padded"]["model_tflops_per_step"] > by["mlm", 512, "padded"]["model_tflops_per_step"]
    flops = {r["model_tflops_per_step"] for r in ours if r["objective"] == "pmlm"}
    assert len(flops) == 1
    summary = result["summary"]["tiny"]
    assert summary["pmlm_over_mlm_step"] > 0 and len(summary["auto_vs_best_layout"]) == 4
    hf = [r for r in result["rows"] if r["model"] == "hf_esm"]
    if _has_transformers():
        # the same sequences, padded to L: more padding, the same non-pad tokens
        assert len(hf) == 1 and hf[0]["non_pad_tokens"] == ours[0]["non_pad_tokens"]
        assert hf[0]["padding_fraction"] > ours[0]["padding_fraction"]
    else:
        assert hf == []


def test_throughput_smoke_run_on_synthetic_lengths_without_a_peak(tmp_path):
    gpu = load("bench_gpu_throughput")
    out = tmp_path / "synthetic"
    argv = ["--smoke", "--objectives", "mlm", "--layouts", "padded", "--micro-batches", "512", "--no-hf"]
    assert gpu.main([*argv, "--out", str(out)]) == 0
    result = json.loads(out.with_suffix(".json").read_text())
    (row,) = result["rows"]
    assert row["mfu"] is None and result["peak_flops"] is None  # no peak known for a CPU
    assert row["non_pad_tokens"] > 0 and row["accumulation"] == 4


def test_pair_memory_step_share_on_cpu(tmp_path):
    pair = load("bench_pair_memory")
    out = tmp_path / "pair.json"
    args = [
        "--quick",
        "--hidden",
        "64",
        "--ref-lengths",
        "64",
        "--step-share",
        "--share-batch",
        "2",
        "--device",
        "cpu",
        "--out",
        str(out),
    ]
    assert pair.main(args) == 0
    share = json.loads(out.read_text())["step_share"]
    # a smoke run: the share is reported; its size is the bench's figure, not a test's (the pair loss and the step are
    # timed apart, 2 steps each, so a busy machine can put either above the other)
    assert math.isfinite(share["pair_loss_over_pmlm_step"]) and share["pair_loss_over_pmlm_step"] > 0
    assert share["tokens_per_step"] == 2 * 512 and share["bf16"] is False


def test_embed_bench_smoke_run(capsys):
    """bench_embed.py --quick: one round of `pmlm embed` and of the forward passes on its batches."""
    embed = load("bench_embed")
    assert embed.main(["--quick"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["bench"] == "embed" and result["batches"] >= 1 and len(result["rounds"]) == 1
    assert result["ratio_embed_over_forward"] == result["rounds"][0]["ratio"] > 0


def test_finetune_modes_bench_smoke_run(capsys, tmp_path):
    """bench_finetune_modes.py --quick: the demo's tasks three ways on a tiny encoder, and one step of full and LoRA
    fine-tuning at toy dims; every figure reported."""
    from tiny_models import tiny_encoder

    encoder = tiny_encoder(tmp_path / "encoder" / "model.safetensors", "pmlm", max_len=258)  # ss3_tiny crops at 254
    assert load("bench_finetune_modes").main(["--quick", "--encoder", str(encoder)]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [(r["task"], r["mode"]) for r in result["demo"]] == [
        (task, mode) for task in ("net_charge", "ss3") for mode in ("frozen", "adapter", "full")
    ]
    for row in result["demo"]:
        assert row["steps"] == 10 and 0 < row["kept_step"] <= 10 and row["peak_bytes"] > 0 and -1 <= row["test"] <= 1
    trainable = {r["mode"]: r["counts"]["trainable"] for r in result["650m"]}
    assert trainable["adapter"] < trainable["full"] and result["650m_peak_ratio"] > 0


def test_attention_dropout_bench_smoke_run(capsys):
    """bench_attention_dropout.py --quick: attention alone three ways, then the step with and without dropout."""
    bench = load("bench_attention_dropout")
    assert bench.main(["--quick", "--no-sdpa-dropout"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-2])
    assert result["bench"] == "attention_dropout" and result["passed"] is None  # --quick is not the bar
    for shape in result["attention"].values():
        assert set(shape["fwd_bwd_ms"]) == {"sdpa_no_dropout", "sdpa_dropout", "ours_dropout"}
        assert shape["over_sdpa_no_dropout"]["sdpa_no_dropout"] == 1.0
    step = result["step"]
    assert set(step["median_step_s"]) == {"dropout_0.0", "dropout_0.1"} and len(step["all_step_s"]["dropout_0.1"]) == 2
    assert step["ratio_over_dropout_0.0"]["dropout_0.1"] > 0


def test_vs_esm_guard_names_every_difference():
    vs_esm = load("bench_vs_esm")
    ours = {"layers": 4, "attention_dropout": [0.1], "activation": "gelu"}
    assert vs_esm.differences(ours, dict(ours)) == []
    hf = {**ours, "attention_dropout": [0.0], "layer_norm_eps": [1e-12]}
    assert vs_esm.differences(ours, hf) == [
        "attention_dropout: ours [0.1], HF [0.0]",
        "layer_norm_eps: ours None, HF [1e-12]",
    ]


def test_vs_esm_builds_like_for_like_models_and_refuses_others(capsys, monkeypatch):
    vs_esm = load("bench_vs_esm")
    if not _has_transformers():
        assert vs_esm.main(["--quick"]) == 0
        assert "skipped" in json.loads(capsys.readouterr().out.splitlines()[0])
        return
    dims = vs_esm.DIMS["tiny"]
    for attention_dropout in (0.1, 0.0):
        ours = vs_esm.ours_fields(vs_esm.build_ours(dims, 64, 0.1, attention_dropout).train())
        hf = vs_esm.hf_fields(vs_esm.build_hf(dims, 64, 0.1, attention_dropout).train())
        assert vs_esm.differences(ours, hf) == [] and ours["attention_dropout"] == [attention_dropout]
    args = ["--quick", "--preset", "tiny", "--max-len", "64", "--pool", "64", "--sequences", "4", "--control"]
    assert vs_esm.main([*args, "--attention-dropouts", "0.1"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[0])
    (setting,) = result["settings"]
    assert setting["differences"] == [] and setting["attention_dropout"] == 0.1
    assert set(setting["ratios"]) == {"ours_over_hf", "ours_on_padded_over_hf"}
    assert set(setting["bars"]) == set(setting["ratios"])  # the bars apply at attention dropout 0.1
    # HF built with another attention dropout: the guard stops the run before any timing
    build_hf = vs_esm.build_hf
    monkeypatch.setattr(vs_esm, "build_hf", lambda dims, max_len, dropout, _: build_hf(dims, max_len, dropout, 0.0))
    assert vs_esm.main([*args, "--attention-dropouts", "0.1"]) == 2
    assert "attention_dropout: ours [0.1], HF [0.0]" in capsys.readouterr().out


def test_triple_bench_at_toy_dims(capsys):
    triple = load("bench_triple")
    assert (
        triple.main(
            [
                "--layers",
                "1",
                "--hidden",
                "16",
                "--ffn",
                "32",
                "--heads",
                "2",
                "--length",
                "64",
                "--naive-lengths",
                "40",
                "56",
                "--warmup",
                "0",
                "--steps",
                "1",
                "--threads",
                "1",
            ]
        )
        == 0
    )
    result = json.loads(capsys.readouterr().out.splitlines()[0])
    assert set(result["steps"]["median_step_s"]) == {"mlm", "pmlm", "tmlm"}
    mem = result["memory"]
    for point in mem["naive_points"]:  # every ordered triple of the masked residues
        m = point["masked"]
        assert point["triples"] == m * (m - 1) * (m - 2) and point["naive_peak_gib"] > 0
    assert mem["ours_triples"] == mem["masked"]  # triples_per_masked 1
    assert mem["ratio_ours_over_naive"] > 0


def test_inference_bench_smoke_run_computes_what_transformers_computes(tmp_path):
    """bench_inference.py --quick: pmlm embed and pmlm score --saturation (both marginals) against the transformers
    loops over the exported folder: the same numbers (embeddings exactly, the scores to float32 rounding of log-
    probabilities of magnitude < 10, so 1e-5 is 10+ ulps), and a memory run per command."""
    if not _has_transformers():
        return
    bench = load("bench_inference")
    out = tmp_path / "inference.json"
    argv = ["--quick", "--embed-memory-sizes", "20", "40", "--saturation-memory-sizes", "2", "4", "--out", str(out)]
    assert bench.main(argv) == 0
    result = json.loads(out.read_text())
    assert result["embed"]["max_relative_difference"] <= 1e-5
    assert result["saturation"]["substitutions"] == 19 * result["saturation"]["residues"]
    assert result["saturation"]["max_abs_difference"] <= 1e-5 and result["wildtype"]["max_abs_difference"] <= 1e-5
    for command in ("embed", "saturation"):
        runs = result["memory"][command]["runs"]
        assert all(run["peak_mib"] >= run["baseline_mib"] > 0 for run in runs.values())
