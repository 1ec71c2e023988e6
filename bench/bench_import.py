"""Benchmark: `pmlm import` of a checkpoint shaped like the released PMLM-650M, and the released model's cost in use.

Makes, in a temporary folder (never committed), a checkpoint in the released format: fairseq 0.10.2's
``save_state`` layout (``args`` Namespace of ``prot_pmlm_1b`` as pmlm/script/pretrain.sh trains it, ``model`` state
dict with the released code's tensor names and shapes, random fp32 weights, ``optimizer_history``,
``extra_state``; no optimiser state, as the released file has none), saved with ``torch.save``. Then, each as a
separate process as a user runs it:

* `pmlm import` (wall time; peak RSS from ``getrusage``, against the bar of 1.5 x the file's size);
* parameter count of the file against the released file's size (2,723,505,310 bytes): fp32 parameters are 4 bytes
  each, and the rest is the pickle and the zip records;
* `pmlm embed` and `pmlm contacts` (the pair head's read-out) of one 300-residue chain on ``--threads`` CPU threads
  (whole commands: loading the 2.7 GB encoder included; the forward passes alone are printed too).

    python bench/bench_import.py            # prot_pmlm_1b: 34 x 1280, 20 heads, ffn 5120, 768 positions (~5.5 GB of disk)
    python bench/bench_import.py --quick    # 2 x 64: a smoke run of the same steps, not the bar
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from argparse import Namespace
from pathlib import Path

import torch

RELEASED_SIZE = 2_723_505_310  # bytes of pretrained/pmlm_650m.pt (its Git LFS pointer)
BAR = 1.5  # peak RSS / file size
DIMS = {
    "default": {"layers": 34, "hidden": 1280, "ffn": 5120, "heads": 20, "positions": 768},
    "quick": {"layers": 2, "hidden": 64, "ffn": 256, "heads": 4, "positions": 128},
}
VOCAB = 27  # the released dictionary


def released_args(dims: dict) -> Namespace:
    """The ``args`` of a prot_pmlm_1b run of pmlm/script/pretrain.sh (the model's keys as its arch fills them)."""
    return Namespace(
        arch="prot_pmlm_1b",
        task="prot_pmlm",
        criterion="prot_pmlm",
        pretrain_task="pcomb",
        optimizer="adam",
        adam_betas="(0.9,0.98)",
        adam_eps=1e-06,
        clip_norm=1.0,
        lr_scheduler="polynomial_decay",
        lr=[0.0001],
        total_num_update=2000000,
        warmup_updates=20000,
        update_freq=[16],
        weight_decay=0.01,
        fp16=True,
        tokens_per_sample=dims["positions"],
        max_positions=dims["positions"],
        max_tokens=768,
        sample_break_mode="eos",
        mask_prob=0.15,
        leave_unmasked_prob=0.1,
        random_token_prob=0.1,
        dropout=0.1,
        attention_dropout=0.1,
        act_dropout=0.0,
        share_encoder_input_output_embed=False,
        encoder_learned_pos=False,
        no_token_positional_embeddings=False,
        num_segment=2,
        sentence_class_num=2,
        sent_loss=False,
        apply_bert_init=False,
        activation_fn="relu",
        pooler_activation_fn="tanh",
        encoder_normalize_before=False,
        encoder_embed_dim=dims["hidden"],
        encoder_layers=dims["layers"],
        encoder_attention_heads=dims["heads"],
        encoder_ffn_embed_dim=dims["ffn"],
        seed=1,
    )


def released_shapes(dims: dict) -> dict[str, tuple[int, ...]]:
    """Tensor names and shapes of a released prot_pmlm model (fairseq's TransformerSentenceEncoder + the heads)."""
    c, f = dims["hidden"], dims["ffn"]
    pre = "encoder.sentence_encoder."
    shapes = {
        pre + "embed_tokens.weight": (VOCAB, c),
        pre + "segment_embeddings.weight": (2, c),
        pre + "embed_positions._float_tensor": (1,),
    }
    for i in range(dims["layers"]):
        layer = f"{pre}layers.{i}."
        for proj in ("k_proj", "v_proj", "q_proj", "out_proj"):
            shapes[f"{layer}self_attn.{proj}.weight"] = (c, c)
            shapes[f"{layer}self_attn.{proj}.bias"] = (c,)
        shapes.update(
            {
                f"{layer}self_attn_layer_norm.weight": (c,),
                f"{layer}self_attn_layer_norm.bias": (c,),
                f"{layer}fc1.weight": (f, c),
                f"{layer}fc1.bias": (f,),
                f"{layer}fc2.weight": (c, f),
                f"{layer}fc2.bias": (c,),
                f"{layer}final_layer_norm.weight": (c,),
                f"{layer}final_layer_norm.bias": (c,),
            }
        )
    shapes.update(
        {
            "encoder.lm_output_learned_bias": (VOCAB,),
            "encoder.masked_lm_pooler.weight": (c, c),
            "encoder.masked_lm_pooler.bias": (c,),
            "encoder.lm_head_transform_weight.weight": (c, c),
            "encoder.lm_head_transform_weight.bias": (c,),
            "encoder.layer_norm.weight": (c,),
            "encoder.layer_norm.bias": (c,),
            "encoder.plm_head_transform_weight.weight": (2 * c, 2 * c),
            "encoder.plm_head_transform_weight.bias": (2 * c,),
            "encoder.p_layer_norm.weight": (2 * c,),
            "encoder.p_layer_norm.bias": (2 * c,),
            "encoder.embed_out.weight": (VOCAB, c),
            "encoder.pair_out.weight": (VOCAB * VOCAB, 2 * c),
            "encoder.pair_out.bias": (VOCAB * VOCAB,),
        }
    )
    return shapes


def write_released_checkpoint(path: Path, dims: dict, seed: int = 0) -> int:
    """A checkpoint in the released layout with random fp32 weights; returns its parameter count."""
    generator = torch.Generator().manual_seed(seed)
    model = {}
    for name, shape in released_shapes(dims).items():
        # N(0, 1/fan_in): activations stay O(1) through the layers, as in a trained model
        model[name] = torch.randn(shape, generator=generator) / math.sqrt(shape[-1])
    state = {
        "args": released_args(dims),
        "model": model,
        "optimizer_history": [
            {
                "criterion_name": "ProtPairwiseMaskedLMCriterion",
                "optimizer_name": "FP16Optimizer",
                "lr_scheduler_state": {"best": 3.9746},
                "num_updates": 1000000,
            }
        ],
        "extra_state": {
            "train_iterator": {"version": 2, "epoch": 10, "iterations_in_epoch": 0, "shuffle": False},
            "val_loss": 3.9746,
            "best": 3.9746,
            "previous_training_time": 8.6e6,
            "metrics": {"train": [(100, "loss", "AverageMeter", {"val": 4.0, "sum": 4.0, "count": 1, "round": 3})]},
        },
    }
    torch.save(state, path)
    return sum(t.numel() for t in model.values())


def run_measured(argv: list[str], threads: int) -> dict:
    """Run ``pmlm ARGV`` in a fresh process with ``threads`` CPU threads: wall seconds and peak RSS (bytes)."""
    code = (
        "import json, resource, sys, time; from pmlm.cli import main; t = time.perf_counter(); "
        "rc = main(sys.argv[1:]); wall = time.perf_counter() - t; "
        "print(json.dumps({'rc': rc, 'wall_s': wall, "
        "'max_rss': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}), file=sys.stderr)"
    )
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code, *argv], env=env, capture_output=True, text=True)
    total = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"pmlm {' '.join(argv)} failed: {proc.stderr[-2000:]}")
    result = json.loads(proc.stderr.strip().splitlines()[-1])
    return {**result, "process_wall_s": total}


