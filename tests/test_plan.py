"""`pmlm plan` and its memory count: the kept tensors against the CPU allocator's live bytes after a forward, the
whole estimate against the measured peak of real training steps at small dims (fp32 through the training loop, bf16
under CPU autocast by hand), and the plan's arithmetic of steps, tokens, GPU-hours and time-limit segments."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import yaml
from conftest import write_shards

from pmlm.alphabet import CLS_ID, EOS_ID, FIRST_RESIDUE_ID, PAD_ID
from pmlm.choices import Precision
from pmlm.cli import main
from pmlm.config.pretraining import TrainConfig
from pmlm.errors import ConfigError
from pmlm.model.objectives import pretraining_losses
from pmlm.pretrained import build_model
from pmlm.train import budget
from pmlm.train.jobs import pretrain_resources
from pmlm.train.pretrain import train
from pmlm.train.step_layout import CARD_HEADROOM, StepLayout, choose_layout

RESIDUES = 100  # with mask_prob 0.15 every row has exactly 15 masked residues (floor(15 + u) = 15)


def recipe(objective: str, hidden: int, layers: int, budget_tokens: int, accumulation: int = 1, **changes) -> dict:
    """A recipe whose step is ``accumulation`` micro-batches of ``budget_tokens`` on one rank."""
    overrides = {"num_layers": layers, "hidden": hidden, "ffn": 4 * hidden, "heads": 4, "max_len": RESIDUES + 2}
    overrides["attention_dropout"] = 0.0  # CPU attention dropout is not modelled (its blockwise kernel)
    return {
        "model": {"preset": "tiny", "overrides": {**overrides, **changes}},
        "objective": {"name": objective},
        "optim": {"lr": 1e-3, "warmup_steps": 1, "total_steps": 3},
        # pad_to_multiple 1: rows of RESIDUES + 2 tokens exactly, so the largest micro-batch is every batch
        "tokens_per_step": budget_tokens * accumulation,
        "data": {"tokens_per_batch": budget_tokens, "buffer_rows": 64, "num_workers": 0, "pad_to_multiple": 1},
        "eval_every": 0,
        "eval_batches": 1,
        "save_every": 0,
        "log_every": 1,
        "tensorboard": False,
        "device": "cpu",
    }


def _params(cfg: TrainConfig) -> budget.Parameters:
    return budget.count_parameters(cfg.model_config(), cfg.objective.kind)


def equal_rows(cfg: TrainConfig) -> torch.Tensor:
    batch = budget.largest_micro_batch(cfg)  # one micro-batch per step
    tokens = torch.full((batch.rows, batch.width), PAD_ID, dtype=torch.long)
    tokens[:, 0], tokens[:, RESIDUES + 1] = CLS_ID, EOS_ID
    g = torch.Generator().manual_seed(0)
    tokens[:, 1 : RESIDUES + 1] = torch.randint(
        FIRST_RESIDUE_ID, FIRST_RESIDUE_ID + 20, (batch.rows, RESIDUES), generator=g
    )
    return tokens


# the profiler sees the calling thread's allocations only (budget.measured_bytes): measurements use single_thread
CASES = [(o, bf16) for o in ("mlm", "pmlm", "pmlm_pair_only") for bf16 in (False, True)]


@pytest.mark.parametrize("objective, bf16", CASES)
def test_kept_tensors_are_the_live_bytes_after_a_forward(objective, bf16, single_thread):
    """Tensor by tensor: what the estimate says autograd keeps (plus the weights and, under autocast, their bf16
    copies) is what the allocator still holds once the loss is computed; 1 % covers the batch, masks, targets
    and counters, which are alive too and not counted."""
    cfg = TrainConfig.from_dict(recipe(objective, 48, 3, 2448))
    batch, tokens = budget.largest_micro_batch(cfg), equal_rows(cfg)
    precision = budget.Arithmetic(Precision.BF16 if bf16 else Precision.FP32, "cpu")
    graph = {}

    def forward():
        torch.manual_seed(0)
        graph["model"] = build_model(cfg.model_config(), cfg.objective)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            graph["out"] = pretraining_losses(graph["model"], tokens, cfg.objective, torch.Generator().manual_seed(0))

    _, live = budget.measured_bytes(forward, torch.device("cpu"))
    params = budget.count_parameters(cfg.model_config(), cfg.objective.kind)
    kept = sum(budget.encoder_bytes(cfg.model_config(), batch, precision).values())
    kept += sum(budget.head_bytes(cfg.model_config(), cfg.objective.kind, batch, precision).values())
    kept += budget.FP32 * params.total + (budget.BF16 * params.linear if bf16 else 0)
    assert abs(live - kept) <= 0.01 * kept, (live, kept)
    assert graph["out"].loss.requires_grad  # the graph was alive when the bytes were read


@pytest.mark.parametrize("objective, bf16", CASES)
def test_the_estimate_is_the_measured_peak_of_training_steps(objective, bf16, single_thread, tmp_path):
    """Three optimizer steps (the first allocates AdamW's state): fp32 through pmlm's training loop itself, bf16
    by hand under CPU autocast (the loop allows bf16 on CUDA only). The kept tensors are counted exactly (test
    above); when the step peaks beside them depends on the order in which the backward frees the last layer's
    tensors and allocates gradients, so the working-set term is known to half its size; 1 % covers indices,
    masks and the batch."""
    accumulation = 1 if bf16 else 2
    cfg = TrainConfig.from_dict(recipe(objective, 48, 3, 2448, accumulation))
    precision = budget.Arithmetic(Precision.BF16 if bf16 else Precision.FP32, "cpu")
    estimate = budget.peak_memory(cfg, _params(cfg), 1, precision, accumulation)
    batch = budget.largest_micro_batch(cfg, 1, accumulation)
    rng = np.random.default_rng(0)
    rows = [(rng.integers(0, 20, RESIDUES) + FIRST_RESIDUE_ID).astype(np.uint8) for _ in range(96)]
    shards = write_shards(tmp_path / "shards", {"train": rows, "valid": rows[:8]})

    def loop_steps():
        assert train(cfg, shards, tmp_path / "run") == 0

    def autocast_steps():
        tokens = equal_rows(cfg)
        torch.manual_seed(0)
        model = build_model(cfg.model_config(), cfg.objective)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        generator = torch.Generator().manual_seed(0)
        for _ in range(3):
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = pretraining_losses(model, tokens, cfg.objective, generator).loss
            loss.backward()
            optimizer.step()

    measured, _ = budget.measured_bytes(autocast_steps if bf16 else loop_steps, torch.device("cpu"))
    working = estimate["bytes"]["backward_working_set"]
    assert abs(estimate["total_bytes"] - measured) <= working / 2 + 0.01 * measured, (estimate, measured)
    assert estimate["micro_batch"]["rows"] == batch.rows == 24 and batch.masked == 15


def test_counts_and_shapes():
    cfg = TrainConfig.from_dict(recipe("pmlm", 48, 3, 2448))
    model = build_model(cfg.model_config(), cfg.objective)
    params = budget.count_parameters(cfg.model_config(), cfg.objective.kind)
    assert params.total == sum(p.numel() for p in model.parameters())
    assert params.per_layer == sum(p.numel() for p in model.encoder.layers[1].parameters())
    batch = budget.largest_micro_batch(cfg)
    assert (batch.rows, batch.width, batch.tokens, batch.pairs) == (24, 102, 2448, 24 * 105)
    # base: 262,144 tokens per step are 512 rows of 510 residues, ceil(0.15 x 510) = 77 masked each; over 4 GPUs x
    # 4 micro-batches, 32 rows each; over 3 x 5 (a layout that does not divide the rows), up to ceil(512 / 15) = 35
    base_cfg = TrainConfig.from_yaml("config/train/base.yaml")
    base = budget.largest_micro_batch(base_cfg, 4, 4)
    assert (base.rows, base.width, base.masked) == (32, 512, 77)
    assert budget.largest_micro_batch(base_cfg, 3, 5).rows == 35


def test_fsdp_shards_the_static_memory():
    xl = TrainConfig.from_yaml("config/train/xl.yaml", ["objective.name=pmlm_pair_only"])
    # the same micro-batch: one rank accumulating four, or four ranks one each
    params, bf16 = _params(xl), budget.Arithmetic(Precision.BF16)
    one, four = (budget.peak_memory(xl, params, world, bf16, 4 // world) for world in (1, 4))
    assert one["bytes"]["adamw_state"] == 8 * params.total and four["bytes"]["adamw_state"] == 2 * params.total
    assert four["bytes"]["layers"] == one["bytes"]["layers"]  # activations are per rank, never sharded
    base = TrainConfig.from_yaml("config/train/base.yaml")
    ddp = budget.peak_memory(base, _params(base), 4, bf16)
    assert ddp["bytes"]["ddp_buckets"] == 4 * ddp["parameters"] and ddp["bytes"]["weights"] == 4 * ddp["parameters"]


def test_cpu_attention_dropout_is_not_estimated():
    cfg = TrainConfig.from_dict(recipe("pmlm", 32, 1, 1020, attention_dropout=0.1))
    with pytest.raises(ConfigError, match="attention dropout on CPU"):
        budget.peak_memory(cfg, _params(cfg), 1, budget.Arithmetic(Precision.FP32, "cpu"))


def write_workflow(tmp_path, models: list[dict]) -> tuple:
    recipe_path = tmp_path / "tiny.yaml"
    cfg = recipe("pmlm", 32, 2, 1020)
    cfg["optim"]["total_steps"], cfg["tokens_per_step"] = 5000, 1020 * 3 * 2  # 2 GPUs x 3 micro-batches
    recipe_path.write_text(yaml.safe_dump(cfg))
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"pretrain": {"recipes": {"tiny": str(recipe_path)}, "models": models}}))
    profile = tmp_path / "profile"
    profile.mkdir()
    resources = {"gpu": 2, "runtime": 60, "slurm_extra": "'--signal=USR1@300'"}
    (profile / "config.yaml").write_text(yaml.safe_dump({"set-resources": {"pretrain": resources}}))
    return config, profile


def test_plan_arithmetic(tmp_path, capsys):
    models = [
        {"dataset": "d", "objective": "pmlm", "preset": "tiny"},
        {"dataset": "d", "objective": "mlm", "preset": "tiny"},
    ]
    config, profile = write_workflow(tmp_path, models)
    args = ["plan", "--configfile", str(config), "--profile", str(profile), "--tokens-per-second", "500", "--json"]
    assert main(args) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["resources"]["gpus"] == 2 and result["resources"]["warning_s"] == 300
    pmlm, mlm = result["jobs"]
    assert pmlm["job"] == "d/pmlm-tiny" and mlm["job"] == "d/mlm-tiny"
    assert pmlm["tokens_per_step"] == 1020 * 3 * 2 and pmlm["tokens"] == 1020 * 3 * 2 * 5000
    hours = pmlm["tokens"] / 500 / 3600
    assert pmlm["gpu_hours"] == round(hours) and pmlm["wall_days"] == round(hours / 2 / 24, 1)
    assert pmlm["segments"] == math.ceil(hours / 2 * 60 / (60 - 5))  # 60-minute jobs, stopped 5 minutes early
    assert pmlm["memory"]["bf16"]["total_bytes"] < pmlm["memory"]["fp32"]["total_bytes"]
    assert mlm["memory"]["bf16"]["total_bytes"] < pmlm["memory"]["bf16"]["total_bytes"]  # no pair head
    # a throughput file per preset, and the table form
    table = tmp_path / "throughput.yaml"
    table.write_text("tokens_per_gpu_second: {tiny: 250}\n")
    assert main(["plan", "--configfile", str(config), "--profile", str(profile), "--throughput", str(table)]) == 0
    out = capsys.readouterr().out
    assert "| d/pmlm-tiny | 2 | 5,000 | 6,120 | 3.06e+07 | 250 |" in out and "assumed" not in out
    table.write_text("tokens_per_gpu_second: {tiny: fast}\n")
    args = ["plan", "--configfile", str(config), "--profile", str(profile), "--throughput", str(table)]
    assert main(args) == 2
    assert "tokens_per_gpu_second.tiny must be a positive number" in capsys.readouterr().err


def test_plan_of_the_paper_config(capsys):
    assert main(["plan", "--configfile", "config/paper.yaml", "--throughput", "none.yaml", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    jobs = {row["job"]: row for row in result["jobs"]}
    assert len(jobs) == 6 and "ur50-release/pmlm-650m" not in jobs  # the release is imported, not trained
    resources = pretrain_resources("profiles/slurm")
    for row in jobs.values():
        assert row["throughput_source"].startswith("assumed") and row["gpus"] == resources["gpus"]
        assert row["segments"] >= 1 and all(card["peak_gib"] > 0 for card in row["cards"].values())
    # the paper's base runs took 24 V100 x ~3 weeks: the assumption reproduces that for PMLM-base
    base = jobs["uniref50/pmlm-base"]
    assert base["gpu_hours"] == pytest.approx(24 * 21 * 24, rel=1e-3)
    xl = jobs["uniref50/pmlm_pair_only-xl"]
    assert xl["memory"]["bf16"]["sharded"] and xl["memory"]["bf16"]["world_size"] == resources["gpus"]


def test_the_paper_batch_is_the_same_on_any_number_of_gpus(capsys):
    """The recipe states the step's tokens; the GPU count and the card set only the micro-batch and accumulation."""
    steps = {}
    for gpus in (1, 4, 8):
        assert main(["plan", "--configfile", "config/paper.yaml", "--throughput", "none.yaml", "--gpus", str(gpus),
                     "--json"]) == 0  # fmt: skip
        for row in json.loads(capsys.readouterr().out)["jobs"]:
            steps.setdefault(row["job"], set()).add(row["tokens_per_step"])
            for card, layout in row["cards"].items():
                assert layout["micro_batch"] == -(-262_144 // gpus // layout["accumulation"]), (row["job"], card)
                assert layout["fits"]  # auto: the largest micro-batch the card holds
    assert all(values == {262_144} for values in steps.values())
    # the text form prints the same figure
    assert main(["plan", "--configfile", "config/paper.yaml", "--throughput", "none.yaml", "--gpus", "8"]) == 0
    assert "| uniref50/pmlm-base | 8 | 2,000,000 | 262,144 |" in capsys.readouterr().out

    # a GPU count that does not divide the batch (the paper's 24 V100s), and a micro-batch that does not divide a
    # GPU's share: the rows split as evenly as they go, each micro-batch at most the share over the accumulation
    assert main(["plan", "--configfile", "config/paper.yaml", "--throughput", "none.yaml", "--gpus", "24",
                 "--json"]) == 0  # fmt: skip
    for row in json.loads(capsys.readouterr().out)["jobs"]:
        assert row["tokens_per_step"] == 262_144 and row["gpus"] == 24
        for card, layout in row["cards"].items():
            if "micro_batch" in layout:
                assert layout["micro_batch"] == -(-10_923 // layout["accumulation"]), (row["job"], card)
    args = ["plan", "--recipe", "config/train/base.yaml", "--gpus", "4", "--set", "data.tokens_per_batch=24576",
            "--json"]  # fmt: skip
    assert main(args) == 0
    cards = json.loads(capsys.readouterr().out)["jobs"][0]["cards"]
    assert {(c["micro_batch"], c["accumulation"]) for c in cards.values()} == {(21_846, 3)}  # 65,536 in 3
    # an explicit micro-batch a card does not hold is shown as such
    args = ["plan", "--recipe", "config/train/base.yaml", "--gpus", "1", "--set", "data.tokens_per_batch=131072",
            "--json"]  # fmt: skip
    assert main(args) == 0
    cards = json.loads(capsys.readouterr().out)["jobs"][0]["cards"]
    assert cards["40 GB"]["accumulation"] == 2 and not cards["40 GB"]["fits"] and cards["80 GB"]["fits"]


def test_an_old_recipe_with_grad_accum_is_told_what_replaced_it(tmp_path):
    old = tmp_path / "old.yaml"
    old.write_text("tokens_per_step: 4096\ngrad_accum: 4\n")
    with pytest.raises(ConfigError, match=r"old.yaml: grad_accum is derived now: tokens_per_step / "):
        TrainConfig.from_yaml(old)


def test_the_step_layout_splits_rows_and_sizes_the_micro_batch_by_the_card():
    layout = StepLayout(4096, 1024, 2, 2)
    # 10 rows over 4 parts: 3, 3, 2, 2, rank 0 the first two; 3 rows: the fourth part is empty
    assert layout.rank_parts(10, 0) == [(0, 3), (3, 6)] and layout.rank_parts(10, 1) == [(6, 8), (8, 10)]
    assert layout.rank_parts(3, 1) == [(2, 3), (3, 3)]

    # auto: the fewest micro-batches per rank whose estimate leaves CARD_HEADROOM of the card; one fewer would not
    large = TrainConfig.from_yaml("config/train/large.yaml")
    bf16, params = budget.Arithmetic(Precision.BF16), _params(large)
    for card in (24 * budget.GIB, 40 * budget.GIB):  # cards that need an accumulation (80 GiB holds one micro-batch)
        chosen = choose_layout(large, 4, card, bf16, params)
        assert chosen.micro_tokens == -(-large.tokens_per_step // 4 // chosen.accumulation) and not chosen.note
        fits = budget.peak_memory(large, params, 4, bf16, chosen.accumulation)["total_bytes"]
        fewer = budget.peak_memory(large, params, 4, bf16, chosen.accumulation - 1)["total_bytes"]
        assert fits <= card * (1 - CARD_HEADROOM) < fewer
    # without a card (CPU): one micro-batch per rank; a recipe the estimate does not model: the same, and a note
    assert choose_layout(large, 4).accumulation == 1
    tiny_tmlm = TrainConfig.from_yaml("config/train/tiny.yaml", ["objective.name=tmlm"])
    tmlm = choose_layout(tiny_tmlm, 2, 80 * budget.GIB, None, _params(tiny_tmlm))
    assert tmlm.accumulation == 1 and "does not model the triple head" in tmlm.note
    # a card too small for one row per micro-batch
    with pytest.raises(
        ConfigError, match="no micro-batch of tokens_per_step 262,144 over 4 ranks fits a card of 2 GiB"
    ):
        choose_layout(large, 4, 2 * budget.GIB, bf16, params)


# -- the inference section: GPU-hours and disk per encoder and output ----------------------------------------------


def _forward(layers: int, hidden: int, ffn: int, tokens: int) -> int:
    """A forward pass by hand: the encoder's matmuls on every token, attention's two n x n products."""
    return 2 * layers * (4 * hidden**2 + 2 * hidden * ffn) * tokens + 4 * layers * hidden * tokens**2


def _inference_workflow(tmp_path, dims: dict, sequences: dict[str, str] | None, **section) -> tuple:
    encoder = tmp_path / "encoder"
    encoder.mkdir(parents=True)
    (encoder / "model.json").write_text(
        json.dumps({"format": "pmlm-encoder/3", "model": dims, "objective": {"name": "pmlm"}})
    )
    fasta = tmp_path / "in.fasta"
    if sequences is not None:
        fasta.write_text("".join(f">{k}\n{v}\n" for k, v in sequences.items()))
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"inference": {"fasta": str(fasta), "encoders": {"e": str(encoder)}, **section}}))
    profile = tmp_path / "profile.yaml"
    profile.write_text(yaml.safe_dump({"set-resources": {"score_shard": {"runtime": 30}}}))
    return config, profile


def test_inference_plan_arithmetic(tmp_path, capsys):
    """Two sequences of 6 and 15 residues through an encoder of window 10 (the second read as windows [0, 10) and
    [5, 15)), priced by hand: passes, FLOPs, GPU-hours at 1e9 FLOP/s, shard jobs, rows and disk."""
    layers, C, F = 2, 8, 16
    dims = {"num_layers": layers, "hidden": C, "ffn": F, "max_len": 12, "pair_head": True, "pair_vocab": "standard"}
    config, profile = _inference_workflow(
        tmp_path, dims, {"a": "MKVLAG", "b": "MKVLAGIVGLLLAAC"}, outputs=["embeddings", "substitutions", "contacts"],
        residues_per_shard=10, contacts={"top": "all", "min_separation": 2},
    )  # fmt: skip
    args = ["plan", "--configfile", str(config), "--profile", str(profile), "--inference-flops", "1e9", "--json"]
    assert main(args) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["jobs"] == []  # nothing to pre-train
    rows = {r["output"]: r for r in result["inference"]}

    token_head = 2 * (C * C + 20 * C)  # per residue the token head reads
    embeddings = _forward(layers, C, F, 8) + 2 * _forward(layers, C, F, 12)
    assert rows["embeddings"]["passes"] == 3 and rows["embeddings"]["flops"] == embeddings
    assert rows["embeddings"]["rows"] == 21
    assert rows["embeddings"]["disk_gb"] * 1e9 == 21 * (4 * C + 8) + 2 * (4 * C + 24)
    masked = 6 * (_forward(layers, C, F, 8) + token_head) + 15 * (_forward(layers, C, F, 12) + token_head)
    assert rows["substitutions"]["passes"] == 21 and rows["substitutions"]["flops"] == masked
    assert rows["substitutions"]["gpu_hours"] == masked / 1e9 / 3600
    assert rows["substitutions"]["rows"] == 19 * 21 and rows["substitutions"]["disk_gb"] * 1e9 == 19 * 21 * 8
    # 21 residues, at most 10 a shard: 3 shards, but never more than the 2 records; the profile's 30-minute limit
    assert rows["substitutions"]["shards"] == 2 and rows["substitutions"]["hours_per_shard"] == masked / 1e9 / 3600 / 2
    assert rows["substitutions"]["runtime_min"] == 30 and rows["embeddings"]["runtime_min"] is None

    def pair_window(w: int) -> float:  # a window's pass, the token head on its residues, the pair head on its pairs
        pairs = w * (w - 1) // 2
        return _forward(layers, C, F, w + 2) + w * token_head + 2 * (2 * C * C * (w + pairs) + 2 * C * 400 * 2 * pairs)

    assert rows["contacts"]["flops"] == pair_window(6) + 2 * pair_window(10)
    # pairs j - i >= 2: 10 of the 6 residues; of the 15, 36 in each window less the 6 of their overlap [5, 10)
    assert rows["contacts"]["rows"] == 10 + 36 + 36 - 6

    # N proteins of L residues price the same as a FASTA of them; the table form
    same = {f"s{k}": "MKVLAGIVGLLLAAC" for k in range(3)}
    config, profile = _inference_workflow(tmp_path / "fasta", dims, same, outputs=["substitutions"])
    assert main(["plan", "--configfile", str(config), "--profile", str(profile), "--json"]) == 0
    from_fasta = json.loads(capsys.readouterr().out)["inference"]
    args = ["plan", "--configfile", str(config), "--profile", str(profile), "--proteins", "3", "--mean-length", "15"]
    assert main([*args, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["inference"] == from_fasta
    assert main(args) == 0
    table = capsys.readouterr().out
    assert table.startswith("| encoder | output | precision |") and "| e | substitutions | fp32 | 45 |" in table
    assert "* assumed" in table and "3 proteins of 15 residues" in table


def test_inference_plan_of_a_proteome_with_the_650m_model(tmp_path, capsys):
    """docs/inference.md's example: every single substitution of 20,000 proteins of 550 residues by an encoder of the
    released PMLM-650M's dims (34 x 1280, ffn 5120, 768 positions), bf16, at 1e14 model FLOP/s per GPU."""
    dims = {"num_layers": 34, "hidden": 1280, "ffn": 5120, "max_len": 768, "pair_head": True, "pair_vocab": "full"}
    config, profile = _inference_workflow(tmp_path, dims, None, outputs=["substitutions"], precision="bf16")
    args = [
        "plan",
        "--configfile",
        str(config),
        "--profile",
        str(profile),
        "--proteins",
        "20000",
        "--mean-length",
        "550",
    ]
    assert main([*args, "--inference-flops", "1e14", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)["inference"]
    per_pass = _forward(34, 1280, 5120, 552) + 2 * (1280**2 + 20 * 1280)  # one masked site in its 550-residue window
    assert row["passes"] == 20_000 * 550 and row["flops"] == 20_000 * 550 * per_pass
    assert row["gpu_hours"] == pytest.approx(8.70e18 / 1e14 / 3600, rel=1e-3)  # 24 GPU-hours
    assert row["shards"] == 44 and row["rows"] == 209_000_000  # 11,000,000 residues, 250,000 a shard (the default)
    # without a FASTA or --proteins: one line saying what to give
    assert main(["plan", "--configfile", str(config), "--profile", str(profile)]) == 2
    assert "config.inference.fasta" in capsys.readouterr().err


def test_several_configfiles_merge_as_snakemake_merges_them(tmp_path, capsys):
    """A later file updates an earlier one's mappings key by key and replaces anything else (a list): the paper's
    config with one job's recipe changed and the model list cut to two prices those two, with the change."""
    extra = tmp_path / "mine.yaml"
    extra.write_text(
        "pretrain:\n  set: {optim.total_steps: 100000}\n  models:\n"
        "    - {dataset: uniref50, objective: mlm, preset: base}\n    - {dataset: uniref50, objective: pmlm, preset: base}\n"
    )
    args = ["plan", "--configfile", "config/paper.yaml", str(extra), "--throughput", "none.yaml", "--json"]
    assert main(args) == 0
    result = json.loads(capsys.readouterr().out)
    assert [r["job"] for r in result["jobs"]] == ["uniref50/mlm-base", "uniref50/pmlm-base"]
    assert {r["steps"] for r in result["jobs"]} == {100_000}
    assert {r["dataset"] for r in result["data"]} == {"uniref50", "pfam"}  # datasets: kept from the first file
    # one file reads as before, and a missing one is one line
    assert main(["plan", "--configfile", "config/paper.yaml", str(tmp_path / "none.yaml")]) == 2
    assert "none.yaml: no such file" in capsys.readouterr().err


def test_a_released_encoder_is_priced_before_its_download(capsys):
    """config/inference.yaml names the released PMLM-650M by its pretrain.models entry, whose release states the dims:
    nothing need be downloaded or imported to price a proteome through it."""
    args = ["plan", "--configfile", "config/inference.yaml", "--proteins", "20000", "--mean-length", "550", "--json"]
    assert main(args) == 0
    rows = json.loads(capsys.readouterr().out)["inference"]
    assert {r["output"] for r in rows} == {"embeddings", "substitutions", "contacts"}
    assert all(r["source"].endswith("pretrain.models[0].release.model") and r["window"] == 766 for r in rows)
    # the same row as an encoder of those dims priced from its model.json (the proteome test above): 8.70e18 FLOPs
    assert next(r for r in rows if r["output"] == "substitutions")["flops"] == pytest.approx(8.70e18, rel=1e-3)


def test_rates_given_per_preset_and_the_padding_counted_on_one_side(tmp_path, capsys):
    base = ["plan", "--configfile", "config/paper.yaml", "--throughput", "none.yaml", "--gpus", "8", "--json"]
    assert main([*base, "--tokens-per-second", "base=12000"]) == 0
    jobs = {r["job"]: r for r in json.loads(capsys.readouterr().out)["jobs"]}
    assert {jobs[j]["tokens_per_gpu_second"] for j in ("pfam/mlm-base", "uniref50/pmlm-base")} == {12000}
    assert jobs["uniref50/pmlm-base"]["throughput_kind"] == "option"
    # another preset at the same model-FLOP rate: large has about 3x base's FLOPs per token
    large = jobs["uniref50/pmlm-large"]
    assert large["throughput_kind"] == "derived" and "given as --tokens-per-second base" in large["throughput_source"]
    assert 3500 < large["tokens_per_gpu_second"] < 4500
    # a bare N is the first job's preset and objective; PRESET/OBJECTIVE one objective's
    assert main([*base, "--tokens-per-second", "14000", "--tokens-per-second", "base/pmlm=11000"]) == 0
    jobs = {r["job"]: r for r in json.loads(capsys.readouterr().out)["jobs"]}
    assert jobs["pfam/mlm-base"]["tokens_per_gpu_second"] == 14000
    assert jobs["pfam/pmlm-base"]["tokens_per_gpu_second"] == 11000
    for bad in ("base=", "fast", "base/xyz=100", "=-3"):
        assert main([*base, "--tokens-per-second", bad]) == 2
        err = capsys.readouterr().err
        assert err.startswith("pmlm plan: error: --tokens-per-second") and len(err.splitlines()) == 1, err
    # a measured rate counts non-pad tokens: the job's tokens lose the padding share its measurement had
    table = tmp_path / "throughput.yaml"
    table.write_text(
        "tokens_per_gpu_second:\n  base:\n    pmlm: {tokens_per_second: 100000, card: X, padding_fraction: 0.1}\n"
    )
    assert main([*base[:3], "--throughput", str(table), "--gpus", "8", "--json"]) == 0
    jobs = {r["job"]: r for r in json.loads(capsys.readouterr().out)["jobs"]}
    pmlm = jobs["uniref50/pmlm-base"]
    assert pmlm["counted_tokens"] == round(pmlm["tokens"] * 0.9)
    assert pmlm["gpu_hours"] == round(pmlm["tokens"] * 0.9 / 100000 / 3600)
    assert jobs["uniref50/mlm-base"]["padding_fraction"] == 0.1  # derived from it: the same measurement's share


def test_the_plan_sets_each_model_beside_the_papers_stated_time(capsys):
    """The paper states hardware time, not steps, for PMLM-large and -xl: the plan says how many of the recipe's
    steps that time buys at the paper's own rate, so the xl row's multiple of the paper's time is explained."""
    assert main(["plan", "--configfile", "config/paper.yaml", "--throughput", "none.yaml", "--json"]) == 0
    jobs = {r["job"]: r for r in json.loads(capsys.readouterr().out)["jobs"]}
    assert jobs["uniref50/pmlm-base"]["paper"]["recipe_over_paper"] == pytest.approx(1.0, abs=0.01)
    xl = jobs["uniref50/pmlm_pair_only-xl"]
    assert xl["paper"]["gpu_hours"] == 16 * 14 * 24
    assert xl["paper"]["recipe_over_paper"] == pytest.approx(xl["gpu_hours"] / xl["paper"]["gpu_hours"], rel=0.01)
    assert 15 < xl["paper"]["recipe_over_paper"] < 20
    assert main(["plan", "--configfile", "config/paper.yaml", "--throughput", "none.yaml"]) == 0
    out = capsys.readouterr().out
    steps = xl["paper"]["steps_in_that_time"]
    assert "uniref50/pmlm_pair_only-xl: the paper trained this model on 16 V100" in out
    assert f"--set optim.total_steps={steps}" in out


def test_the_data_stage_is_priced_from_the_sources_stated_size(tmp_path, capsys):
    from pmlm.data.stage_cost import MEASURED

    assert main(["plan", "--configfile", "config/paper.yaml", "--throughput", "none.yaml", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)["data"]
    rows = {(r["dataset"], r["rule"]): r for r in data}
    assert len(rows) == 6
    split = rows["uniref50", "split_clusters"]
    assert split["cpu_hours"] == pytest.approx(30 * MEASURED["split_core_s"] / 3600)  # 30 M records of 320
    assert split["wall_hours"] == pytest.approx(split["cpu_hours"] / split["threads"])
    assert split["peak_gb"] == pytest.approx(30.0)
    shards = rows["uniref50", "tokenize_shards"]
    assert shards["disk_gb"] == pytest.approx(30e6 * 320 * MEASURED["shard_bytes_per_residue"] / 1e9)
    assert rows["pfam", "ingest_sequences"]["cpu_hours"] < rows["uniref50", "ingest_sequences"]["cpu_hours"]  # XML
    assert main(["plan", "--configfile", "config/paper.yaml", "--throughput", "none.yaml"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("| dataset | records | rule |") and "| uniref50 | 30.0 M x 320 | split_clusters |" in out
    # a source's estimate without its mean length is one line
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "sources:\n  mine: {url: 'file:x.fasta', estimate: {records: 5}}\ndatasets:\n  mine: {sources: [mine]}\n"
    )
    assert main(["plan", "--configfile", "config/paper.yaml", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "sources.mine.estimate: give records and mean_length" in err and len(err.splitlines()) == 1
