"""Benchmark: `pmlm embed` throughput against the encoder's forward pass alone on the same batches, on CPU.

`pmlm embed` runs in-process (``pmlm.cli.main``): loading the encoder, reading and checking the FASTA,
planning windows and token-budget batches, the forward passes, averaging windows and writing both Parquet
files. The reference times only the forward passes (``representations``, under ``torch.no_grad``) over
exactly the batches `pmlm embed` builds (``plan_windows`` / ``plan_batches`` over the same chunks), with the
token rows made beforehand. The ratio embed / forward is what the command costs around the model
(bar <= 1.2).

Sequences: lengths from the lognormal fit to UniProtKB used by bench_vs_esm.py (median 300, sigma 0.65 in
log space), clipped to [30, 1500] residues, so sequences past the 1022-residue window take the overlapping
windows path; uniform residues. Each round times both (order alternating); the ratio is the median over
rounds of the per-round ratio, so load changes between rounds cancel. On a shared machine the two timings
of a round can still see different loads, so the script also times the forward passes inside each `pmlm
embed` run (the engine's ``representations`` wrapped with a clock) and reports embed / those passes
(``in_run_ratio``): the same batches, the same moment, what the command adds around the model.

    python bench/bench_embed.py            # 6 layers x 320, ffn 1280 (ESM-2 8M's dims), 48 sequences, 3 rounds
    python bench/bench_embed.py --quick    # 2 x 64, 16 sequences, 1 round: a smoke run, not the bar
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from pmlm.alphabet import RESIDUES
from pmlm.artefacts import write_encoder
from pmlm.cli import main as pmlm_main
from pmlm.inference import embedding
from pmlm.inference.embedding import (
    CHUNK_BATCHES,
    batch_inputs,
    chunks,
    layer_index,
    plan_batches,
    plan_windows,
    representations,
)
from pmlm.inference.sequences import read_fasta_sequences
from pmlm.model.config import ModelConfig
from pmlm.model.objectives import ObjectiveConfig
from pmlm.pretrained import build_model, load_encoder

BAR = 1.2
LENGTH_MEDIAN, LENGTH_SIGMA = 300, 0.65
MIN_RESIDUES, MAX_RESIDUES = 30, 1500
DIMS = {
    "default": {"num_layers": 6, "hidden": 320, "ffn": 1280, "heads": 20, "max_len": 1024},
    "quick": {"num_layers": 2, "hidden": 64, "ffn": 256, "heads": 4, "max_len": 256},
}


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sequences", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens-per-batch", type=int, default=8192)
    ap.add_argument("--layer", type=int, default=-1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="tiny dims, 16 sequences, one round")
    return ap.parse_args(argv)


def write_inputs(root: Path, dims: dict, n: int, seed: int) -> tuple[Path, Path]:
    torch.manual_seed(seed)
    cfg = ModelConfig(**dims, dropout=0.0)
    objective = ObjectiveConfig(name="mlm")
    model = build_model(cfg, objective)
    encoder = root / "model" / "model.safetensors"
    encoder.parent.mkdir()
    write_encoder(encoder, model.state_dict(), {"model": cfg.to_dict(), "objective": dataclasses.asdict(objective)})
    rng = np.random.default_rng(seed)
    lengths = np.clip(
        np.round(np.exp(rng.normal(np.log(LENGTH_MEDIAN), LENGTH_SIGMA, size=n))), MIN_RESIDUES, MAX_RESIDUES
    ).astype(int)
    fasta = root / "in.fasta"
    with open(fasta, "w") as fh:
        for k, length in enumerate(lengths):
            fh.write(f">seq{k}\n{''.join(RESIDUES[c] for c in rng.integers(20, size=length))}\n")
    return encoder, fasta


def forward_batches(encoder: Path, fasta: Path, tokens_per_batch: int, layer: int):
    """The model and the token rows of every batch `pmlm embed` runs, in its order."""
    model, _, _ = load_encoder(encoder, torch.device("cpu"))
    records = read_fasta_sequences(fasta)
    room = model.cfg.max_len - 2
    residues_per_chunk = max(1, min(CHUNK_BATCHES * tokens_per_batch, (2**31 - 1) // (2 * model.cfg.hidden)))
    inputs = []
    for chunk in chunks(records, residues_per_chunk):
        sequences = [r.residues for r in chunk]
        for batch in plan_batches(plan_windows([int(s.size) for s in sequences], room), tokens_per_batch):
            inputs.append(batch_inputs(batch, sequences, room))
    return model, inputs, layer_index(layer, model.cfg.num_layers)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.quick:
        args.sequences, args.rounds = 16, 1
    dims = DIMS["quick" if args.quick else "default"]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        encoder, fasta = write_inputs(root, dims, args.sequences, args.seed)
        model, inputs, layer = forward_batches(encoder, fasta, args.tokens_per_batch, args.layer)
        command = [
            "embed",
            str(encoder),
            str(fasta),
            "-o",
            str(root / "out.parquet"),
            "--device",
            "cpu",
            "--tokens-per-batch",
            str(args.tokens_per_batch),
            "--layer",
            str(args.layer),
        ]

        inside = []  # seconds of each forward pass inside `pmlm embed` (CPU: synchronous)

        def timed(*a, **k):
            t0 = time.perf_counter()
            out = representations(*a, **k)
            inside.append(time.perf_counter() - t0)
            return out

        def embed() -> tuple[float, float]:
            inside.clear()
            embedding.representations = timed  # the engine looks it up at call time
            try:
                t0 = time.perf_counter()
                assert pmlm_main(command) == 0
                return time.perf_counter() - t0, sum(inside)
            finally:
                embedding.representations = representations

        def forward() -> float:
            t0 = time.perf_counter()
            with torch.no_grad():
                for tokens in inputs:
                    representations(model, tokens, layer)
            return time.perf_counter() - t0

        embed(), forward()  # warm-up: imports, allocator, thread pools
        rounds = []
        for r in range(args.rounds):
            if r % 2 == 0:
                (t_embed, t_inside), t_forward = embed(), forward()
            else:
                t_forward, (t_embed, t_inside) = forward(), embed()
            rounds.append(
                {
                    "embed_s": t_embed,
                    "forward_s": t_forward,
                    "ratio": t_embed / t_forward,
                    "embed_forward_s": t_inside,
                    "in_run_ratio": t_embed / t_inside,
                }
            )
    residues = sum(int((t >= 4).sum()) for t in inputs)  # residue tokens (ids 4.., specials below)
    ratio = statistics.median(r["ratio"] for r in rounds)
    result = {
        "bench": "embed",
        "device": "cpu",
        "threads": torch.get_num_threads(),
        "dims": dims,
        "sequences": args.sequences,
        "batches": len(inputs),
        "residue_tokens": residues,
        "tokens_per_batch": args.tokens_per_batch,
        "layer": layer,
        "rounds": rounds,
        "embed_s_median": statistics.median(r["embed_s"] for r in rounds),
        "forward_s_median": statistics.median(r["forward_s"] for r in rounds),
        "ratio_embed_over_forward": ratio,
        "in_run_ratio": statistics.median(r["in_run_ratio"] for r in rounds),
        "bar": BAR,
        "passes": ratio <= BAR,
        "quick": args.quick,
    }
    print(json.dumps(result))
    per_round = ", ".join(f"{r['ratio']:.3f}" for r in rounds)
    print(
        f"pmlm embed {result['embed_s_median']:.2f} s vs forward alone {result['forward_s_median']:.2f} s on "
        f"{len(inputs)} batches ({args.sequences} sequences, {dims['num_layers']} x {dims['hidden']}): "
        f"ratio {ratio:.3f} (per round {per_round}; bar <= {BAR}); within the same runs, embed / its own "
        f"forward passes {result['in_run_ratio']:.3f}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
