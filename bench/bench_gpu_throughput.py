"""Benchmark: the paper's pre-training step on a GPU, in non-pad tokens/s and model-FLOPs utilisation (MFU).

Each measured step is the recipe's (``--tokens-per-step``, 262,144 tokens) as ``pmlm pretrain`` runs it: a
length-bucketed batch of that many padded tokens is masked and cut into micro-batches on the host
(``pmlm.train.step_layout.step_parts``: every index the step needs, moved once), then each micro-batch's forward and
backward (``part_outputs``), gradient clipping and fused AdamW, a non-finite step skipped on the device. The
accumulation follows from the micro-batch (``--micro-batches``: 16,384, 65,536 and 131,072 tokens, or ``auto``, the
micro-batch the trainer picks for this card). Configurations: dims (``--dims``: base at L = 512, xl at L = 1024, the
recipes' crop lengths; config/train/<dims>.yaml with their released dropouts) x objectives x micro-batches x layouts
(``packed``, ``padded``; ``auto`` is not run apart: each row says whether it is auto's choice, so auto's distance from
the best layout is read off) x compiled (``--compile``: the encoder compiled whole, its first step timed apart).

HF transformers ``EsmForMaskedLM`` of the same dims and dropouts as our MLM (its default attention, learned
absolute positions) trains on the same sequences in random order, fixed batches of micro-batch / L sequences padded
to L (the usual HF Trainer set-up, masked on the host), the same tokens per step (needs ``transformers``).

Per configuration: step ms (median of ``--steps`` timed steps after ``--warmup``), non-pad tokens/s, MFU (model FLOPs
of the step's own sequences and masks, ``pmlm.train.budget.model_flops``, 400 pair classes: docs/gpu.md, "Model
FLOPs", cross-checked against torch's FLOP counter by tests/test_flops.py; the dense bf16 peak from the table below or
``--peak-tflops``), peak memory beside ``pmlm plan``'s estimate, the allocator's retries, and synchronisations: the
host-reading ops of one micro-batch's forward and backward (``pmlm.model.syncs.SyncCounter``) and CUDA's own count
of synchronising calls over a whole step (``torch.cuda.set_sync_debug_mode``). A rising figure to read: PMLM / MLM,
ours / HF, auto / best layout (bars in ``BARS``).

    python bench/bench_gpu_throughput.py --out bench/out/gpu_throughput      # on a GPU: base, then xl
    python bench/bench_gpu_throughput.py --smoke                              # tiny dims on a CPU, seconds
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_vs_esm import LENGTH_MEDIAN, LENGTH_SIGMA, MIN_RESIDUES, build_hf, make_sequences, pad_batch

from pmlm.alphabet import FIRST_RESIDUE_ID, IGNORE_INDEX, PAD_ID
from pmlm.choices import Precision
from pmlm.config.pretraining import TrainConfig
from pmlm.errors import ConfigError
from pmlm.model.layout import Layout
from pmlm.model.objectives import mask_batch, mask_tokens, sample_sizes
from pmlm.model.syncs import SyncCounter
from pmlm.pretrained import build_model
from pmlm.tokens import padded_width, trimmed_width
from pmlm.train import budget
from pmlm.train.pretrain import PretrainingObjective
from pmlm.train.step_layout import card_memory, choose_layout, part_outputs, step_parts, to_device

ROOT = Path(__file__).resolve().parents[1]
# dense bf16 tensor-core peak, TFLOP/s (vendor data sheets); matched in order against the device name
PEAK_BF16_TFLOPS = (
    ("H100 PCIe", 756.0),
    ("H100 NVL", 835.0),
    ("H100", 989.0),
    ("H200", 989.0),
    ("GH200", 989.0),
    ("A100", 312.0),
)
RECIPES = {"base": "config/train/base.yaml", "xl": "config/train/xl.yaml", "tiny": "config/train/tiny.yaml"}
BARS = {  # docs/gpu.md and bench/README.md
    "mfu_base": 0.40,
    "mfu_base_stretch": 0.45,
    "mfu_xl": 0.50,
    "pmlm_over_mlm_step": 1.15,
    "ours_mlm_over_hf_tokens_per_s": 3.0,
    "ours_pmlm_over_hf_tokens_per_s": 2.5,
    "auto_within_best_layout": 1.03,
}
PAD_MULTIPLE = 8  # the loader's data.pad_to_multiple
POOL = 16384  # sequences per length-sorted pool: the loader's shuffle buffer (data.buffer_rows)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="tiny dims, small steps, on the CPU: the code path in seconds")
    p.add_argument("--dims", default="base,xl", help=f"comma-separated recipes ({', '.join(RECIPES)})")
    p.add_argument("--objectives", default="mlm,pmlm")
    p.add_argument("--layouts", default="packed,padded", help="attention layouts to time (auto's choice is marked)")
    p.add_argument("--micro-batches", default="16384,65536,131072", help="tokens per micro-batch, or auto")
    p.add_argument("--xl-micro-batches", default="auto", help="micro-batches of the xl dims (default: the trainer's)")
    p.add_argument("--xl-objectives", default="pmlm", help="objectives of the xl dims")
    p.add_argument("--tokens-per-step", type=int, default=262144, help="the recipe's tokens per optimizer step")
    p.add_argument("--compile", action="store_true", help="also time the encoder compiled whole (first step apart)")
    p.add_argument("--compile-only", action="store_true", help="time only the compiled encoder")
    p.add_argument("--cuda-graphs", action="store_true", help="compiled variants as CUDA graphs (cuda_graphs: true)")
    p.add_argument("--no-hf", action="store_true", help="skip HF EsmForMaskedLM")
    p.add_argument("--hf-micro-batches", default="16384", help="micro-batches HF trains at")
    p.add_argument("--steps", type=int, default=2, help="timed steps per configuration (median reported)")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps per configuration")
    p.add_argument("--shards", default=None, help="lengths from this shard folder's train split (else lognormal)")
    p.add_argument("--median", type=float, default=LENGTH_MEDIAN, help="median residues of the lognormal lengths")
    p.add_argument("--peak-tflops", type=float, default=None, help="dense bf16 peak (default: from the device name)")
    p.add_argument("--device", default="auto", help="auto (cuda if present), cpu or cuda")
    p.add_argument("--out", default="bench/out/gpu_throughput", help="writes OUT.json and OUT.md")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.smoke:  # its own defaults, where an option was not given
        smoke = {"dims": "tiny", "tokens_per_step": 2048, "micro_batches": "512,1024", "hf_micro_batches": "512",
                 "median": 30, "steps": 1, "warmup": 1}  # fmt: skip
        for name, value in smoke.items():
            if getattr(args, name) == p.get_default(name):
                setattr(args, name, value)
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


def recipe(
    dims: str, objective: str, tokens_per_step: int, micro: str, layout: str, compiled: bool, graphs: bool = False
) -> TrainConfig:
    sets = [f"objective.name={objective}", f"tokens_per_step={tokens_per_step}", f"data.tokens_per_batch={micro}"]
    sets += [f"attention={layout}", f"compile={str(compiled).lower()}", "bf16=auto", "data.pad_to_multiple=8"]
    sets += [f"cuda_graphs={str(compiled and graphs).lower()}"]
    if dims == "tiny":  # the smoke run: the tiny recipe's layers, short crops
        sets += ["data.max_len=64"]
    return TrainConfig.from_yaml(ROOT / RECIPES[dims], sets)


# -- the steps' batches ----------------------------------------------------------------------------------------------


def step_batches(args, max_len: int, count: int) -> list[torch.Tensor]:
    """``count`` step batches of at most ``--tokens-per-step`` padded tokens, each a run of similar lengths from a
    length-sorted pool as the loader cuts them, evenly spaced over the pool's steps (a token-weighted sample), shuffled."""
    g = torch.Generator().manual_seed(args.seed)
    if args.shards:
        from pmlm.train.loader import _read_sequences, split_row_groups

        lengths = []
        for group in split_row_groups(args.shards, "train"):
            lengths += torch.from_numpy(_read_sequences(group)[1]).diff().tolist()
            if len(lengths) >= POOL:
                break
        lengths = torch.tensor(lengths[:POOL], dtype=torch.float64)
    else:
        normal = torch.randn(POOL, generator=g, dtype=torch.float64)
        lengths = torch.exp(torch.log(torch.tensor(args.median)) + LENGTH_SIGMA * normal)
    lengths = lengths.round().clamp(MIN_RESIDUES, max_len - 2).long().sort().values.tolist()
    cuts, start = [], 0
    for i, n in enumerate(lengths):  # ascending: the current sequence sets the batch's padded width
        if (i - start + 1) * padded_width(n, PAD_MULTIPLE) > args.tokens_per_step:
            cuts.append((start, i))
            start = i
    cuts.append((start, len(lengths)))
    chosen = [cuts[int((k + 0.5) * len(cuts) / count)] for k in range(count)]
    chosen = [chosen[i] for i in torch.randperm(count, generator=g).tolist()]
    batches = []
    for a, b in chosen:
        seqs = make_sequences(lengths[a:b], g)
        batches.append(pad_batch(seqs, padded_width(max(lengths[a:b]), PAD_MULTIPLE)))
    return batches