def forward_seconds(encoder_dir: Path, sequence: str, threads: int) -> dict:
    """The encoder's forward pass alone on the chain, and the pair read-out's forward, in this process."""
    from pmlm import alphabet
    from pmlm.pretrained import load_encoder
    from pmlm.tokens import batch_tokens

    torch.set_num_threads(threads)
    model, _, _ = load_encoder(encoder_dir, torch.device("cpu"))
    tokens = torch.from_numpy(batch_tokens([alphabet.encode(sequence)]).tokens).long()
    with torch.no_grad():
        model.encode(tokens)  # warm-up
        start = time.perf_counter()
        model.encode(tokens)
        encode = time.perf_counter() - start
    return {"encode_s": encode}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="tiny dims: a smoke run, not the bar")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--length", type=int, help="residues of the chain embedded and read out (default 300; --quick 100)")
    ap.add_argument(
        "--workdir", type=Path, help="where the checkpoint and the encoder go (default: a temporary folder)"
    )
    ap.add_argument("--out", type=Path, help="also write the JSON result here")
    args = ap.parse_args(argv)
    dims = DIMS["quick" if args.quick else "default"]
    args.length = args.length or (100 if args.quick else 300)
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        tmp = Path(tmp)
        ckpt = tmp / "pmlm_650m_shaped.pt"
        start = time.perf_counter()
        params = write_released_checkpoint(ckpt, dims)
        made_s = time.perf_counter() - start
        size = ckpt.stat().st_size
        imported = run_measured(["import", str(ckpt), "-o", str(tmp / "encoder")], args.threads)
        generator = torch.Generator().manual_seed(1)
        from pmlm.alphabet import RESIDUES

        sequence = "".join(RESIDUES[i] for i in torch.randint(len(RESIDUES), (args.length,), generator=generator))
        fasta = tmp / "chain.fasta"
        fasta.write_text(f">chain\n{sequence}\n")
        embed = run_measured(
            ["embed", str(tmp / "encoder"), str(fasta), "-o", str(tmp / "chain.parquet"), "--device", "cpu"],
            args.threads,
        )
        contacts = run_measured(
            ["contacts", str(tmp / "encoder"), str(fasta), "-o", str(tmp / "contacts"), "--device", "cpu"], args.threads
        )
        forward = forward_seconds(tmp / "encoder", sequence, args.threads)
    load1, _, _ = os.getloadavg()
    result = {
        "dims": dims,
        "threads": args.threads,
        "length": args.length,
        "load_avg_1min": load1,
        "checkpoint_bytes": size,
        "parameters": params,
        "fp32_parameter_bytes": 4 * params,
        "overhead_bytes": size - 4 * params,
        "made_s": made_s,
        "released_bytes": RELEASED_SIZE,
        "released_minus_params_bytes": RELEASED_SIZE - 4 * params,
        "import_wall_s": imported["wall_s"],
        "import_max_rss": imported["max_rss"],
        "import_rss_over_size": imported["max_rss"] / size,
        "bar": BAR,
        "embed_wall_s": embed["wall_s"],
        "embed_max_rss": embed["max_rss"],
        "contacts_wall_s": contacts["wall_s"],
        "contacts_max_rss": contacts["max_rss"],
        **forward,
    }
    print(json.dumps(result))
    print(
        f"import {size / 1e9:.2f} GB ({params / 1e6:.1f} M fp32 parameters, {result['overhead_bytes']:,} bytes of "
        f"pickle and zip records): {imported['wall_s']:.1f} s, peak RSS {imported['max_rss'] / 1e9:.2f} GB = "
        f"{result['import_rss_over_size']:.2f} x the file (bar <= {BAR}); the released file is "
        f"{RELEASED_SIZE - 4 * params:+,} bytes from these parameters' fp32 size. {args.length} residues on "
        f"{args.threads} threads: pmlm embed {embed['wall_s']:.1f} s, pmlm contacts {contacts['wall_s']:.1f} s "
        f"(forward alone {forward['encode_s']:.2f} s); load average {load1:.1f}"
    )
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if args.quick or result["import_rss_over_size"] <= BAR else 1


if __name__ == "__main__":
    sys.exit(main())
