"""Benchmark: a proteome's inference through pmlm against a plain ``transformers`` loop over the same model, on the
same device, side by side, and peak memory against the FASTA's size.

The model: an MLM encoder at ESM-2 8M's dims (6 x 320, ffn 1280, 20 heads, max_len 1024) with the layers RoBERTa
computes exactly (post-LN, LayerNorm on the embeddings, GELU), random weights, exported by ``pmlm export`` to a stock
``RobertaForMaskedLM`` folder that ``transformers`` loads without remote code.

* **embeddings**: ``pmlm embed`` in-process (``pmlm.cli.main``: loading, reading and checking the FASTA, batches
  sorted by length under a token budget, the forward passes, both Parquet files written) against the loop a user
  writes with ``transformers``: ``AutoModel`` + ``AutoTokenizer``, sequences in file order, consecutive ones put in
  a batch while rows x the padded width stays within the same token budget, the tokenizer's default padding (to
  the longest of the batch), ``last_hidden_state`` per residue and its mean per sequence kept in memory (no file
  written: the reference is spared the Parquet writing).
* **saturation**: every single substitution of each sequence by the masked marginal (one masked row per site):
  ``pmlm score --saturation`` in-process, writing Parquet, against ``AutoModelForMaskedLM`` fed each sequence's L
  masked rows, as many per forward pass as the same token budget holds, log-softmax at the masked site, 19 scores
  per site kept in memory.
* **wild-type marginal**: ``pmlm score --saturation --marginal wildtype`` against ``AutoModelForMaskedLM`` fed the
  sequences unmasked in file order, batched as for embeddings, log-softmax at every site.

All sides use the same sequences (UniProtKB's length lognormal, as bench_vs_esm.py: median 300, sigma 0.65 in log
space, clipped to 30..1,022 residues so no window is needed on either side) and the script checks that they agree
(embeddings and scores to float32 rounding) before it times them. Rounds alternate the order; the figure is the
median of the per-round ratios (bar >= 1.5). The masked marginal's forward passes are the same on both sides: a
sequence's masked rows all have its length, so no batching removes padding there, and the ratio measures the
implementations alone.

* **memory**: ``pmlm embed`` on FASTA files of 10^4 and 10^5 sequences of 40 residues, ``pmlm score --saturation``
  on 10^2 and 10^4 (19 rows per residue: 7.6 million rows at 10^4), each in a fresh process with a 2 x 32 model, resident
  memory sampled from /proc: with the FASTA streamed, the peak is set by the token budget (a chunk of 16 batches of
  the budget, 131,072 residues at the default), so the larger file's peak over the smaller's stays near 1 (bar <=
  1.25) while the input grows 10- to 100-fold. A file smaller than one chunk peaks lower (10^3 sequences: 40,000
  residues).

    python bench/bench_inference.py            # 48 sequences (embed, wild type), 6 (masked saturation), 3 rounds
    python bench/bench_inference.py --quick    # tiny model, a few sequences, 1 round, small memory runs
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch

from pmlm.alphabet import RESIDUES
from pmlm.artefacts import write_encoder
from pmlm.cli import main as pmlm_main
from pmlm.model.config import ModelConfig
from pmlm.model.objectives import ObjectiveConfig
from pmlm.pretrained import build_model

LENGTH_MEDIAN, LENGTH_SIGMA, MIN_RESIDUES, MAX_RESIDUES = 300, 0.65, 30, 1022
SPEED_BAR, MEMORY_BAR = 1.5, 1.25
LAYERS = {"norm": "post", "embedding_norm": True, "activation": "gelu", "pair_head": False}
DIMS = {
    "default": {"num_layers": 6, "hidden": 320, "ffn": 1280, "heads": 20, "max_len": 1024},
    "quick": {"num_layers": 2, "hidden": 64, "ffn": 128, "heads": 4, "max_len": 1024},
    "memory": {"num_layers": 2, "hidden": 32, "ffn": 64, "heads": 4, "max_len": 128},
}
# one process running a pmlm command: its resident memory sampled every 5 ms from /proc (after the imports, so the
# libraries' own memory is the baseline), printed as "baseline_kib peak_kib" on stderr's last line
PEAK_RSS = """
import os, sys, threading, time
import pmlm.inference.embedding, pmlm.inference.saturation
from pmlm.cli import main
page = os.sysconf("SC_PAGE_SIZE") // 1024
def rss():
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * page
base = peak = rss()
done = threading.Event()
def sample():
    global peak
    while not done.is_set():
        peak = max(peak, rss())
        time.sleep(0.005)
