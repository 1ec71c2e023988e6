"""Benchmark: one PMLM training step versus one MLM training step at the same encoder dims.

A step is masking + forward + loss + backward + Adam update. The MLM and PMLM models (and,
with ``--with-pair-only``, the pair-only variant) are stepped in turn on the same batch with
the same masks (the order alternates every round), so machine load affects all alike. The
figure is the median over rounds of the per-round ratio PMLM step / MLM step after warm-up:
steps of one round run back to back, so a load change between rounds, common on a shared
machine, cancels. The ratio of median step times, of the fastest steps and of median
process CPU time are reported beside it. Bar (design §7.1): PMLM / MLM <= 1.25 at base dims
(12 x 768, 12 heads), L = 512, 15 % masking.

    python bench/bench_pmlm_step.py            # base dims, L=512, batch 1 (~1 min on 2 idle CPU cores)
    python bench/bench_pmlm_step.py --quick    # 4 layers, 3 timed steps: a smoke run, not the bar
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

import torch

from pmlm.alphabet import CLS_ID, EOS_ID, FIRST_RESIDUE_ID, NUM_RESIDUES
from pmlm.model import ObjectiveConfig, model_config, pretraining_losses
from pmlm.model.objectives import IGNORE_INDEX, mask_tokens
from pmlm.model.step_inputs import upper_pair_indices
from pmlm.pretrained import build_model

BAR = 1.25
OBJECTIVES = ("mlm", "pmlm", "pmlm_pair_only")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="4 layers, 1 warm-up + 3 timed steps (smoke run)")
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--ffn", type=int, default=3072)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--length", type=int, default=512, help="tokens per sequence incl. <cls>/<eos>")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--mask-prob", type=float, default=0.15)
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per model")
    p.add_argument("--steps", type=int, default=6, help="timed steps per model (median reported)")
    p.add_argument("--device", default="auto", help="auto (cuda if present), cpu or cuda")
    p.add_argument("--with-pair-only", action="store_true", help="also time the pmlm_pair_only objective")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's choice)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.quick:
        args.layers, args.warmup, args.steps = 4, 1, 3
    return args


def random_batch(batch: int, length: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(FIRST_RESIDUE_ID, FIRST_RESIDUE_ID + NUM_RESIDUES, (batch, length), generator=g)
    tokens[:, 0], tokens[:, -1] = CLS_ID, EOS_ID
    return tokens


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(
        "cuda"
        if args.device == "auto" and torch.cuda.is_available()
        else ("cpu" if args.device == "auto" else args.device)
    )
    cfg = model_config(
        "base",
        num_layers=args.layers,
        hidden=args.hidden,
        ffn=args.ffn,
        heads=args.heads,
        max_len=max(args.length, 3),
    )
    tokens = random_batch(args.batch, args.length, args.seed).to(device)
    runs = {}
    for name in OBJECTIVES if args.with_pair_only else OBJECTIVES[:2]:
        torch.manual_seed(args.seed)
        model = build_model(cfg, ObjectiveConfig(name=name)).to(device).train()
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-6)
        runs[name] = {
            "model": model,
            "optimizer": optimizer,
            "objective": ObjectiveConfig(name=name, mask_prob=args.mask_prob),
            "times": [],
            "cpu_times": [],
        }

    load_before = os.getloadavg()[0]
    for step in range(args.warmup + args.steps):
        names = list(runs) if step % 2 == 0 else list(runs)[::-1]
        for name in names:  # interleaved, alternating order: load spikes hit every model
            run = runs[name]
            generator = torch.Generator().manual_seed(args.seed + step)  # same masks for every model
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

    _, targets, _ = mask_tokens(tokens.cpu(), runs["pmlm"]["objective"], torch.Generator().manual_seed(args.seed))
    ordered_pairs_per_step = 2 * upper_pair_indices(targets.ne(IGNORE_INDEX))[0].numel()
    median = {name: statistics.median(run["times"]) for name, run in runs.items()}
    paired = [p / m for p, m in zip(runs["pmlm"]["times"], runs["mlm"]["times"])]
    ratio = statistics.median(paired)
    result = {
        "bench": "pmlm_step",
        "quick": args.quick,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "dims": {"layers": args.layers, "hidden": args.hidden, "ffn": args.ffn, "heads": args.heads},
        "length": args.length,
        "batch": args.batch,
        "mask_prob": args.mask_prob,
        "ordered_pairs_per_step": ordered_pairs_per_step,
        "timed_steps": args.steps,
        "median_step_s": {k: round(v, 4) for k, v in median.items()},
        "all_step_s": {k: [round(t, 4) for t in run["times"]] for k, run in runs.items()},
        "ratio_pmlm_over_mlm": round(ratio, 4),
        "ratio_per_round": [round(r, 4) for r in paired],
        "ratio_of_medians": round(median["pmlm"] / median["mlm"], 4),
        "ratio_fastest_pmlm_over_mlm": round(min(runs["pmlm"]["times"]) / min(runs["mlm"]["times"]), 4),
        "ratio_cpu_time_pmlm_over_mlm": round(
            statistics.median(runs["pmlm"]["cpu_times"]) / statistics.median(runs["mlm"]["cpu_times"]), 4
        ),
        "ratio_pair_only_over_mlm": round(
            statistics.median(p / m for p, m in zip(runs["pmlm_pair_only"]["times"], runs["mlm"]["times"])), 4
        )
        if args.with_pair_only
        else None,
        "bar": BAR,
        "pass": None if args.quick else ratio <= BAR,  # --quick is not the bar's setting
        "loadavg_1min_before_after": [round(load_before, 2), round(os.getloadavg()[0], 2)],
    }
    print(json.dumps(result))
    verdict = "not judged: --quick" if args.quick else ("PASS" if ratio <= BAR else "FAIL")
    print(
        f"PMLM step {median['pmlm']:.3f}s vs MLM step {median['mlm']:.3f}s: ratio {ratio:.3f} "
        f"(bar <= {BAR}: {verdict}); median of per-round ratios; ratio of medians {result['ratio_of_medians']:.3f}, "
        f"fastest-step ratio {result['ratio_fastest_pmlm_over_mlm']:.3f}, "
        f"CPU-time ratio {result['ratio_cpu_time_pmlm_over_mlm']:.3f}; "
        + (f"pair-only / MLM {result['ratio_pair_only_over_mlm']:.3f}; " if args.with_pair_only else "")
        + f"{args.layers}x{args.hidden}, L={args.length}, batch {args.batch}, {ordered_pairs_per_step} pairs, on {device.type}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
