"""Benchmark: the Triple MLM's cost. (1) One TMLM training step against one PMLM and one MLM step at the same
encoder dims; (2) the peak memory of the triple loss, ours against the naive formulation.

(1) A step is masking + forward + loss + backward + Adam, as in ``bench_pmlm_step.py``: the three models are
stepped in turn on the same batch with the same masks, the order alternating every round; the figure is the
median over rounds of the per-round ratio TMLM step / PMLM step. The ratio of median process CPU times is reported
beside it (with ``--threads 1`` the work each step does, steadier than wall time on a loaded machine). Bar: <= 1.5 at base dims (12 x 768, 12 heads),
L = 512, 15 % masking, ``triples_per_masked`` 1 (the objective's default).

(2) Peak bytes of the triple loss, forward + backward from encoder output (1, L, C), measured as
``bench_pair_memory.py`` measures the pair loss (CUDA: ``max_memory_allocated``; CPU: live storages through a
dispatch mode). *Ours*: the training path, ``ceil(triples_per_masked * |M|)`` sampled triples through the
factorised head (8,000 logits per sampled triple, built from 3 x 20 unary, 3 x 400 pairwise and 3 x R x 20
three-way factors). *Naive*: every ordered triple of masked residues, |M|(|M|-1)(|M|-2), through the same hidden
layer and an 8,000-wide output layer (the pair loss's |M|^2 - |M| ordered pairs, one site more). The naive loss
at L = 512 (|M| ~ 76: ~420,000 triples) needs more than ten GB, so on CPU it is measured at ``--naive-lengths``
and given at L = 512 analytically (the (T, 8000) logits and the (T, W) input its output layer keeps for the
backward pass exist together: a lower bound) and extrapolated linearly in the number of triples through the two
largest measured points (the weights' gradients are the fixed part).

    python bench/bench_triple.py               # step times at base dims, L = 512; memory at L = 512
    python bench/bench_triple.py --quick       # 4 layers, 3 timed steps, naive at L = 64 and 96
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_pair_memory import measure_peak
from bench_pmlm_step import random_batch, sync

from pmlm.model import ObjectiveConfig, model_config, pretraining_losses
from pmlm.model.objectives import IGNORE_INDEX, mask_tokens
from pmlm.model.triple import (
    NUM_TRIPLE_CLASSES,
    TripleHead,
    naive_triple_count,
    sample_triples,
    triple_labels,
    triple_loss,
)
from pmlm.pretrained import build_model

BAR = 1.5
OBJECTIVES = ("mlm", "pmlm", "tmlm")
FP32_BYTES = 4
GIB = 1024**3


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="4 layers, 1 warm-up + 3 timed steps, small naive lengths")
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--ffn", type=int, default=3072)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--length", type=int, default=512, help="tokens per sequence incl. <cls>/<eos>")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--mask-prob", type=float, default=0.15)
    p.add_argument("--triples-per-masked", type=float, default=1.0)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument(
        "--naive-lengths",
        type=int,
        nargs="+",
        default=[96, 128, 160],
        help="lengths at which the naive triple loss is measured",
    )
    p.add_argument("--skip-steps", action="store_true", help="memory only")
    p.add_argument("--device", default="auto")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.quick:
        args.layers, args.warmup, args.steps, args.naive_lengths = 4, 1, 3, [64, 96]
    if len(args.naive_lengths) < 2:
        p.error("--naive-lengths needs at least two lengths (the extrapolation's slope)")
    return args


def step_times(args, device: torch.device) -> dict:
    cfg = model_config(
        "base", num_layers=args.layers, hidden=args.hidden, ffn=args.ffn, heads=args.heads, max_len=max(args.length, 3)
    )
    tokens = random_batch(args.batch, args.length, args.seed).to(device)
    runs = {}
    for name in OBJECTIVES:
        torch.manual_seed(args.seed)
        objective = ObjectiveConfig(name=name, mask_prob=args.mask_prob, triples_per_masked=args.triples_per_masked)
        model = build_model(cfg, objective).to(device).train()
        runs[name] = {
            "model": model,
            "objective": objective,
            "times": [],
            "cpu_times": [],
            "optimizer": torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-6),
        }
    for step in range(args.warmup + args.steps):
        names = list(runs) if step % 2 == 0 else list(runs)[::-1]
        for name in names:
            run = runs[name]
            generator = torch.Generator().manual_seed(args.seed + step)  # the same masks for every model
            sync(device)
            start, cpu_start = time.perf_counter(), time.process_time()
            out = pretraining_losses(run["model"], tokens, run["objective"], generator)
            run["optimizer"].zero_grad(set_to_none=True)
            out.loss.backward()
            run["optimizer"].step()
            sync(device)
            if step >= args.warmup:
                run["times"].append(time.perf_counter() - start)
                run["cpu_times"].append(time.process_time() - cpu_start)
    per_round = [t / p for t, p in zip(runs["tmlm"]["times"], runs["pmlm"]["times"])]
    cpu = {k: statistics.median(r["cpu_times"]) for k, r in runs.items()}
    return {
        "median_step_s": {k: round(statistics.median(r["times"]), 4) for k, r in runs.items()},
        "all_step_s": {k: [round(t, 4) for t in r["times"]] for k, r in runs.items()},
        "ratio_tmlm_over_pmlm": round(statistics.median(per_round), 4),
        "ratio_per_round": [round(r, 4) for r in per_round],
        "ratio_pmlm_over_mlm": round(
            statistics.median(p / m for p, m in zip(runs["pmlm"]["times"], runs["mlm"]["times"])), 4
        ),
        # process CPU time: on a loaded machine less noisy than wall time (with --threads 1, the work done)
        "median_cpu_s": {k: round(v, 4) for k, v in cpu.items()},
        "ratio_cpu_time_tmlm_over_pmlm": round(cpu["tmlm"] / cpu["pmlm"], 4),
        "ratio_cpu_time_pmlm_over_mlm": round(cpu["pmlm"] / cpu["mlm"], 4),
        "triple_head_parameters": sum(p.numel() for p in runs["tmlm"]["model"].triple_head.parameters()),
    }


def _masked(length: int, args, device):
    g = torch.Generator().manual_seed(args.seed)
    tokens = random_batch(1, length, args.seed)
    _, targets, _ = mask_tokens(tokens, ObjectiveConfig(mask_prob=args.mask_prob), g)
    reps = torch.randn(1, length, args.hidden, generator=g).to(device).requires_grad_(True)
    return reps, targets.to(device)


class NaiveTripleHead(nn.Module):
    """The triple head's hidden layer with an 8,000-wide output layer, on every given triple."""

    def __init__(self, head: TripleHead):
        super().__init__()
        self.head = head
        self.out = nn.Linear(head.width, NUM_TRIPLE_CLASSES)

    def forward(self, reps: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        h = [reps[index[:, 0], index[:, r]] for r in (1, 2, 3)]
        w = self.head.project.weight.view(3, self.head.width, -1)
        pre = self.head.product(h[0] * h[1] * h[2]) + sum(F.linear(h[r], w[r]) for r in range(3))
        return self.out(self.head.norm(self.head.act(pre)))


def ours_loss(head: TripleHead, reps, targets, per_masked: float) -> float:
    index = sample_triples(targets.ne(IGNORE_INDEX), per_masked, torch.Generator().manual_seed(0))
    ce, n, _ = triple_loss(head(reps, index), triple_labels(index, targets))
    loss = ce / max(n, 1)
    loss.backward()
    return loss.item()


def naive_loss(head: NaiveTripleHead, reps, targets) -> float:
    positions = targets.ne(IGNORE_INDEX)[0].nonzero().flatten()
    grid = torch.cartesian_prod(positions, positions, positions)  # (|M|^3, 3)
    grid = grid[(grid[:, 0] != grid[:, 1]) & (grid[:, 0] != grid[:, 2]) & (grid[:, 1] != grid[:, 2])]
    index = torch.cat([torch.zeros(len(grid), 1, dtype=torch.long, device=grid.device), grid], dim=1)
    b, i, j, k = index.unbind(1)
    labels = (targets[b, i] * 20 + targets[b, j]) * 20 + targets[b, k]
    loss = F.cross_entropy(head(reps, index), labels)
    loss.backward()
    return loss.item()


def naive_analytic_bytes(triples: int, width: int) -> int:
    """A lower bound on the naive loss's peak (fp32): its (T, 8000) logits and the (T, W) LayerNorm output the
    output layer keeps for its backward pass are alive together."""
    return triples * (width + NUM_TRIPLE_CLASSES) * FP32_BYTES


def memory(args, device: torch.device) -> dict:
    torch.manual_seed(args.seed)
    width = 2 * args.hidden
    head = TripleHead(args.hidden, width, 16, 1024).to(device)
    naive = NaiveTripleHead(head).to(device)
    reps, targets = _masked(args.length, args, device)
    masked = int(targets.ne(IGNORE_INDEX).sum())
    peak, _ = measure_peak(lambda: ours_loss(head, reps, targets, args.triples_per_masked), device)
    out = {
        "length": args.length,
        "masked": masked,
        "ours_triples": len(
            sample_triples(targets.ne(IGNORE_INDEX), args.triples_per_masked, torch.Generator().manual_seed(0))
        ),
        "ours_peak_gib": round(peak / GIB, 4),
        "naive_points": [],
    }
    for length in args.naive_lengths:
        reps_n, targets_n = _masked(length, args, device)
        m = int(targets_n.ne(IGNORE_INDEX).sum())
        naive.zero_grad(set_to_none=True)
        start = time.perf_counter()
        peak_n, _ = measure_peak(lambda r=reps_n, t=targets_n: naive_loss(naive, r, t), device)
        ours_n, _ = measure_peak(lambda r=reps_n, t=targets_n: ours_loss(head, r, t, args.triples_per_masked), device)
        out["naive_points"].append(
            {
                "length": length,
                "masked": m,
                "triples": naive_triple_count(m),
                "naive_peak_gib": round(peak_n / GIB, 4),
                "ours_peak_gib": round(ours_n / GIB, 5),
                "seconds": round(time.perf_counter() - start, 2),
            }
        )
    triples = naive_triple_count(masked)
    a, b = out["naive_points"][-2:]
    per_triple = (b["naive_peak_gib"] - a["naive_peak_gib"]) / max(b["triples"] - a["triples"], 1)
    out["naive_at_length"] = {
        "triples": triples,
        "analytic_lower_bound_gib": round(naive_analytic_bytes(triples, width) / GIB, 2),
        "measured_kib_per_triple": round(per_triple * 1024**2, 2),
        "extrapolated_gib": round(b["naive_peak_gib"] + per_triple * (triples - b["triples"]), 2),
    }
    naive_gib = min(out["naive_at_length"]["analytic_lower_bound_gib"], out["naive_at_length"]["extrapolated_gib"])
    out["ratio_ours_over_naive"] = round(out["ours_peak_gib"] / naive_gib, 6)
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(
        "cuda"
        if args.device == "auto" and torch.cuda.is_available()
        else ("cpu" if args.device == "auto" else args.device)
    )
    load_before = os.getloadavg()[0]
    steps = None if args.skip_steps else step_times(args, device)
    mem = memory(args, device)
    result = {
        "bench": "triple",
        "quick": args.quick,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "dims": {"layers": args.layers, "hidden": args.hidden, "ffn": args.ffn, "heads": args.heads},
        "length": args.length,
        "batch": args.batch,
        "mask_prob": args.mask_prob,
        "triples_per_masked": args.triples_per_masked,
        "steps": steps,
        "memory": mem,
        "bar": BAR,
        "pass": None if args.quick or steps is None else steps["ratio_tmlm_over_pmlm"] <= BAR,
        "loadavg_1min_before_after": [round(load_before, 2), round(os.getloadavg()[0], 2)],
    }
    print(json.dumps(result))
    if steps is not None:
        verdict = "not judged: --quick" if args.quick else ("PASS" if result["pass"] else "FAIL")
        med = steps["median_step_s"]
        print(
            f"TMLM step {med['tmlm']:.3f}s vs PMLM {med['pmlm']:.3f}s vs MLM {med['mlm']:.3f}s: TMLM / PMLM "
            f"{steps['ratio_tmlm_over_pmlm']:.3f} (bar <= {BAR}: {verdict}), PMLM / MLM "
            f"{steps['ratio_pmlm_over_mlm']:.3f}; CPU-time ratios TMLM / PMLM "
            f"{steps['ratio_cpu_time_tmlm_over_pmlm']:.3f}, PMLM / MLM {steps['ratio_cpu_time_pmlm_over_mlm']:.3f}; "
            f"{args.layers}x{args.hidden}, L={args.length}"
        )
    naive = mem["naive_at_length"]
    print(
        f"triple loss peak at L={args.length} (|M|={mem['masked']}): ours {mem['ours_peak_gib']:.3f} GiB "
        f"({mem['ours_triples']} sampled triples) vs naive >= {naive['analytic_lower_bound_gib']:.1f} GiB analytic, "
        f"{naive['extrapolated_gib']:.1f} GiB extrapolated ({naive['triples']} ordered triples); ratio "
        f"{mem['ratio_ours_over_naive']:.2e}; naive measured at "
        + ", ".join(
            f"L={p['length']}: {p['naive_peak_gib']:.3f} GiB ({p['triples']} triples)" for p in mem["naive_points"]
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