t = threading.Thread(target=sample, daemon=True)
t.start()
rc = main(sys.argv[1:])
done.set()
t.join()
peak = max(peak, rss())
print(base, peak, file=sys.stderr)
sys.exit(rc)
"""


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sequences", type=int, default=48, help="sequences embedded")
    ap.add_argument("--saturation-sequences", type=int, default=6, help="sequences scored at every substitution")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens-per-batch", type=int, default=8192)
    ap.add_argument("--embed-memory-sizes", type=int, nargs=2, default=(10_000, 100_000), metavar=("SMALL", "LARGE"))
    ap.add_argument("--saturation-memory-sizes", type=int, nargs=2, default=(100, 10_000), metavar=("SMALL", "LARGE"))
    ap.add_argument("--memory-length", type=int, default=40, help="residues per sequence of the memory runs")
    ap.add_argument("--skip", choices=("embed", "saturation", "wildtype", "memory"), action="append", default=[])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, help="also write the JSON line here")
    ap.add_argument("--quick", action="store_true", help="tiny dims, a few sequences, one round: a smoke run")
    return ap.parse_args(argv)


def write_encoder_folder(folder: Path, dims: dict, seed: int) -> Path:
    torch.manual_seed(seed)
    cfg = ModelConfig(**dims, **LAYERS, dropout=0.0, attention_dropout=0.0)
    objective = ObjectiveConfig(name="mlm")
    model = build_model(cfg, objective)
    folder.mkdir(parents=True)
    weights = folder / "model.safetensors"
    write_encoder(weights, model.state_dict(), {"model": cfg.to_dict(), "objective": dataclasses.asdict(objective)})
    return weights


def lognormal_lengths(n: int, seed: int, high: int = MAX_RESIDUES) -> list[int]:
    rng = np.random.default_rng(seed)
    raw = np.exp(rng.normal(np.log(LENGTH_MEDIAN), LENGTH_SIGMA, size=n))
    return [int(x) for x in np.clip(np.round(raw), MIN_RESIDUES, high)]


def write_fasta(path: Path, lengths: list[int], seed: int) -> list[str]:
    rng = np.random.default_rng(seed + 1)
    seqs = ["".join(RESIDUES[c] for c in rng.integers(20, size=n)) for n in lengths]
    with open(path, "w") as fh:
        for k, s in enumerate(seqs):
            fh.write(f">seq{k}\n{s}\n")
    return seqs


def file_order_batches(lengths: list[int], tokens_per_batch: int) -> list[list[int]]:
    """Consecutive sequences, a batch growing while rows x (longest + 2) stays within the budget (one row at least):
    what a loop over a FASTA with a token budget and the tokenizer's padding to the longest does."""
    batches: list[list[int]] = []
    for k in range(len(lengths)):
        if batches:
            rows = [*batches[-1], k]
            if len(rows) * (max(lengths[r] for r in rows) + 2) <= tokens_per_batch:
                batches[-1] = rows
                continue
        batches.append([k])
    return batches


