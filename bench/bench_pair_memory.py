"""Benchmark: peak memory of the masked-pair loss (forward + backward), ours versus the all-L^2 formulation.

*Ours* is the training path (``pair_loss`` below: the pair head on the pairs of masked residues
as the model's forward calls it, then ``masked_pair_loss``, the objective's pair term): pair
features only for the ordered pairs of masked residues, chunked, mirrored. *Reference* is the released code's
formulation, written here: ``concat(h_i * h_j, h_i - h_j)`` for all L^2 positions
(1, L, L, 2C), the pair MLP on all of it, then selection of the masked pairs. Both use the
same head weights, so they compute the same loss (checked and reported as ``loss_match``).
Both start from encoder output ``reps`` (1, L, C); the encoder itself is not measured.

How peak memory is measured: on CUDA, ``torch.cuda.max_memory_allocated`` above the
baseline. On CPU, a ``TorchDispatchMode`` sees every ATen op (forward and backward) and
keeps a weak reference to each storage the op creates; after each op it drops expired
storages and adds the new ones, so the running sum is the live bytes allocated by the loss
and its maximum the peak. Scratch buffers private to a kernel are not visible this way;
they are small next to the tensors counted here.

The all-L^2 reference at L = 1024 needs about 27 GB (fp32, C = 768) for the activations
autograd keeps, more than this CPU machine can spare, so on CPU it is measured at smaller L
(``--ref-lengths``) and reported at L = 1024 both analytically (bytes of the tensors it must
keep, a lower bound on its peak) and extrapolated from the measured points (peak ~ L^2).
Bar (design §7.2): ours <= 1/20 of the reference at L = 1024.

Share of step time (on CUDA by default, on CPU with ``--step-share``): a PMLM model of base dims
(``--share-layers`` x ``--hidden``, ffn 4C, heads C / 64) at max length L takes training steps
(masking + forward + both losses + backward + AdamW; bf16 autocast on CUDA) on a batch of
``--share-batch`` sequences of L tokens (default 16,384 tokens, the recipes' budget). Timed
separately, with the same masks: the pair loss alone (``pair_loss`` forward + backward
from the step's detached encoder output) and the MLM step. Reported: pair loss / PMLM step, and
(PMLM step - MLM step) / PMLM step, the pair objective's marginal cost. Times are medians of
``--share-steps`` steps (CUDA events on a GPU).

    python bench/bench_pair_memory.py           # ours at L=1024, reference at L=256 and 384 (CPU)
    python bench/bench_pair_memory.py --quick   # ours at L=512, reference at L=128 and 256
    python bench/bench_pair_memory.py --out bench/out/pair_memory.json   # on a GPU: measured at L=1024, step share
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from pmlm.alphabet import CLS_ID, EOS_ID, FIRST_RESIDUE_ID, NUM_RESIDUES
from pmlm.model import model_config, pretraining_losses
from pmlm.model.heads import PairHead, loss_precision
from pmlm.model.objectives import IGNORE_INDEX, ObjectiveConfig, mask_tokens
from pmlm.model.step_inputs import upper_pair_indices
from pmlm.pretrained import build_model

BAR = 1.0 / 20
FP32_BYTES = 4
GIB = 1024**3


class LiveStorageTracker(TorchDispatchMode):
    """Peak of the bytes held by storages created while the mode is active (CPU memory)."""

    def __init__(self):
        super().__init__()
        self.live: dict[tuple[str, int], tuple[StorageWeakRef, int]] = {}
        self.current = 0
        self.peak = 0

    def _sweep(self) -> None:
        for key in [k for k, (ref, _) in self.live.items() if ref.expired()]:
            self.current -= self.live.pop(key)[1]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self._sweep()  # a freed block may be reused by this op's output: forget it first
        for t in pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                storage = t.untyped_storage()
                key = (str(t.device), storage.data_ptr())
                if storage.nbytes() and key not in self.live:
                    self.live[key] = (StorageWeakRef(storage), storage.nbytes())
                    self.current += storage.nbytes()
        self.peak = max(self.peak, self.current)
        return out


def measure_peak(fn, device: torch.device) -> tuple[int, float]:
    """(peak bytes allocated by fn above what existed before, fn's return value)."""
    if device.type == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        value = fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base, value
    tracker = LiveStorageTracker()
    with tracker:
        value = fn()
    return tracker.peak, value


def setup(length: int, hidden: int, mask_prob: float, seed: int, device: torch.device):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(FIRST_RESIDUE_ID, FIRST_RESIDUE_ID + NUM_RESIDUES, (1, length), generator=g)
    tokens[:, 0], tokens[:, -1] = CLS_ID, EOS_ID
    _, targets, _ = mask_tokens(tokens, ObjectiveConfig(mask_prob=mask_prob), g)
    reps = torch.randn(1, length, hidden, generator=g).to(device).requires_grad_(True)  # (1, L, C)
    return reps, targets.to(device)


def pair_loss(head: PairHead, reps: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, int]:
    """The pair term of ``pretraining_losses`` from encoder output: (CE sum, ordered pairs)."""
    valid = targets.ne(IGNORE_INDEX)
    pos, (first, second) = valid.nonzero(), upper_pair_indices(valid)
    upper = torch.stack([pos[first, 0], pos[first, 1], pos[second, 1]], dim=1)  # (P, 3) rows (b, i, j), i < j
    logits, _ = head(reps, upper, mirror=True)  # (2P, K), as PMLMModel.forward with mirror_pairs=True
    a, b = targets[upper[:, 0], upper[:, 1]], targets[upper[:, 0], upper[:, 2]]
    labels = torch.cat([a * NUM_RESIDUES + b, b * NUM_RESIDUES + a])  # the mirrored order's 400 classes
    return F.cross_entropy(loss_precision(logits), labels, reduction="sum"), labels.numel()


def ours_loss(head: PairHead, reps: torch.Tensor, targets: torch.Tensor) -> float:
    ce_sum, n_pairs = pair_loss(head, reps, targets)
    loss = ce_sum / max(n_pairs, 1)
    loss.backward()
    return loss.item()


def reference_loss(head: PairHead, reps: torch.Tensor, targets: torch.Tensor) -> float:
    """Released-code formulation: the pair MLP over every (i, j), then masked-pair selection."""
    h = reps
    feats = torch.cat(
        [h[:, :, None, :] * h[:, None, :, :], h[:, :, None, :] - h[:, None, :, :]], dim=-1
    )  # (1, L, L, 2C)
    logits = head.out(head.norm(F.gelu(head.dense(feats))))  # (1, L, L, K)
    valid = targets.ne(IGNORE_INDEX)  # (1, L)
    L = valid.shape[1]
    off_diagonal = ~torch.eye(L, dtype=torch.bool, device=valid.device)
    select = valid[:, :, None] & valid[:, None, :] & off_diagonal  # (1, L, L)
    labels = targets[:, :, None] * NUM_RESIDUES + targets[:, None, :]  # (1, L, L)
    loss = F.cross_entropy(logits[select], labels[select])
    loss.backward()
    return loss.item()


def reference_analytic_bytes(length: int, hidden: int, classes: int) -> int:
    """Activations the reference must hold at the end of its forward pass (fp32).

    Features, first-Linear output (GELU input), GELU output (LayerNorm input), LayerNorm
    output (last-Linear input): four (L, L, 2C) tensors; plus the (L, L, K) logits.
    """
    return length * length * (4 * 2 * hidden + classes) * FP32_BYTES


def run_one(kind: str, head: PairHead, length: int, args, device: torch.device) -> dict:
    reps, targets = setup(length, args.hidden, args.mask_prob, args.seed, device)
    head.zero_grad(set_to_none=True)
    fn = ours_loss if kind == "ours" else reference_loss
    start = time.perf_counter()
    peak, loss = measure_peak(lambda: fn(head, reps, targets), device)
    masked = int(targets.ne(IGNORE_INDEX).sum())
    return {
        "length": length,
        "masked_standard": masked,
        "ordered_pairs": masked * (masked - 1),
        "peak_bytes": peak,
        "peak_gib": round(peak / GIB, 4),
        "loss": loss,
        "seconds": round(time.perf_counter() - start, 2),
    }


class Timer:
    """Elapsed seconds of a region: CUDA events on a GPU (no host sync inside), perf_counter on CPU."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def __enter__(self):
        if self.cuda:
            self.start, self.end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self.start.record()
        else:
            self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        if self.cuda:
            self.end.record()
        else:
            self.seconds = time.perf_counter() - self.t0

    def elapsed(self) -> float:
        if self.cuda:
            self.end.synchronize()
            return self.start.elapsed_time(self.end) / 1000
        return self.seconds


def step_share(args, device: torch.device) -> dict:
    """The pair loss's share of a PMLM training step (module docstring)."""
    L, C = args.length, args.hidden
    dims = {"num_layers": args.share_layers, "hidden": C, "ffn": 4 * C, "heads": max(1, C // 64), "max_len": L}
    batch = args.share_batch or max(1, 16384 // L)
    g = torch.Generator().manual_seed(args.seed)
    tokens = torch.randint(FIRST_RESIDUE_ID, FIRST_RESIDUE_ID + NUM_RESIDUES, (batch, L), generator=g)
    tokens[:, 0], tokens[:, -1] = CLS_ID, EOS_ID
    tokens = tokens.to(device)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda")
    times = {"pmlm_step": [], "mlm_step": [], "pair_loss": []}
    for name in ("pmlm", "mlm"):
        torch.manual_seed(args.seed)
        objective = ObjectiveConfig(name=name, mask_prob=args.mask_prob)
        model = build_model(model_config("base", **dims), objective).to(device).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
        for step in range(args.share_warmup + args.share_steps):
            seed = args.seed + step  # the same masks for both models, step by step
            with Timer(device) as full:
                with autocast:
                    out = pretraining_losses(model, tokens, objective, torch.Generator(device).manual_seed(seed))
                optimizer.zero_grad(set_to_none=True)
                out.loss.backward()
                optimizer.step()
            if name == "pmlm":
                with torch.no_grad(), autocast:
                    inputs, targets, _ = mask_tokens(tokens, objective, torch.Generator(device).manual_seed(seed))
                    reps = model.encode(inputs)  # (B, L, C), the step's encoder output
                reps = reps.detach().requires_grad_(True)
                with Timer(device) as pair:
                    with autocast:
                        ce_sum, n_pairs = pair_loss(model.pair_head, reps, targets)
                    (ce_sum / max(n_pairs, 1)).backward()
            if step >= args.share_warmup:
                times[f"{name}_step"].append(full.elapsed())
                if name == "pmlm":
                    times["pair_loss"].append(pair.elapsed())
        model = optimizer = None
        if device.type == "cuda":
            torch.cuda.empty_cache()
    median = {k: statistics.median(v) for k, v in times.items()}
    return {
        "dims": dims,
        "batch": batch,
        "tokens_per_step": batch * L,
        "bf16": device.type == "cuda",
        "median_s": {k: round(v, 5) for k, v in median.items()},
        "pair_loss_over_pmlm_step": round(median["pair_loss"] / median["pmlm_step"], 4),
        "pmlm_minus_mlm_over_pmlm_step": round((median["pmlm_step"] - median["mlm_step"]) / median["pmlm_step"], 4),
        "pmlm_over_mlm_step": round(median["pmlm_step"] / median["mlm_step"], 4),
    }


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="ours at L=512, reference at L=128,256")
    p.add_argument("--length", type=int, default=1024, help="target length L (the bar's L)")
    p.add_argument("--hidden", type=int, default=768, help="C (base dims: 768)")
    p.add_argument("--mask-prob", type=float, default=0.15)
    p.add_argument("--chunk-size", type=int, default=65536, help="pair rows per chunk in our head")
    p.add_argument(
        "--ref-lengths",
        default=None,
        help="comma-separated L at which to run the reference (default: 256,384 on CPU, the target L on CUDA)",
    )
    p.add_argument("--device", default="auto", help="auto (cuda if present), cpu or cuda")
    p.add_argument("--step-share", action="store_true", help="also measure the step-time share on CPU (always on CUDA)")
    p.add_argument("--share-layers", type=int, default=12, help="encoder layers of the step-share model")
    p.add_argument("--share-batch", type=int, default=None, help="sequences per step (default 16384 // L)")
    p.add_argument("--share-warmup", type=int, default=2)
    p.add_argument("--share-steps", type=int, default=5)
    p.add_argument("--out", default=None, help="also write the JSON result to this file")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.quick:
        args.length = 512
        args.ref_lengths = args.ref_lengths or "128,256"
        args.share_layers, args.share_warmup, args.share_steps = 2, 1, 2
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    device = torch.device(
        "cuda"
        if args.device == "auto" and torch.cuda.is_available()
        else ("cpu" if args.device == "auto" else args.device)
    )
    if args.ref_lengths is None:
        args.ref_lengths = str(args.length) if device.type == "cuda" else "256,384"
    ref_lengths = sorted(int(x) for x in args.ref_lengths.split(","))
    torch.manual_seed(args.seed)
    head = PairHead(args.hidden, NUM_RESIDUES**2, args.chunk_size).to(device)
    classes = NUM_RESIDUES**2

    ours = {L: run_one("ours", head, L, args, device) for L in sorted({args.length, *ref_lengths})}
    reference = {}
    for L in ref_lengths:
        try:
            reference[L] = run_one("reference", head, L, args, device)
        except torch.OutOfMemoryError:
            reference[L] = {"length": L, "out_of_memory": True}
        if reference[L].get("out_of_memory") is None:
            reference[L]["analytic_bytes"] = reference_analytic_bytes(L, args.hidden, classes)
            reference[L]["loss_match"] = abs(reference[L]["loss"] - ours[L]["loss"]) <= 1e-4 * abs(ours[L]["loss"])

    measured = [L for L in ref_lengths if not reference[L].get("out_of_memory")]
    ours_target = ours[args.length]["peak_bytes"]
    analytic_target = reference_analytic_bytes(args.length, args.hidden, classes)
    extrapolated = None
    if args.length in measured:
        ref_target, ref_basis = reference[args.length]["peak_bytes"], "measured"
    else:
        largest = max(measured)
        extrapolated = reference[largest]["peak_bytes"] * (args.length / largest) ** 2
        # the smaller of analytic lower bound and extrapolation: the conservative denominator
        ref_target = min(analytic_target, extrapolated)
        ref_basis = f"min(analytic lower bound, extrapolated from L={largest} as L^2)"
    ratio = ours_target / ref_target
    side_by_side = {L: round(ours[L]["peak_bytes"] / reference[L]["peak_bytes"], 5) for L in measured}
    result = {
        "bench": "pair_memory",
        "quick": args.quick,
        "device": device.type,
        "method": "torch.cuda.max_memory_allocated"
        if device.type == "cuda"
        else "TorchDispatchMode live-storage tracking",
        "hidden": args.hidden,
        "pair_classes": classes,
        "mask_prob": args.mask_prob,
        "target_length": args.length,
        "ours": {str(k): v for k, v in ours.items()},
        "reference": {str(k): v for k, v in reference.items()},
        "reference_analytic_target_gib": round(analytic_target / GIB, 3),
        "reference_extrapolated_target_gib": None if extrapolated is None else round(extrapolated / GIB, 3),
        "reference_target_basis": ref_basis,
        "ratio_measured_side_by_side": {str(k): v for k, v in side_by_side.items()},
        "ratio_ours_over_reference_at_target": round(ratio, 5),
        "bar": BAR,
        "pass": None if args.quick else ratio <= BAR,  # --quick is not the bar's setting
        "loadavg_1min": round(os.getloadavg()[0], 2),
    }
    if device.type == "cuda":
        result["device_name"] = torch.cuda.get_device_name(device)
    if device.type == "cuda" or args.step_share:
        result["step_share"] = step_share(args, device)
    print(json.dumps(result))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    verdict = "not judged: --quick" if args.quick else ("PASS" if ratio <= BAR else "FAIL")
    print(
        f"pair-loss peak at L={args.length}, C={args.hidden}: ours {ours_target / GIB:.3f} GiB measured vs "
        f"reference {ref_target / GIB:.2f} GiB ({ref_basis}; analytic {analytic_target / GIB:.2f} GiB) = 1/{1 / ratio:.0f} "
        f"(bar <= 1/20: {verdict}); measured side by side: "
        + ", ".join(f"L={L}: 1/{1 / r:.0f}" for L, r in side_by_side.items())
    )
    if "step_share" in result:
        share = result["step_share"]
        print(
            f"pair loss = {share['pair_loss_over_pmlm_step']:.1%} of a PMLM step (PMLM - MLM: "
            f"{share['pmlm_minus_mlm_over_pmlm_step']:.1%}; PMLM / MLM {share['pmlm_over_mlm_step']:.3f}) at "
            f"{share['dims']['num_layers']}x{share['dims']['hidden']}, {share['batch']} x L={args.length}, on {device.type}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