def step_model_flops(cfg: TrainConfig, batches: list[torch.Tensor], seed: int) -> list[int]:
    """Model FLOPs of each step batch, its masks drawn as the timed step draws them."""
    m = cfg.model_config()
    out = []
    for k, tokens in enumerate(batches):
        masked = mask_batch(tokens, cfg.objective, torch.Generator().manual_seed(seed + k))
        per_seq, masked_per_seq = tokens.ne(PAD_ID).sum(1).tolist(), masked.targets.ne(IGNORE_INDEX).sum(1).tolist()
        out.append(budget.model_flops(m.num_layers, m.hidden, m.ffn, cfg.objective.kind, per_seq, masked_per_seq))
    return out


# -- one configuration -------------------------------------------------------------------------------------------------


class OurStep:
    """The trainer's step (module docstring) for one recipe on one device."""

    def __init__(self, cfg: TrainConfig, device: torch.device):
        self.cfg, self.device = cfg, device
        self.model = build_model(cfg.model_config(), cfg.objective).to(device).train()
        self.model.encoder.attention = cfg.attention
        self.objective = PretrainingObjective(self.model, cfg.objective)
        if cfg.compile:
            options = {"mode": "reduce-overhead"} if cfg.cuda_graphs else {}
            self.model.encoder.compile_encoder(static=cfg.cuda_graphs, **options)
        self.bf16 = device.type == "cuda"
        self.dtype = torch.bfloat16 if self.bf16 else torch.float32
        precision = budget.Arithmetic(Precision.AUTO.on(device.type), device.type)
        params = budget.count_parameters(cfg.model_config(), cfg.objective.kind)
        self.layout = choose_layout(cfg, 1, card_memory(device), precision, params)
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-6, fused=device.type == "cuda"
        )

    def padded_tokens(self, tokens: torch.Tensor) -> int:
        """Tokens the step computes, pads included: each micro-batch cut to its own longest row."""
        parts = self.layout.rank_parts(tokens.shape[0], 0)
        return sum((b - a) * trimmed_width(tokens[a:b], PAD_MULTIPLE) for a, b in parts if b > a)

    def autocast(self):
        return torch.autocast("cuda", dtype=torch.bfloat16) if self.bf16 else contextlib.nullcontext()

    def __call__(self, tokens: torch.Tensor, seed: int, counter: SyncCounter | None = None) -> None:
        cfg = self.cfg
        masked = mask_batch(tokens, cfg.objective, torch.Generator().manual_seed(seed))
        sizes = to_device(sample_sizes(masked, cfg.objective), self.device)
        parts = self.layout.rank_parts(tokens.shape[0], 0)
        inputs = step_parts(masked, parts, cfg, self.model, self.device, self.dtype, True, self.layout.micro_tokens)
        self.optimizer.zero_grad(set_to_none=True)
        for k, (part, live) in enumerate(inputs):
            with counter if counter is not None and k == 0 else contextlib.nullcontext():
                _, loss = part_outputs(self.objective, part, live, sizes, 1, self.autocast)
                loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.optim.clip_norm)
        if self.optimizer.defaults.get("fused"):
            self.optimizer.found_inf = (~torch.isfinite(norm)).float()
        self.optimizer.step()


