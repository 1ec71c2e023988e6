"""Benchmark: what attention dropout costs on CPU, attention alone and in a PMLM training step.

1. **Attention alone**, forward + backward of one attention call, three ways on the same inputs: SDPA without
   dropout (torch's fused CPU flash kernel), SDPA with dropout 0.1 (its math path: the (B, H, L, L)
   probabilities, a ``bernoulli_`` mask and the dropped copy materialised), and ours with dropout 0.1
   (``pmlm.model.dropout_attention``, blockwise). Shapes: base (1 x 12 heads x 512, head dim 64, no padding)
   and the ``bench_vs_esm.py`` padded batch (8 x 4 heads x 1024, head dim 64, lognormal lengths). Each is
   timed ``--repeats`` times in alternating order; the minimum is reported, with ratios to SDPA without dropout.
2. **Where the time goes** (``--profile``): torch's profiler over one call of each, self CPU time per op.
3. **The bar**: a PMLM training step (masking + forward + loss + backward + Adam) at base dims (12 x 768,
   12 heads, ffn 3072), L = 512, batch 1, with the released layers' attention dropout 0.1 against the same
   model with attention dropout 0.0, and against SDPA's own dropout path (``--no-sdpa-dropout`` skips that
   one), stepped in turn on the same batch with the same masks (order alternating every round); the figure
   is the median over rounds of the per-round ratio. Bar (issue 26): dropout 0.1 / dropout 0.0 <= 1.15.

    python bench/bench_attention_dropout.py             # ~3 min on 2 idle cores
    python bench/bench_attention_dropout.py --quick     # 1 layer, L = 128, small shapes: a smoke run, not the bar
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_pmlm_step import random_batch
from bench_vs_esm import sample_lengths

from pmlm.model import ObjectiveConfig, model_config, pretraining_losses
from pmlm.model import encoder as encoder_module
from pmlm.model.dropout_attention import dropout_attention
from pmlm.pretrained import build_model

BAR = 1.15
DROPOUT = 0.1  # the released layers' attention dropout
SHAPES = {  # name: (batch, heads, width, head dim, padded)
    "base L=512": (1, 12, 512, 64, False),
    "vs_esm padded 8 x 1024": (8, 4, 1024, 64, True),
}
QUICK_SHAPES = {"quick L=128": (1, 4, 128, 16, False), "quick padded 4 x 128": (4, 4, 128, 16, True)}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="1 layer, L = 128, 1 + 2 steps, small shapes (smoke run)")
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--length", type=int, default=512, help="tokens per sequence incl. <cls>/<eos>")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per model")
    p.add_argument("--steps", type=int, default=6, help="timed steps per model")
    p.add_argument("--repeats", type=int, default=5, help="timed calls per attention variant")
    p.add_argument("--profile", action="store_true", help="also report self CPU time per op of each attention variant")
    p.add_argument("--no-sdpa-dropout", action="store_true", help="skip the step with SDPA's own dropout path")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.quick:
        args.layers, args.length, args.warmup, args.steps, args.repeats = 1, 128, 1, 2, 2
    return args


def attention_inputs(shape, seed: int):
    B, H, L, D, padded = shape
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, L, D, generator=g).requires_grad_() for _ in range(3))
    mask = None
    if padded:  # right-padded rows of lognormal lengths, one full row (the batch's width)
        lengths = [min(L, n + 2) for n in sample_lengths(B, g, L - 2)]
        lengths[0] = L
        mask = (torch.arange(L)[None, :] < torch.tensor(lengths)[:, None])[:, None, None, :]
    grad = torch.randn(B, H, L, D, generator=g)
    return q, k, v, mask, grad


def attention_variants(q, k, v, mask, grad) -> dict:
    def sdpa(p):
        return lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p).backward(grad)

    return {
        "sdpa_no_dropout": sdpa(0.0),
        "sdpa_dropout": sdpa(DROPOUT),
        "ours_dropout": lambda: dropout_attention(q, k, v, mask, DROPOUT).backward(grad),
    }


def time_attention(shapes: dict, args) -> dict:
    out = {}
    for name, shape in shapes.items():
        variants = attention_variants(*attention_inputs(shape, args.seed))
        for fn in variants.values():  # warm-up
            fn()
        times = {k: [] for k in variants}
        for r in range(args.repeats):
            for k in list(variants) if r % 2 == 0 else list(variants)[::-1]:
                start = time.perf_counter()
                variants[k]()
                times[k].append(time.perf_counter() - start)
        best = {k: min(v) for k, v in times.items()}
        out[name] = {
            "shape_bhld": list(shape[:4]),
            "padded": shape[4],
            "fwd_bwd_ms": {k: round(1000 * v, 2) for k, v in best.items()},
            "over_sdpa_no_dropout": {k: round(v / best["sdpa_no_dropout"], 3) for k, v in best.items()},
        }
        print(json.dumps({name: out[name]}), flush=True)
    return out


def profile_attention(shapes: dict, args) -> dict:
    """Self CPU time per op (the 8 largest and the total), one call of each variant on one thread (the profiler
    records the calling thread's ops; on one thread ours runs there too)."""
    from torch.profiler import ProfilerActivity, profile

    out = {}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for name, shape in shapes.items():
            variants = attention_variants(*attention_inputs(shape, args.seed))
            out[name] = {}
            for k, fn in variants.items():
                fn()
                with profile(activities=[ProfilerActivity.CPU]) as prof:
                    fn()
                ops = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
                out[name][k] = {e.key: round(e.self_cpu_time_total / 1000, 2) for e in ops[:8]}
                out[name][k]["total_self_ms"] = round(sum(e.self_cpu_time_total for e in ops) / 1000, 2)
            print(json.dumps({"profile " + name: out[name]}), flush=True)
    finally:
        torch.set_num_threads(threads)
    return out


def sdpa_attention(q, k, v, key_mask, dropout_p):
    """SDPA for every call, dropout included: the encoder's attention before pmlm.model.dropout_attention."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask, dropout_p=dropout_p)


def time_steps(args) -> dict:
    tokens = random_batch(1, args.length, args.seed)
    objective = ObjectiveConfig(name="pmlm")
    variants = {"dropout_0.0": 0.0, "dropout_0.1": DROPOUT}
    if not args.no_sdpa_dropout:
        variants["dropout_0.1_sdpa"] = DROPOUT
    runs = {}
    for name, p in variants.items():
        torch.manual_seed(args.seed)
        cfg = model_config(
            "base", objective="pmlm", num_layers=args.layers, max_len=max(args.length, 3), attention_dropout=p
        )
        model = build_model(cfg, objective).train()
        runs[name] = {
            "model": model,
            "optimizer": torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98)),
            "times": [],
        }
    default_attention = encoder_module.attention
    for step in range(args.warmup + args.steps):
        for name in list(runs) if step % 2 == 0 else list(runs)[::-1]:
            run = runs[name]
            encoder_module.attention = sdpa_attention if name.endswith("_sdpa") else default_attention
            try:
                start = time.perf_counter()
                generator = torch.Generator().manual_seed(args.seed + step)  # the same masks for every model
                out = pretraining_losses(run["model"], tokens, objective, generator)
                run["optimizer"].zero_grad(set_to_none=True)
                out.loss.backward()
                run["optimizer"].step()
                elapsed = time.perf_counter() - start
            finally:
                encoder_module.attention = default_attention
            if step >= args.warmup:
                run["times"].append(elapsed)
    base = runs["dropout_0.0"]["times"]
    ratios = {name: [t / b for t, b in zip(run["times"], base)] for name, run in runs.items() if name != "dropout_0.0"}
    return {
        "dims": {"layers": args.layers, "hidden": 768, "ffn": 3072, "heads": 12},
        "length": args.length,
        "batch": 1,
        "timed_steps": args.steps,
        "median_step_s": {k: round(statistics.median(r["times"]), 4) for k, r in runs.items()},
        "all_step_s": {k: [round(t, 4) for t in r["times"]] for k, r in runs.items()},
        "ratio_over_dropout_0.0": {k: round(statistics.median(v), 4) for k, v in ratios.items()},
        "ratio_per_round": {k: [round(x, 4) for x in v] for k, v in ratios.items()},
    }


def main(argv=None) -> int:
    args = parse_args(argv)
    shapes = QUICK_SHAPES if args.quick else SHAPES
    load_before = os.getloadavg()[0]
    result = {
        "bench": "attention_dropout",
        "quick": args.quick,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "dropout": DROPOUT,
    }
    result["attention"] = time_attention(shapes, args)
    if args.profile:
        result["profile_self_ms"] = profile_attention(shapes, args)
    result["step"] = time_steps(args)
    ratio = result["step"]["ratio_over_dropout_0.0"]["dropout_0.1"]
    result.update(
        bar=BAR,
        passed=None if args.quick else ratio <= BAR,
        loadavg_1min_before_after=[round(load_before, 2), round(os.getloadavg()[0], 2)],
    )
    print(json.dumps(result))
    verdict = "not judged: --quick" if args.quick else ("PASS" if ratio <= BAR else "FAIL")
    step = result["step"]
    sdpa = step["ratio_over_dropout_0.0"].get("dropout_0.1_sdpa")
    print(
        f"PMLM step with attention dropout {DROPOUT} / without: {ratio:.3f} (bar <= {BAR}: {verdict})"
        + (f"; with SDPA's own dropout path: {sdpa:.3f}" if sdpa is not None else "")
        + f"; {args.layers}x768, L={args.length}; attention alone (fwd+bwd, ours / SDPA without dropout): "
        + ", ".join(
            f"{name} {a['over_sdpa_no_dropout']['ours_dropout']:.2f}x "
            f"(SDPA's dropout {a['over_sdpa_no_dropout']['sdpa_dropout']:.2f}x)"
            for name, a in result["attention"].items()
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
