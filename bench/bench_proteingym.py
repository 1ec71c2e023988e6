"""Benchmark: ProteinGym scoring throughput (mutants per second) on CPU, and what the batching saves.

One assay shape: a protein of L residues, every single substitution at S sites (19 S singles) and D doubles over
P distinct site pairs (D / P mutants per pair), scored by ``pmlm.proteingym.assay_scoring.score_assay`` exactly as
`pmlm proteingym score` scores it: one masked row per distinct site (all 19 substitutions from it), one per
distinct pair (its 20 x 20 joint), 32 rows per forward pass, each in a window of the encoder's size centred on
its site(s). Encoders (random weights, built in memory):

* ``demo``: the demo's tiny PMLM (2 layers x 64, ffn 256, 4 heads, max_len 256: a 300-residue protein is read
  in windows around the sites);
* ``650m``: the released PMLM-650M's shape (34 layers x 1280, ffn 5120, 20 heads, max_len 1024, post-LN, 27^2
  pair classes as its pair head), in float32.

For the demo encoder the batching is measured side by side: the same rows one per forward pass against 32 per
pass (rounds alternate the order; the ratio is the median of per-round ratios). Every figure is seconds of
forward passes and read-outs, without loading the encoder or reading the CSV. A GPU estimate divides each
row's FLOPs (2 x encoder matmul parameters x tokens + 4 x layers x tokens^2 x hidden for attention) by a
stated sustained rate.

    OMP_NUM_THREADS=2 python bench/bench_proteingym.py           # demo and 650m, ~5-10 min on 2 cores
    python bench/bench_proteingym.py --quick                     # demo only, a small assay: a smoke run
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np
import torch

from pmlm.alphabet import FIRST_RESIDUE_ID
from pmlm.inference import mutations
from pmlm.inference.mutations import Site
from pmlm.model.config import ModelConfig
from pmlm.model.objectives import ObjectiveConfig
from pmlm.pretrained import build_model
from pmlm.proteingym.assay_scoring import score_assay
from pmlm.proteingym.assays import AssayMutant

ENCODERS = {
    "demo": {"num_layers": 2, "hidden": 64, "ffn": 256, "heads": 4, "max_len": 256, "pair_vocab": "standard"},
    "650m": {"num_layers": 34, "hidden": 1280, "ffn": 5120, "heads": 20, "max_len": 1024, "pair_vocab": "full"},
}
# (L, S, P, doubles per pair) per encoder: the demo scans a whole 300-residue protein; the 650M-shaped encoder
# a part of one (its throughput per row does not depend on how many rows an assay has)
SHAPES = {"demo": (300, 300, 300, 10), "650m": (300, 16, 16, 10)}
QUICK_SHAPE = (120, 40, 40, 5)
GPU_TFLOPS = 30.0  # sustained float32 rate assumed for the estimate (an H100's fp32 peak is ~67 TFLOP/s)


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--encoders", default="demo,650m", help="comma-separated: demo, 650m")
    ap.add_argument("--rounds", type=int, default=3, help="side-by-side rounds of the batching comparison")
    ap.add_argument("--gpu-tflops", type=float, default=GPU_TFLOPS)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="demo encoder, a 120-residue assay, one round")
    return ap.parse_args(argv)


def build_encoder(name: str, seed: int):
    torch.manual_seed(seed)
    cfg = ModelConfig(**ENCODERS[name], dropout=0.0, attention_dropout=0.0)
    return build_model(cfg, ObjectiveConfig(name="pmlm")).eval()


def make_assay(shape: tuple[int, int, int, int], seed: int) -> tuple[np.ndarray, list[AssayMutant]]:
    """A random wild type (token ids) and the assay's mutants: 19 singles at each of S evenly spread sites, then
    ``per_pair`` doubles at each of P random pairs of those sites."""
    length, n_sites, n_pairs, per_pair = shape
    rng = np.random.default_rng(seed)
    wild = rng.integers(20, size=length)
    sites = np.linspace(0, length - 1, n_sites).round().astype(int)
    mutants = [
        AssayMutant("", (Site(int(i), int(wild[i]), a),), 0.0, 0, 0) for i in sites for a in range(20) if a != wild[i]
    ]
    pairs = set()
    while len(pairs) < n_pairs:
        i, j = sorted(int(x) for x in rng.choice(sites, size=2, replace=False))
        pairs.add((i, j))
    for i, j in sorted(pairs):
        for _ in range(per_pair):
            a, b = (int((wild[p] + rng.integers(1, 20)) % 20) for p in (i, j))
            mutants.append(AssayMutant("", (Site(i, int(wild[i]), a), Site(j, int(wild[j]), b)), 0.0, 0, 0))
    return (wild + FIRST_RESIDUE_ID).astype(np.uint8), mutants  # residue classes -> token ids


def row_flops(dims: dict, tokens: int) -> float:
    matmul = dims["num_layers"] * (4 * dims["hidden"] ** 2 + 2 * dims["hidden"] * dims["ffn"])
    return 2.0 * matmul * tokens + 4.0 * dims["num_layers"] * tokens**2 * dims["hidden"]


def timed_score(model, residues, mutants, rows_per_pass: int) -> tuple[float, dict]:
    saved = mutations.ROWS_PER_PASS
    mutations.ROWS_PER_PASS = rows_per_pass  # the engine reads it at call time
    try:
        t0 = time.perf_counter()
        scored = score_assay(model, residues, mutants, device="cpu")
        return time.perf_counter() - t0, scored
    finally:
        mutations.ROWS_PER_PASS = saved


def bench_encoder(name: str, shape, args) -> dict:
    model = build_encoder(name, args.seed)
    residues, mutants = make_assay(shape, args.seed)
    with torch.no_grad():
        timed_score(model, residues, mutants[:19], 32)  # warm-up: allocator, thread pools
        seconds, scored = timed_score(model, residues, mutants, 32)
    rows = scored["forward_rows"]["sites"] + scored["forward_rows"]["pairs"]
    tokens = min(shape[0], model.cfg.max_len - 2) + 2
    dims = ENCODERS[name]
    out = {
        "encoder": name,
        "dims": dims,
        "parameters": model.num_parameters(),
        "length": shape[0],
        "tokens_per_row": tokens,
        "mutants": len(mutants),
        "singles": 19 * shape[1],
        "doubles": shape[2] * shape[3],
        "rows": rows,
        "forward_passes": scored["forward_passes"],
        "seconds": seconds,
        "mutants_per_s": len(mutants) / seconds,
        "rows_per_s": rows / seconds,
        "singles_per_s_saturation": 19 * rows / seconds,
        "gpu_estimate": {
            "tflops_per_row": row_flops(dims, tokens) / 1e12,
            "sustained_tflops": args.gpu_tflops,
            "rows_per_s": args.gpu_tflops * 1e12 / row_flops(dims, tokens),
        },
    }
    if name == "demo":
        rounds = []
        for r in range(args.rounds):
            with torch.no_grad():
                if r % 2 == 0:
                    one, _ = timed_score(model, residues, mutants, 1)
                    batched, _ = timed_score(model, residues, mutants, 32)
                else:
                    batched, _ = timed_score(model, residues, mutants, 32)
                    one, _ = timed_score(model, residues, mutants, 1)
            rounds.append({"one_row_per_pass_s": one, "batched_s": batched, "ratio": one / batched})
        out["batching"] = {"rounds": rounds, "ratio_one_over_batched": statistics.median(r["ratio"] for r in rounds)}
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    names = ["demo"] if args.quick else [n for n in args.encoders.split(",") if n]
    if args.quick:
        args.rounds = 1
    results = []
    for name in names:
        shape = QUICK_SHAPE if args.quick else SHAPES[name]
        results.append(bench_encoder(name, shape, args))
        r = results[-1]
        extra = ""
        if "batching" in r:
            per = ", ".join(f"{x['ratio']:.2f}" for x in r["batching"]["rounds"])
            extra = f"; one row per pass takes {r['batching']['ratio_one_over_batched']:.2f}x as long (rounds {per})"
        print(
            f"{name}: {r['mutants']} mutants ({r['singles']} singles, {r['doubles']} doubles) of a "
            f"{r['length']}-residue protein, {r['rows']} rows in {r['forward_passes']} passes: {r['seconds']:.2f} s, "
            f"{r['mutants_per_s']:.1f} mutants/s, {r['rows_per_s']:.2f} rows/s; GPU estimate "
            f"{r['gpu_estimate']['rows_per_s']:.0f} rows/s at {args.gpu_tflops:g} TFLOP/s{extra}",
            file=sys.stderr,
        )
    print(
        json.dumps(
            {
                "bench": "proteingym",
                "device": "cpu",
                "threads": torch.get_num_threads(),
                "quick": args.quick,
                "results": results,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