class HfStep:
    """HF EsmForMaskedLM's step on the same sequences: fixed batches padded to L, masked on the host."""

    def __init__(self, cfg: TrainConfig, micro: int, device: torch.device):
        m = cfg.model_config()
        dims = {"num_layers": m.num_layers, "hidden": m.hidden, "ffn": m.ffn, "heads": m.heads}
        self.cfg, self.device, self.L, self.micro = cfg, device, cfg.max_len, micro
        self.model = build_hf(dims, cfg.max_len).to(device).train()
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-6, fused=device.type == "cuda"
        )
        self.bf16 = device.type == "cuda"

    def padded_tokens(self, tokens: torch.Tensor) -> int:
        """Tokens the step computes, pads included: every sequence padded to L."""
        return tokens.shape[0] * self.L

    def __call__(self, tokens: torch.Tensor, seed: int, counter=None) -> None:
        g = torch.Generator().manual_seed(seed)
        seqs = [row[row.ne(PAD_ID)] for row in tokens]
        seqs = [seqs[i] for i in torch.randperm(len(seqs), generator=g).tolist()]
        size = max(1, self.micro // self.L)
        self.optimizer.zero_grad(set_to_none=True)
        for start in range(0, len(seqs), size):
            batch = pad_batch(seqs[start : start + size], self.L)
            inputs, targets, _ = mask_tokens(batch, self.cfg.objective, g)
            labels = torch.where(targets.ne(IGNORE_INDEX), targets + FIRST_RESIDUE_ID, targets)
            ids, mask, labels = (to_device(t, self.device) for t in (inputs, batch.ne(PAD_ID).long(), labels))
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=self.bf16):
                loss = self.model(input_ids=ids, attention_mask=mask, labels=labels).loss
            loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def cuda_syncs(step, tokens: torch.Tensor, seed: int, device: torch.device) -> int | None:
    """CUDA's count of synchronising calls over one step (set_sync_debug_mode's warnings)."""
    if device.type != "cuda":
        return None
    sync(device)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step(tokens, seed)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    sync(device)
    return sum("synchroniz" in str(w.message) for w in seen)