class HFLoop:
    """The ``transformers`` side: the exported folder, loaded as users load it."""

    def __init__(self, folder: Path):
        from transformers import AutoModel, AutoModelForMaskedLM, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        self.base = AutoModel.from_pretrained(folder).eval()
        self.mlm = AutoModelForMaskedLM.from_pretrained(folder).eval()
        self.residue_ids = torch.tensor(self.tokenizer.convert_tokens_to_ids(list(RESIDUES)))

    @torch.no_grad()
    def embed(self, seqs: list[str], tokens_per_batch: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
        per_residue, means = [], []
        for batch in file_order_batches([len(s) for s in seqs], tokens_per_batch):
            enc = self.tokenizer([seqs[k] for k in batch], padding=True, return_tensors="pt")
            hidden = self.base(**enc).last_hidden_state
            for row, k in enumerate(batch):
                values = hidden[row, 1 : 1 + len(seqs[k])].numpy()
                per_residue.append(values)
                means.append(values.mean(axis=0, dtype=np.float64).astype(np.float32))
        return per_residue, means

    @torch.no_grad()
    def wildtype(self, seqs: list[str], tokens_per_batch: int) -> list[np.ndarray]:
        """(L, 20) log P(a) - log P(wt) at each site of the unmasked sequence (ESM-1v's wild-type marginal), batched
        in file order as ``embed``."""
        out = []
        for batch in file_order_batches([len(s) for s in seqs], tokens_per_batch):
            enc = self.tokenizer([seqs[k] for k in batch], padding=True, return_tensors="pt")
            log_p = torch.log_softmax(self.mlm(**enc).logits.float(), dim=-1)[..., self.residue_ids]  # (B, T, 20)
            for row, k in enumerate(batch):
                residue = log_p[row, 1 : 1 + len(seqs[k])]
                wt = torch.tensor([RESIDUES.index(c) for c in seqs[k]])
                out.append((residue - residue.gather(1, wt[:, None])).numpy())
        return out

    @torch.no_grad()
    def saturation(self, seqs: list[str], tokens_per_batch: int) -> list[np.ndarray]:
        """(L, 20) log P(a) - log P(wt) at each masked site, per sequence."""
        out = []
        mask = self.tokenizer.mask_token_id
        for s in seqs:
            ids = torch.tensor(self.tokenizer(s)["input_ids"])
            n = len(s)
            per_pass = max(1, tokens_per_batch // ids.numel())
            scores = np.empty((n, 20), dtype=np.float32)
            for start in range(0, n, per_pass):
                sites = torch.arange(start, min(n, start + per_pass))
                rows = ids.repeat(sites.numel(), 1)
                rows[torch.arange(sites.numel()), sites + 1] = mask
                logits = self.mlm(input_ids=rows, attention_mask=torch.ones_like(rows)).logits
                log_p = torch.log_softmax(logits[torch.arange(sites.numel()), sites + 1].float(), dim=-1)
                residue = log_p[:, self.residue_ids]  # (B, 20)
                wt = residue.gather(1, torch.tensor([RESIDUES.index(s[p]) for p in sites.tolist()])[:, None])
                scores[sites.numpy()] = (residue - wt).numpy()
            out.append(scores)
        return out


def ours_embed(weights: Path, fasta: Path, out: Path, tokens_per_batch: int) -> float:
    for p in (out, out.with_name(out.stem + ".per_sequence.parquet")):
        p.unlink(missing_ok=True)
    t0 = time.perf_counter()
    rc = pmlm_main(["embed", str(weights), str(fasta), "-o", str(out), "--device", "cpu",
                    "--tokens-per-batch", str(tokens_per_batch)])  # fmt: skip
    assert rc == 0, "pmlm embed failed"
    return time.perf_counter() - t0


def ours_saturation(weights: Path, fasta: Path, out: Path, tokens_per_batch: int, marginal: str = "masked") -> float:
    out.unlink(missing_ok=True)
    t0 = time.perf_counter()
    rc = pmlm_main(["score", str(weights), "--saturation", "--sequence", str(fasta), "-o", str(out), "--device",
                    "cpu", "--tokens-per-batch", str(tokens_per_batch), "--marginal", marginal])  # fmt: skip
    assert rc == 0, "pmlm score --saturation failed"
    return time.perf_counter() - t0


def check_embeddings(out: Path, per_residue: list[np.ndarray]) -> float:
    """Largest |ours - HF| over every residue's embedding, relative to the largest |value|."""
    table = pq.read_table(out, columns=["embedding"])
    ours = np.asarray(table.column("embedding").combine_chunks().values, dtype=np.float32)
    theirs = np.concatenate([e.reshape(-1) for e in per_residue])
    assert ours.size == theirs.size, f"pmlm embed wrote {ours.size} values, the HF loop {theirs.size}"
    return float(np.abs(ours - theirs).max() / np.abs(theirs).max())


def check_saturation(out: Path, seqs: list[str], scores: list[np.ndarray]) -> float:
    table = pq.read_table(out).to_pandas()
    expected = {}
    for k, (s, sc) in enumerate(zip(seqs, scores)):
        for p, wt in enumerate(s):
            for a, mut in enumerate(RESIDUES):
                if mut != wt:
                    expected[(f"seq{k}", f"{wt}{p + 1}{mut}")] = sc[p, a]
    assert len(table) == len(expected), f"pmlm score --saturation wrote {len(table)} rows, expected {len(expected)}"
    got = np.array([row.score for row in table.itertuples()], dtype=np.float64)
    want = np.array([expected[(row.id, row.mutant)] for row in table.itertuples()], dtype=np.float64)
    return float(np.abs(got - want).max())


def side_by_side(ours, theirs, rounds: int) -> list[dict]:
    """Rounds of both, the order alternating (the caller has run both once already, checking their outputs agree:
    that warms imports, allocator and thread pools)."""
    out = []
    for r in range(rounds):
        if r % 2 == 0:
            t_ours, t_theirs = ours(), theirs()
        else:
            t_theirs, t_ours = theirs(), ours()
        out.append({"ours_s": t_ours, "hf_s": t_theirs, "speedup": t_theirs / t_ours})
    return out


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def peak_rss_kib(args: list[str]) -> tuple[int, int]:
    """(baseline, peak) resident KiB of a fresh process running ``pmlm ARGS``."""
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}
    done = subprocess.run([sys.executable, "-c", PEAK_RSS, *args], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"pmlm {args[0]} failed: {done.stderr.strip()[-500:]}")
    base, peak = done.stderr.strip().splitlines()[-1].split()
    return int(base), int(peak)


def memory_runs(root: Path, sizes: dict[str, tuple[int, int]], length: int, tokens_per_batch: int, seed: int) -> dict:
    """Peak memory above the imports' of ``pmlm embed`` and ``pmlm score --saturation`` on FASTA files of a small
    and a large number of equal sequences, and the large file's over the small one's."""
    weights = write_encoder_folder(root / "memory_model", DIMS["memory"], seed)
    out: dict = {}
    for command, (small, large) in sizes.items():
        runs = {}
        for n in (small, large):
            fasta = root / f"memory_{n}.fasta"
            if not fasta.exists():
                write_fasta(fasta, [length] * n, seed + n)
            target = root / f"mem_{command}_{n}.parquet"
            argv = (
                ["embed", str(weights), str(fasta), "-o", str(target)]
                if command == "embed"
                else ["score", str(weights), "--saturation", "--sequence", str(fasta), "-o", str(target)]
            )
            base, peak = peak_rss_kib([*argv, "--device", "cpu", "--tokens-per-batch", str(tokens_per_batch)])
            runs[n] = {"fasta_bytes": fasta.stat().st_size, "baseline_mib": base / 1024, "peak_mib": peak / 1024,
                       "above_baseline_mib": (peak - base) / 1024}  # fmt: skip
            for p in root.glob(f"mem_{command}_{n}*.parquet"):
                p.unlink()
        out[command] = {
            "sequences": [small, large], "runs": runs,
            # the growth of the whole process's peak: the libraries' baseline is in both
            "peak_ratio": runs[large]["peak_mib"] / runs[small]["peak_mib"],
        }  # fmt: skip
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.quick:
        args.sequences, args.saturation_sequences, args.rounds = 6, 2, 1
        args.embed_memory_sizes, args.saturation_memory_sizes = (100, 1_000), (10, 100)
    dims = DIMS["quick" if args.quick else "default"]
    result: dict = {"bench": "inference", "device": "cpu", "threads": torch.get_num_threads(), "dims": dims,
                    "tokens_per_batch": args.tokens_per_batch, "quick": args.quick}  # fmt: skip
    passes = True
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        weights = write_encoder_folder(root / "model", dims, args.seed)
        folder = root / "hf"
        assert pmlm_main(["export", str(weights), "-o", str(folder)]) == 0, "pmlm export failed"
        hf = HFLoop(folder)
        tpb = args.tokens_per_batch
        parts = {  # name: (sequences, length seed, longest, ours, the transformers loop, its agreement check)
            "embed": (args.sequences, args.seed, MAX_RESIDUES, lambda f, o: ours_embed(weights, f, o, tpb),
                      lambda seqs: hf.embed(seqs, tpb)[0], lambda o, _seqs, per_residue: check_embeddings(o, per_residue)),
            "saturation": (args.saturation_sequences, args.seed + 7, 80 if args.quick else 400,
                           lambda f, o: ours_saturation(weights, f, o, tpb), lambda seqs: hf.saturation(seqs, tpb),
                           check_saturation),
            "wildtype": (args.sequences, args.seed, MAX_RESIDUES,
                         lambda f, o: ours_saturation(weights, f, o, tpb, "wildtype"),
                         lambda seqs: hf.wildtype(seqs, tpb), check_saturation),
        }  # fmt: skip
        for name, (n, seed, high, ours, theirs, check) in parts.items():
            if name in args.skip:
                continue
            lengths = lognormal_lengths(n, seed, high=high)
            fasta, out = root / f"{name}.fasta", root / f"{name}.parquet"
            seqs = write_fasta(fasta, lengths, seed)
            ours(fasta, out)  # both once, checked to agree: this also warms them up
            difference = check(out, seqs, theirs(seqs))
            rounds = side_by_side(partial(ours, fasta, out), partial(timed, partial(theirs, seqs)), args.rounds)
            speedup = statistics.median(r["speedup"] for r in rounds)
            residues = sum(lengths)
            result[name] = {
                "sequences": len(seqs), "residues": residues, "rounds": rounds, "speedup": speedup,
                "ours_residues_per_s": residues / statistics.median(r["ours_s"] for r in rounds),
                "hf_residues_per_s": residues / statistics.median(r["hf_s"] for r in rounds),
                "max_relative_difference" if name == "embed" else "max_abs_difference": difference,
            }  # fmt: skip
            if name != "embed":
                result[name]["substitutions"] = 19 * residues
            # the masked marginal is the bar's saturation; the wild-type marginal is measured beside it
            passes &= name == "wildtype" or speedup >= SPEED_BAR
        if "memory" not in args.skip:
            sizes = {"embed": tuple(args.embed_memory_sizes), "saturation": tuple(args.saturation_memory_sizes)}
            memory = memory_runs(root, sizes, args.memory_length, args.tokens_per_batch, args.seed)
            result["memory"] = memory
            passes &= max(m["peak_ratio"] for m in memory.values()) <= MEMORY_BAR
    result["bars"] = {"speedup": SPEED_BAR, "peak_ratio": MEMORY_BAR}
    result["passes"] = bool(passes)
    line = json.dumps(result)
    print(line)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(line + "\n")
    for kind in ("embed", "saturation", "wildtype"):
        if kind in result:
            r = result[kind]
            print(
                f"{kind}: pmlm {r['ours_residues_per_s']:,.0f} residues/s, transformers loop "
                f"{r['hf_residues_per_s']:,.0f} residues/s: {r['speedup']:.2f}x (per round "
                f"{', '.join(format(x['speedup'], '.2f') for x in r['rounds'])}; bar >= {SPEED_BAR})",
                file=sys.stderr,
            )
    for command, m in result.get("memory", {}).items():
        small, large = m["sequences"]
        runs = m["runs"]
        print(
            f"memory, {command}: peak {runs[small]['peak_mib']:.0f} MiB at {small:,} sequences, "
            f"{runs[large]['peak_mib']:.0f} MiB at {large:,} ({runs[small]['above_baseline_mib']:.0f} and "
            f"{runs[large]['above_baseline_mib']:.0f} MiB above the imports): {m['peak_ratio']:.2f} "
            f"(bar <= {MEMORY_BAR})",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
