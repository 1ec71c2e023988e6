"""Benchmark: fine-tuning frozen, through LoRA adapters and in full, side by side.

Two parts, each printing one JSON line and a Markdown table:

* ``demo``: the demo's pre-trained encoder (``--encoder``, default the demo workflow's PMLM-tiny) fine-tuned three ways
  on the demo's net-charge table (a value per protein; the regression recipes) and on TAPE's secondary-structure task
  on the demo's PDB chains (Q3; ``config/finetune/ss3_tiny.yaml``), each as ``pmlm finetune`` runs it with its
  validation split (the best validation's head kept): the test metric (``pmlm evaluate``), trainable parameters, the
  saved run's size, the peak bytes of the allocator during two training steps (the profiler, one thread, as
  ``pmlm.train.budget.measured_bytes`` reads them) and the wall time of the whole run. The splits are made here by
  ``pmlm split-table`` and ``pmlm split-structures`` as the workflow makes them (MMseqs2 needed).
* ``650m``: the released PMLM-650M's shape (34 x 1280, ffn 5120, 20 heads, the full pair vocabulary), random weights,
  on the CPU: one AdamW step of full fine-tuning and of LoRA (rank 8 on qkv and proj) on one 128-residue protein,
  with a per-protein regression head: trainable parameters and the measured peak (weights included), against the bar
  LoRA / full <= 0.4. About 3 min and 14 GB of RAM on 2 cores.

    python bench/bench_finetune_modes.py                 # both parts
    python bench/bench_finetune_modes.py --part demo --steps 100
    python bench/bench_finetune_modes.py --quick         # a smoke run: 650m at 2 layers, demo at 10 steps
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from pmlm.adapters import attach
from pmlm.choices import Precision
from pmlm.config.finetuning import AdapterConfig, FinetuneConfig
from pmlm.finetune.cost import EncoderSpec, parameters, peak_memory, with_mode
from pmlm.finetune.finetune import finetune
from pmlm.finetune.head_scoring import evaluate
from pmlm.model.config import ModelConfig
from pmlm.model.objectives import ObjectiveConfig
from pmlm.model.task_heads import TaskModel
from pmlm.pretrained import build_model, load_head
from pmlm.tasks.registry import task_named
from pmlm.train.budget import Arithmetic, measured_bytes

REPO = Path(__file__).resolve().parent.parent
DEMO_ENCODER = REPO / "results" / "demo" / "pretrain" / "demo" / "pmlm-tiny" / "model.safetensors"
BAR = 0.4  # LoRA peak / full peak on the 650M shape
SHAPES = {
    "650m": {"num_layers": 34, "hidden": 1280, "ffn": 5120, "heads": 20, "max_len": 768, "pair_vocab": "full"},
    "quick": {"num_layers": 2, "hidden": 64, "ffn": 256, "heads": 4, "max_len": 130},
}


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", choices=("demo", "650m", "both"), default="both")
    ap.add_argument("--encoder", type=Path, default=DEMO_ENCODER, help="demo part: the encoder (default: %(default)s)")
    ap.add_argument("--steps", type=int, default=None, help="demo part: optimizer steps (default: the recipes')")
    ap.add_argument("--residues", type=int, default=128, help="650m part: the protein's length")
    ap.add_argument("--quick", action="store_true", help="a smoke run: 650m at 2 layers, demo at 10 steps")
    return ap.parse_args(argv)


# -- demo -----------------------------------------------------------------------------------------------------------


def splits(root: Path) -> dict[str, dict[str, Path]]:
    """The demo's task splits, as the workflow makes them."""
    table, structures = root / "net_charge", root / "demo_pdb"
    run = [sys.executable, "-m", "pmlm"]
    commands = [
        [*run, "split-table", str(REPO / "data/demo/net_charge.csv"), "--out-dir", str(table),
         "--fractions", "0.6", "0.1", "0.3"],
        [*run, "split-structures", str(REPO / "data/demo/pdb_chains_sample.jsonl.gz"), "--out-dir", str(structures),
         "--fractions", "0.8", "0.1", "0.1"],
    ]  # fmt: skip
    common = ["--min-seq-id", "0.3", "--coverage", "0.5", "--seed", "0", "--threads", "1"]
    # side by side: each is mostly MMseqs2's start-up and one thread's search
    jobs = [subprocess.Popen([*c, *common], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for c in commands]
    for job, command in zip(jobs, commands):
        _, err = job.communicate()
        if job.returncode != 0:
            sys.exit(f"bench_finetune_modes: {' '.join(command[3:5])} failed: {err.decode()[-500:]}")
    return {
        "net_charge": {s: table / f"{s}.parquet" for s in ("train", "valid", "test")},
        "ss3": {s: structures / f"{s}.jsonl" for s in ("train", "valid", "test")},
    }


def recipes(steps: int | None) -> dict[str, dict[str, FinetuneConfig]]:
    """Per task, the recipe of each mode: the task's tiny recipe frozen and in full; with LoRA, the demo's LoRA recipe
    for net charge, and for ss3 its own recipe with that recipe's adapters and adapter rate."""
    sets = ["device=cpu"]
    if steps is not None:
        sets += [f"optim.total_steps={steps}", f"optim.warmup_steps={max(1, steps // 10)}"]
        sets += [f"eval_every={max(1, steps // 5)}"]
    folder = REPO / "config/finetune"
    charge = [*sets, "data.label_column=net_charge"]
    lora = FinetuneConfig.from_yaml(folder / "regression_lora_tiny.yaml", charge)
    ss3 = FinetuneConfig.from_yaml(folder / "ss3_tiny.yaml", sets)
    regression = FinetuneConfig.from_yaml(folder / "regression_tiny.yaml", charge)
    return {
        "net_charge": {
            "frozen": with_mode(regression, "frozen"),
            "adapter": lora,
            "full": with_mode(regression, "full"),
        },
        "ss3": {
            "frozen": with_mode(ss3, "frozen"),
            "adapter": dataclasses.replace(
                ss3, freeze_encoder=False, adapter=lora.adapter, optim=dataclasses.replace(ss3.optim, lr=lora.optim.lr)
            ),
            "full": with_mode(ss3, "full"),
        },
    }


def demo(args: argparse.Namespace, root: Path) -> list[dict]:
    if not args.encoder.is_file():
        sys.exit(f"bench_finetune_modes: {args.encoder}: no encoder; run the demo first (snakemake --cores 2)")
    data = splits(root)
    rows = []
    for task, modes in recipes(10 if args.quick else args.steps).items():
        for mode, cfg in modes.items():
            files, out = data[task], root / f"{task}-{mode}"
            head = out / "head" / "head.safetensors"
            start = time.perf_counter()
            code = finetune(cfg, args.encoder, files["train"], out / "run", head, files["valid"])
            seconds = time.perf_counter() - start
            assert code == 0
            short = dataclasses.replace(cfg, optim=dataclasses.replace(cfg.optim, total_steps=2, warmup_steps=1))
            short = dataclasses.replace(short, eval_every=0, save_every=0)
            threads = torch.get_num_threads()
            torch.set_num_threads(1)  # the profiler sees the calling thread's allocations only
            peak, _ = measured_bytes(
                lambda s=short, f=files, o=out: finetune(s, args.encoder, f["train"], o / "peak"), torch.device("cpu")
            )
            torch.set_num_threads(threads)
            scores = evaluate(str(head), {"test": str(files["test"])}, out / "test.tsv", device="cpu")
            headline = task_named(cfg.task).headline
            value = next(r["value"] for r in scores if r["metric"] == headline)
            info = json.loads(head.with_suffix(".json").read_text())
            counts = parameters(load_head(head).model)
            rows.append({
                "task": task, "mode": mode, "metric": headline, "test": value, "kept_step": info["step"],
                "trainable": counts["trainable"], "encoder_parameters": counts["encoder"],
                "saved_bytes": head.stat().st_size, "encoder_bytes": args.encoder.stat().st_size,
                "peak_bytes": peak, "seconds": seconds, "steps": cfg.optim.total_steps,
            })  # fmt: skip
    return rows


# -- 650m -----------------------------------------------------------------------------------------------------------


def one_step(shape: dict, mode: str, residues: int) -> dict:
    """Build the model, one AdamW step on one protein; what the allocator handed out, weights included."""
    cfg = FinetuneConfig.from_dict({"task": "sequence_regression", "freeze_encoder": False})
    adapter = AdapterConfig(rank=8) if mode == "adapter" else None
    cfg = dataclasses.replace(cfg, adapter=adapter)
    model_cfg = ModelConfig(**shape, attention_dropout=0.0)  # the CPU dropout kernel is another path's
    seen = {}

    def step():
        torch.manual_seed(0)
        encoder = build_model(model_cfg, ObjectiveConfig(name="pmlm"))
        task = task_named(cfg.task)
        head = task.build_head(cfg, model_cfg.hidden)
        weights = attach(encoder, adapter) if adapter is not None else None
        model = TaskModel(encoder, head, cfg.task, "M", False, weights).train()
        trained = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(trained, lr=1e-4)
        tokens = torch.randint(4, 24, (1, residues + 2))
        mask = torch.ones(1, residues, dtype=torch.bool)
        start = time.perf_counter()
        model(tokens, mask).square().sum().backward()
        optimizer.step()
        seen["seconds"] = time.perf_counter() - start
        seen["counts"] = parameters(model)

    peak, _ = measured_bytes(step, torch.device("cpu"))
    spec = EncoderSpec(mode, model_cfg, "pmlm")
    short = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, batch_size=1))
    estimate = peak_memory(short, spec, residues, Arithmetic(Precision.FP32, "cpu"))["total_bytes"]
    return {"mode": mode, "peak_bytes": peak, "estimate_bytes": estimate, **seen}