def measure(step, batches: list[torch.Tensor], flops: list[int], args, device, peak, cuda_check: bool = False) -> dict:
    """Warm-up, then the timed steps; the figures of one configuration (``cuda_check``: one more step under CUDA's
    synchronisation check)."""
    warm, timed = batches[: args.warmup], batches[args.warmup :]
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        retries = torch.cuda.memory_stats(device).get("num_alloc_retries", 0)
    first = None
    for k, tokens in enumerate(warm):
        sync(device)
        began = time.perf_counter()
        step(tokens, args.seed + k)
        sync(device)
        first = first if first is not None else time.perf_counter() - began
    counter = SyncCounter() if isinstance(step, OurStep) else None
    seconds = []
    for k, tokens in enumerate(timed):
        sync(device)
        began = time.perf_counter()
        step(tokens, args.seed + args.warmup + k, counter if k == 0 else None)
        sync(device)
        seconds.append(time.perf_counter() - began)
    non_pad = [int(t.ne(PAD_ID).sum()) for t in timed]
    median = statistics.median(seconds)
    rate = statistics.median(n / s for n, s in zip(non_pad, seconds))
    achieved = statistics.median(f / s for f, s in zip(flops[args.warmup :], seconds))
    row = {
        "step_ms": round(1000 * median, 1),
        "first_step_s": round(first, 2) if first is not None else None,
        "non_pad_tokens_per_s": round(rate),
        "model_tflops_per_s": round(achieved / 1e12, 2),
        "model_tflops_per_step": round(statistics.median(flops[args.warmup :]) / 1e12, 6),
        "non_pad_tokens": sum(non_pad),
        "mfu": None if peak is None else float(f"{achieved / peak:.4g}"),
        "padding_fraction": round(1 - sum(non_pad) / sum(step.padded_tokens(t) for t in timed), 4),
        "syncs_counted": None if counter is None else len(counter.events),
        "sync_sites": None if counter is None else counter.summary() or None,
        "cuda_syncs": cuda_syncs(step, timed[0], args.seed, device) if cuda_check else None,
    }
    if isinstance(step, OurStep) and step.cfg.compile:
        from torch._dynamo.utils import counters  # imported where compiled: dynamo's import costs seconds

        row["graph_breaks"] = sum(counters["graph_break"].values())
        row["graphs"] = counters["stats"]["unique_graphs"]
    if device.type == "cuda":
        row["peak_mem_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
        row["alloc_retries"] = torch.cuda.memory_stats(device).get("num_alloc_retries", 0) - retries
    return row


def run_dims(dims: str, args, device: torch.device, peak, rows: list[dict], written) -> None:
    """Every configuration of ``dims``, appended to ``rows``; ``written()`` after each."""
    objectives = (args.xl_objectives if dims == "xl" else args.objectives).split(",")
    micros = (args.xl_micro_batches if dims == "xl" else args.micro_batches).split(",")
    variants = [] if args.compile_only else [(layout, False) for layout in args.layouts.split(",")]
    if args.compile or args.compile_only:
        variants += [(layout, True) for layout in args.layouts.split(",")[:1]]
    probe = recipe(dims, objectives[0], args.tokens_per_step, "auto", "auto", False)
    batches = step_batches(args, probe.max_len, args.warmup + args.steps)

    def record(row: dict, build) -> None:
        try:
            row.update(build())
        except torch.OutOfMemoryError:
            row["out_of_memory"] = True
        if device.type == "cuda":
            torch.cuda.empty_cache()
        rows.append(row)
        written()
        print(json.dumps(row), flush=True)

    for objective in objectives:
        for micro in micros:
            for layout, compiled in variants:
                cfg = recipe(dims, objective, args.tokens_per_step, micro, layout, compiled, args.cuda_graphs)
                # CUDA's own synchronisation count (check): once per objective and layout, at the largest micro-batch
                row = {"dims": dims, "L": cfg.max_len, "model": "ours", "objective": objective, "layout": layout,
                       "compiled": compiled, "cuda_graphs": cfg.cuda_graphs, "tokens_per_step": cfg.tokens_per_step}  # fmt: skip

                def build(cfg=cfg, row=row, check=micro == micros[-1]):
                    torch.manual_seed(args.seed)
                    with torch.device(device):  # initialise on the device: xl has 0.7 B parameters
                        step = OurStep(cfg, device)
                    row.update(
                        micro_tokens=step.layout.micro_tokens,
                        accumulation=step.layout.accumulation,
                        auto=_auto_layout(step) == Layout(cfg.attention),
                    )
                    row["estimate_gib"] = _estimate_gib(cfg, step)
                    return measure(step, batches, step_model_flops(cfg, batches, args.seed), args, device, peak, check)

                record(row, build)
    if not args.no_hf and "mlm" in objectives and dims != "xl":
        for micro in args.hf_micro_batches.split(","):
            cfg = recipe(dims, "mlm", args.tokens_per_step, micro, "padded", False)
            row = {"dims": dims, "L": cfg.max_len, "model": "hf_esm", "objective": "mlm", "layout": "hf-default",
                   "compiled": False, "tokens_per_step": cfg.tokens_per_step, "micro_tokens": int(micro)}  # fmt: skip

            def build_hf_row(cfg=cfg, micro=int(micro)):
                torch.manual_seed(args.seed)
                with torch.device(device):
                    step = HfStep(cfg, micro, device)
                return measure(step, batches, step_model_flops(cfg, batches, args.seed), args, device, peak)

            record(row, build_hf_row)


def _estimate_gib(cfg: TrainConfig, step: OurStep) -> float | None:
    """``pmlm plan``'s peak-memory estimate of this step, or None where the estimate does not model it (CPU dropout)."""
    try:
        precision = budget.Arithmetic(Precision.AUTO.on(step.device.type), step.device.type)
        params = budget.count_parameters(cfg.model_config(), cfg.objective.kind)
        estimate = budget.peak_memory(cfg, params, 1, precision, step.layout.accumulation)
    except ConfigError:
        return None
    return round(estimate["total_bytes"] / 2**30, 2)


def _auto_layout(step: OurStep) -> Layout:
    """The layout ``attention: auto`` takes for this step's device and precision."""
    setting = step.model.encoder.attention
    step.model.encoder.attention = Layout.AUTO.value
    try:
        return step.model.encoder.layout(step.device, step.dtype, grad=True)
    finally:
        step.model.encoder.attention = setting


# -- the summary -----------------------------------------------------------------------------------------------------


def summarise(rows: list[dict]) -> dict:
    """Per dims: the best rate per objective, PMLM / MLM and ours / HF at the best, auto / best layout per micro-batch."""
    ok = [r for r in rows if "step_ms" in r]
    out = {}
    for dims in sorted({r["dims"] for r in ok}):
        mine = [r for r in ok if r["dims"] == dims and r["model"] == "ours"]
        best = {o: max((r for r in mine if r["objective"] == o), key=lambda r: r["non_pad_tokens_per_s"], default=None)
                for o in ("mlm", "pmlm")}  # fmt: skip
        hf = max((r for r in ok if r["dims"] == dims and r["model"] == "hf_esm"),
                 key=lambda r: r["non_pad_tokens_per_s"], default=None)  # fmt: skip
        entry = {f"best_{o}": _brief(r) for o, r in best.items() if r}
        if best["mlm"] and best["pmlm"]:
            # the same micro-batch and layout for both, the PMLM's best: its extra cost at equal settings
            twin = next((r for r in mine if r["objective"] == "mlm" and _same_setting(r, best["pmlm"])), None)
            if twin:
                entry["pmlm_over_mlm_step"] = round(best["pmlm"]["step_ms"] / twin["step_ms"], 3)
        for o, r in best.items():
            if r and hf:
                entry[f"ours_{o}_over_hf_tokens_per_s"] = round(
                    r["non_pad_tokens_per_s"] / hf["non_pad_tokens_per_s"], 2
                )
        auto = []
        for r in mine:
            if r.get("auto"):
                rivals = [x for x in mine if x["objective"] == r["objective"] and x["micro_tokens"] == r["micro_tokens"]
                          and x["compiled"] == r["compiled"]]  # fmt: skip
                top = max(x["non_pad_tokens_per_s"] for x in rivals)
                auto.append({"objective": r["objective"], "micro_tokens": r["micro_tokens"], "compiled": r["compiled"],
                             "auto": r["layout"], "best_over_auto": round(top / r["non_pad_tokens_per_s"], 3)})  # fmt: skip
        entry["auto_vs_best_layout"] = auto
        out[dims] = entry
    return out


def _same_setting(a: dict, b: dict) -> bool:
    return all(a.get(k) == b.get(k) for k in ("micro_tokens", "layout", "compiled"))


def _brief(r: dict) -> dict:
    keys = ("micro_tokens", "layout", "compiled", "step_ms", "non_pad_tokens_per_s", "mfu", "peak_mem_gib")
    return {k: r.get(k) for k in keys}


def markdown(result: dict) -> str:
    lines = [
        f"# The recipe's step on {result['device']} (torch {result['torch']}, peak {result['peak_source']}), "
        f"{result['tokens_per_step']:,} tokens per step",
        "",
        "| dims | model | objective | micro-batch x accum | layout | auto | compiled | step ms | non-pad tok/s | MFU "
        "| peak / estimate GiB | retries | syncs (ops / CUDA) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        head = f"| {r['dims']} | {r['model']} | {r['objective']} | {r.get('micro_tokens', '')} x {r.get('accumulation', '')} | "
        head += f"{r['layout']} | {'yes' if r.get('auto') else ''} | {r['compiled']} | "
        if r.get("out_of_memory"):
            lines.append(head + "out of memory | | | | | |")
            continue
        mfu = "" if r.get("mfu") is None else f"{100 * r['mfu']:.1f} %"
        memory = f"{r.get('peak_mem_gib', '')} / {r.get('estimate_gib', '')}"
        lines.append(
            head
            + f"{r['step_ms']} | {r['non_pad_tokens_per_s']:,} | {mfu} | {memory} | {r.get('alloc_retries', '')} | "
            f"{r.get('syncs_counted', '')} / {r.get('cuda_syncs', '')} |"
        )
    lines += ["", "```json", json.dumps(result["summary"], indent=1), "```", "", f"Bars: {json.dumps(result['bars'])}"]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    args = parse_args(argv)
    device = torch.device(
        "cuda"
        if args.device == "auto" and torch.cuda.is_available() and not args.smoke
        else ("cpu" if args.device == "auto" else args.device)
    )
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high")  # as the training loop
    if not args.no_hf:
        try:
            import transformers  # noqa: F401
        except ImportError:
            print("bench_gpu_throughput: transformers is not installed; HF EsmForMaskedLM skipped", file=sys.stderr)
            args.no_hf = True
    peak, peak_source = peak_flops(device, args.peak_tflops)
    rows: list[dict] = []
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    def write() -> None:  # after every row: a run stopped by a time limit keeps what it measured
        result = _result(args, device, peak, peak_source, rows)
        out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
        out.with_suffix(".md").write_text(markdown(result))

    for dims in args.dims.split(","):
        run_dims(dims, args, device, peak, rows, write)
    print(out.with_suffix(".md").read_text())
    return 0


def _result(args, device: torch.device, peak, peak_source: str, rows: list[dict]) -> dict:
    return {
        "bench": "gpu_throughput",
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "transformers": None if args.no_hf else __import__("transformers").__version__,
        "peak_flops": peak,
        "peak_source": peak_source,
        "tokens_per_step": args.tokens_per_step,
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "lengths_from": args.shards or f"lognormal (median {args.median}, sigma {LENGTH_SIGMA})",
        "rows": rows,
        "summary": summarise(rows),
        "bars": BARS,
    }


if __name__ == "__main__":
    raise SystemExit(main())
