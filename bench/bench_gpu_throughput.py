"""Benchmark: pre-training throughput on a GPU, non-pad tokens/s and model-FLOPs utilisation (MFU).

For each model size (``--dims``, default base and xl) and crop length L (``--lengths``, default
512 and 1024), one set of batches is built and every model trains on exactly those sequences:

* ours, MLM and PMLM objectives with their released layers (attention dropout 0.1), in each attention
  layout (``--layouts``; on CUDA ``auto``, the packed layout under bf16: FlashAttention's variable-length
  kernel on jagged tensors, with dropout; and ``padded``, the key-masked SDPA reference),
  fed token-budget length-bucketed batches as the loader builds them (budget ``--token-budget``,
  width rounded up to a multiple of 8); ``--compile`` adds ``auto`` with compiled layers;
* HF transformers ``EsmForMaskedLM`` of the same dims and dropouts as our MLM (0.1 / 0.1; its default
  attention, learned absolute positions), fed the same sequences in random order in fixed batches of
  budget / L sequences, each padded to L: the usual HF Trainer set-up (needs ``transformers``; skipped if absent).

A step is masking + forward + backward + AdamW, bf16 autocast on CUDA (fp32 on CPU). Each model
runs ``--warmup`` untimed batches, then ``--rounds`` timed passes over ``--batches`` batches;
figures are medians over passes. Lengths: the train split of ``--shards`` (real proteins, the
loader's own batches) or, by default, a lognormal fit to UniProtKB lengths (median 300 residues,
sigma 0.65 in log space; ``bench_vs_esm.py``), clipped to L - 2 residues.

Model FLOPs of a batch, forward + backward (= 3 x forward), counted on non-pad tokens only::

    6 * N_mm * T                         encoder matmuls; N_mm = layers * (4 C^2 + 2 C F) weights, T non-pad tokens
  + 12 * layers * C * sum_s n_s^2        attention: per layer and sequence of n_s tokens, Q K^T and P V are
                                         n_s * n_s * C multiply-adds each (4 C n_s^2 FLOPs forward), x 3
  + 6 * (C^2 + 20 C) * M                 token head on the M masked residues (mlm, pmlm)
  + 6 * (2 C^2 (U + P) + 2 C K * 2 P)    pair head (pmlm): the difference projection on the U masked positions
                                         with a partner, the product projection on the P unordered pairs, the
                                         output layer on the 2 P ordered pairs; K = 400 classes

(12 * layers * C * L per token for a sequence of L tokens; embeddings, norms and softmax are not
counted). HF ESM gets the MLM formula on the same tokens: its padding is work, not model FLOPs.
MFU = model FLOPs / step time / the device's dense bf16 peak (table below, ``--peak-tflops``
overrides; none on CPU). Bars (issue: GPU pre-training): PMLM-base MFU >= 45 %, PMLM / MLM step
<= 1.15 at base dims and L = 512, ours / HF tokens/s >= 2.

    python bench/bench_gpu_throughput.py --out bench/out/gpu_throughput          # on the GPU machine
    python bench/bench_gpu_throughput.py --shards results/demo/data/demo/shards  # real lengths
    python bench/bench_gpu_throughput.py --smoke                                 # tiny dims, CPU, seconds
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_vs_esm import (
    LENGTH_MEDIAN,
    LENGTH_SIGMA,
    MIN_RESIDUES,
    bucketed_batches,
    build_hf,
    make_sequences,
    pad_batch,
)

from pmlm.alphabet import FIRST_RESIDUE_ID, PAD_ID
from pmlm.model import ObjectiveConfig, mask_tokens, model_config, pretraining_losses
from pmlm.model.objectives import IGNORE_INDEX
from pmlm.pretrained import build_model
from pmlm.train import budget

# dense bf16 tensor-core peak, TFLOP/s (vendor data sheets); matched in order against the device name
PEAK_BF16_TFLOPS = (
    ("H100 PCIe", 756.0),
    ("H100 NVL", 835.0),
    ("H100", 989.0),
    ("H200", 989.0),
    ("GH200", 989.0),
    ("A100", 312.0),
)
DIMS = {
    "base": {"num_layers": 12, "hidden": 768, "ffn": 3072, "heads": 12},
    "xl": {"num_layers": 36, "hidden": 1280, "ffn": 5120, "heads": 20},
    "tiny": {"num_layers": 2, "hidden": 64, "ffn": 256, "heads": 4},
}
BARS = {"mfu_pmlm_base": 0.45, "pmlm_over_mlm_base_512": 1.15, "ours_over_hf": 2.0}
PAD_MULTIPLE = 8  # the loader's data.pad_to_multiple


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--smoke", action="store_true", help="tiny dims, L=64, 2 batches, on CPU unless --device says otherwise"
    )
    p.add_argument("--dims", default="base,xl", help=f"comma-separated model sizes ({', '.join(DIMS)})")
    p.add_argument("--lengths", default="512,1024", help="comma-separated crop lengths L in tokens incl. <cls>/<eos>")
    p.add_argument("--objectives", default="mlm,pmlm")
    p.add_argument(
        "--layouts", default=None, help="our attention layouts (default: auto,padded on CUDA, padded,packed on CPU)"
    )
    p.add_argument("--compile", action="store_true", help="also time ours with compiled layers (layout auto)")
    p.add_argument("--no-hf", action="store_true", help="skip HF EsmForMaskedLM")
    p.add_argument("--token-budget", type=int, default=16384, help="padded tokens per batch (config/train: 16384)")
    p.add_argument("--batches", type=int, default=12, help="timed batches per pass")
    p.add_argument("--warmup", type=int, default=3, help="untimed batches per model")
    p.add_argument("--rounds", type=int, default=3, help="timed passes per model (median reported)")
    p.add_argument("--shards", default=None, help="take lengths and batches from this shard folder's train split")
    p.add_argument("--median", type=float, default=LENGTH_MEDIAN, help="median residues of the lognormal lengths")
    p.add_argument(
        "--peak-tflops", type=float, default=None, help="dense bf16 peak for MFU (default: from the device name)"
    )
    p.add_argument("--device", default="auto", help="auto (cuda if present), cpu or cuda")
    p.add_argument("--out", default="bench/out/gpu_throughput", help="writes OUT.json and OUT.md")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.smoke:
        args.dims, args.lengths, args.token_budget, args.median = "tiny", "64", 512, 30
        args.batches, args.warmup, args.rounds = 2, 1, 1
    return args


def peak_flops(device: torch.device, override: float | None) -> tuple[float | None, str]:
    if override:
        return override * 1e12, "--peak-tflops"
    if device.type != "cuda":
        return None, "no peak for CPU (give --peak-tflops)"
    name = torch.cuda.get_device_name(device)
    for key, tflops in PEAK_BF16_TFLOPS:
        if key in name:
            return tflops * 1e12, f"table: {key}"
    return None, f"unknown device {name!r} (give --peak-tflops)"


def model_flops(dims: dict, objective: str, seq_tokens: list[int], valid_per_seq: list[int]) -> int:
    """Forward + backward model FLOPs of one batch (module docstring; ``pmlm.train.budget.model_flops``)."""
    return budget.model_flops(dims["num_layers"], dims["hidden"], dims["ffn"], objective, seq_tokens, valid_per_seq)


def make_batches(args, L: int, device: torch.device) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(ours: warm-up + timed length-bucketed batches, their sequences) for crop length L."""
    g = torch.Generator().manual_seed(args.seed)
    want = args.warmup + args.batches
    if args.shards:
        from pmlm.train.loader import ShardStream

        stream = ShardStream(
            args.shards,
            "train",
            tokens_per_batch=args.token_budget,
            max_len=L,
            buffer_rows=16384,
            seed=args.seed,
            pad_to_multiple=PAD_MULTIPLE,
        )
        batches = []
        for epoch in range(1000):  # small shard sets: later epochs recrop and reshuffle
            for batch in stream.epoch_batches(epoch):
                batches.append(batch.tokens)
                if len(batches) == want:
                    break
            if len(batches) == want:
                break
    else:
        normal = torch.randn(max(4096, 64 * want), generator=g, dtype=torch.float64)
        lengths = (
            torch.exp(torch.log(torch.tensor(args.median)) + LENGTH_SIGMA * normal).round().clamp(MIN_RESIDUES, L - 2)
        )
        pool = make_sequences([int(n) for n in lengths], g)
        buckets = bucketed_batches(pool, args.token_budget)  # shortest first, as a loader's shuffle buffer
        # evenly spaced over the length-sorted batches (a token-weighted sample of the epoch), shuffled
        chosen = [buckets[int((i + 0.5) * len(buckets) / want)] for i in range(want)]
        chosen = [chosen[i] for i in torch.randperm(want, generator=g).tolist()]
        batches = []
        for idx in chosen:
            seqs = [pool[k] for k in idx]
            width = -(-max(s.numel() for s in seqs) // PAD_MULTIPLE) * PAD_MULTIPLE
            batches.append(pad_batch(seqs, width))
    return [b.to(device) for b in batches]


def hf_batches_for(batches: list[torch.Tensor], L: int, size: int, seed: int, device) -> list[torch.Tensor]:
    """The same sequences in random order, fixed batches of ``size``, each padded to L."""
    seqs = [row[row.ne(PAD_ID)].cpu() for b in batches for row in b]
    order = torch.randperm(len(seqs), generator=torch.Generator().manual_seed(seed)).tolist()
    return [pad_batch([seqs[k] for k in order[i : i + size]], L).to(device) for i in range(0, len(order), size)]


class Runner:
    """One model + optimizer; ``step(batch, seed)`` is a full training step."""

    def __init__(self, kind: str, model, objective: ObjectiveConfig, device: torch.device):
        self.kind, self.model, self.objective, self.device = kind, model.to(device).train(), objective, device
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-6, fused=device.type == "cuda"
        )

    def step(self, batch: torch.Tensor, seed: int) -> None:
        generator = torch.Generator(self.device).manual_seed(seed)
        autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=self.device.type == "cuda")
        with autocast:
            if self.kind == "hf":
                inputs, targets, _ = mask_tokens(batch, self.objective, generator)
                labels = torch.where(targets.ne(IGNORE_INDEX), targets + FIRST_RESIDUE_ID, targets)
                loss = self.model(input_ids=inputs, attention_mask=batch.ne(PAD_ID).long(), labels=labels).loss
            else:
                loss = pretraining_losses(self.model, batch, self.objective, generator)["loss"]
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_runner(runner: Runner, warmup: list[torch.Tensor], timed: list[torch.Tensor], args) -> dict:
    if runner.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(runner.device)
    for k, batch in enumerate(warmup):
        runner.step(batch, args.seed + k)
    passes = []
    for r in range(args.rounds):
        sync(runner.device)
        start = time.perf_counter()
        for k, batch in enumerate(timed):
            runner.step(batch, args.seed + 1000 * (r + 1) + k)  # the same masks for every model
        sync(runner.device)
        passes.append(time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated(runner.device) if runner.device.type == "cuda" else None
    return {"pass_s": passes, "peak_mem_gib": None if peak is None else round(peak / 1024**3, 2)}


def batch_flops(dims: dict, objective: str, batches: list[torch.Tensor], args) -> int:
    """Model FLOPs of one timed pass (masks drawn as the timed steps draw them, round 1)."""
    total = 0
    for k, batch in enumerate(batches):
        generator = torch.Generator(batch.device).manual_seed(args.seed + 1000 + k)
        _, targets, _ = mask_tokens(batch, ObjectiveConfig(name=objective), generator)
        total += model_flops(
            dims, objective, batch.ne(PAD_ID).sum(1).tolist(), targets.ne(IGNORE_INDEX).sum(1).tolist()
        )
    return total


def run_size(name: str, L: int, args, device, peak) -> list[dict]:
    dims = DIMS[name]
    batches = make_batches(args, L, device)
    warmup, timed = batches[: args.warmup], batches[args.warmup :]
    non_pad = sum(int(b.ne(PAD_ID).sum()) for b in timed)
    variants = [(layout, False) for layout in args.layouts] + ([("auto", True)] if args.compile else [])
    rows = []

    def record(kind, objective, layout, compiled, model_builder, warm, runs):
        torch.manual_seed(args.seed)
        row = {
            "dims": name,
            "L": L,
            "model": kind,
            "objective": objective,
            "layout": layout,
            "compiled": compiled,
            "timed_batches": len(runs),
            "non_pad_tokens": non_pad,
            "padded_tokens": sum(b.numel() for b in runs),
        }
        row["padding_fraction"] = round(1 - non_pad / row["padded_tokens"], 4)
        try:
            with torch.device(device):  # initialise on the device: xl has 0.7 B parameters
                model = model_builder()
            if kind == "hf_esm":
                row["attn_implementation"] = getattr(model.config, "_attn_implementation", None)
            runner = Runner("hf" if kind == "hf_esm" else "ours", model, ObjectiveConfig(name=objective), device)
            model = None
            timing = time_runner(runner, warm, runs, args)
        except torch.OutOfMemoryError:
            row["out_of_memory"] = True
        else:
            seconds = statistics.median(timing["pass_s"])
            flops = batch_flops(dims, objective, timed, args)  # model FLOPs of these sequences, whoever pads them
            row.update(
                timing,
                step_ms=round(1000 * seconds / len(runs), 2),
                non_pad_tokens_per_s=round(non_pad / seconds),
                model_tflops_per_pass=round(flops / 1e12, 4),
                mfu=None if peak is None else float(f"{flops / seconds / peak:.4g}"),
            )  # 4 significant digits
        runner = model = None
        if device.type == "cuda":
            torch.cuda.empty_cache()
        rows.append(row)
        print(json.dumps(row), flush=True)

    for objective in args.objectives:
        for layout, compiled in variants:

            def build(objective=objective, layout=layout, compiled=compiled):
                # the objective's released layers; HF ESM below has the MLM recipe's dropouts (bench_vs_esm.build_hf)
                cfg = model_config("base", objective=objective, max_len=L, **dims)
                model = build_model(cfg, ObjectiveConfig(name=objective))
                model.encoder.attention = layout
                if compiled:
                    model.encoder.compile_layers()
                return model

            record("ours", objective, layout, compiled, build, warmup, timed)
    if not args.no_hf:
        hf = hf_batches_for(timed, L, max(1, args.token_budget // L), args.seed, device)
        record("hf_esm", "mlm", "hf-default", False, lambda: build_hf(dims, L), hf[: args.warmup], hf)
    return rows


def summarise(rows: list[dict], layout: str) -> dict:
    """Ratios per size and length, for our ``layout`` (the first of --layouts: auto on CUDA)."""

    def find(**keys):
        for row in rows:
            if all(row.get(k) == v for k, v in keys.items()) and "step_ms" in row:
                return row
        return None

    out = {}
    for dims, L in sorted({(r["dims"], r["L"]) for r in rows}):
        mlm = find(dims=dims, L=L, model="ours", objective="mlm", layout=layout, compiled=False)
        pmlm = find(dims=dims, L=L, model="ours", objective="pmlm", layout=layout, compiled=False)
        hf = find(dims=dims, L=L, model="hf_esm")
        key = f"{dims}/L{L}"
        out[key] = {
            "pmlm_over_mlm_step": round(pmlm["step_ms"] / mlm["step_ms"], 4) if mlm and pmlm else None,
            "ours_mlm_over_hf_tokens_per_s": round(mlm["non_pad_tokens_per_s"] / hf["non_pad_tokens_per_s"], 3)
            if mlm and hf
            else None,
            "ours_pmlm_over_hf_tokens_per_s": round(pmlm["non_pad_tokens_per_s"] / hf["non_pad_tokens_per_s"], 3)
            if pmlm and hf
            else None,
            "mfu_pmlm": pmlm["mfu"] if pmlm else None,
        }
    return out


def markdown(result: dict) -> str:
    lines = [
        f"# GPU throughput: {result['device']} (torch {result['torch']}, peak {result['peak_source']})",
        "",
        "| dims | L | model | objective | layout | compiled | step ms | non-pad tokens/s | MFU | peak GiB | padding |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        if r.get("out_of_memory"):
            lines.append(
                f"| {r['dims']} | {r['L']} | {r['model']} | {r['objective']} | {r['layout']} | {r['compiled']} | out of memory | | | | |"
            )
            continue
        mfu = "" if r["mfu"] is None else f"{100 * r['mfu']:.1f} %"
        lines.append(
            f"| {r['dims']} | {r['L']} | {r['model']} | {r['objective']} | {r['layout']} | {r['compiled']} | "
            f"{r['step_ms']} | {r['non_pad_tokens_per_s']:,} | {mfu} | {r['peak_mem_gib'] or ''} | {r['padding_fraction']:.1%} |"
        )
    lines += [
        "",
        "| dims / L | PMLM / MLM step | ours MLM / HF tokens/s | ours PMLM / HF tokens/s | PMLM MFU |",
        "|---|---|---|---|---|",
    ]
    for key, s in result["summary"].items():
        lines.append(
            f"| {key} | {s['pmlm_over_mlm_step']} | {s['ours_mlm_over_hf_tokens_per_s']} | "
            f"{s['ours_pmlm_over_hf_tokens_per_s']} | {s['mfu_pmlm']} |"
        )
    lines += [
        "",
        f"Ratios for layout {result['summary_layout']}. Bars: {json.dumps(result['bars'])}. "
        "Layout auto = packed + varlen_attn where it applies (CUDA, bf16), else padded.",
    ]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    args = parse_args(argv)
    device = torch.device(
        "cuda"
        if args.device == "auto" and torch.cuda.is_available() and not args.smoke
        else ("cpu" if args.device == "auto" else args.device)
    )
    args.layouts = (args.layouts or ("auto,padded" if device.type == "cuda" else "padded,packed")).split(",")
    args.objectives = args.objectives.split(",")
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high")  # as the training loop
    if not args.no_hf:
        try:
            import transformers  # noqa: F401
        except ImportError:
            print("bench_gpu_throughput: transformers is not installed; HF EsmForMaskedLM skipped", file=sys.stderr)
            args.no_hf = True
    peak, peak_source = peak_flops(device, args.peak_tflops)
    rows = []
    for name in args.dims.split(","):
        for L in (int(x) for x in args.lengths.split(",")):
            rows += run_size(name, L, args, device, peak)
    result = {
        "bench": "gpu_throughput",
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "transformers": None if args.no_hf else __import__("transformers").__version__,
        "peak_flops": peak,
        "peak_source": peak_source,
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "lengths_from": args.shards or "lognormal (median 300, sigma 0.65)",
        "rows": rows,
        "summary": summarise(rows, args.layouts[0]),
        "summary_layout": args.layouts[0],
        "bars": BARS,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    out.with_suffix(".md").write_text(markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