def shape_650m(args: argparse.Namespace) -> list[dict]:
    torch.set_num_threads(1)  # the profiler sees the calling thread's allocations only
    shape = SHAPES["quick" if args.quick else "650m"]
    return [{"shape": "quick" if args.quick else "650m", **one_step(shape, mode, args.residues)}
            for mode in ("full", "adapter")]  # fmt: skip


def demo_table(rows: list[dict]) -> str:
    lines = [
        "| task | mode | test metric | kept step | trainable parameters | saved / encoder | peak memory | time |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r['task']} | {r['mode']} | {r['metric']} {r['test']:.3f} | {r['kept_step']} of {r['steps']} "
            f"| {r['trainable']:,} | {r['saved_bytes'] / r['encoder_bytes']:.1%} | {r['peak_bytes'] / 2**20:.1f} MiB "
            f"| {r['seconds']:.1f} s |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    result = {"bench": "finetune_modes", "torch": torch.__version__}
    with tempfile.TemporaryDirectory(prefix="pmlm-finetune-modes-") as tmp:
        if args.part in ("demo", "both"):
            result["demo"] = demo(args, Path(tmp))
            print(demo_table(result["demo"]))
        if args.part in ("650m", "both"):
            rows = shape_650m(args)
            result["650m"] = rows
            ratio = rows[1]["peak_bytes"] / rows[0]["peak_bytes"]
            result["650m_peak_ratio"] = ratio
            for r in rows:
                c = r["counts"]
                print(f"{r['shape']} {r['mode']}: {c['trainable']:,} trainable of {c['encoder']:,}, peak "
                      f"{r['peak_bytes'] / 2**30:.2f} GiB (pmlm plan's estimate {r['estimate_bytes'] / 2**30:.2f} GiB), "
                      f"step {r['seconds']:.1f} s")  # fmt: skip
            print(f"LoRA / full peak memory: {ratio:.3f} (bar <= {BAR})")
    print(json.dumps(result, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
