"""``pmlm export ENCODER -o DIR``: a pmlm encoder as a folder ``transformers`` loads offline (pmlm.hf_export)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pmlm.outputs import OVERWRITE_HELP


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.epilog = (
        "Writes DIR/config.json, DIR/model.safetensors and a tokenizer with pmlm's token ids. Encoders with "
        "post-LN layers, an embedding LayerNorm, GELU and only a token head (the MLM family) become a stock "
        "RobertaForMaskedLM; the others (PMLM with its pair head, the pair-only variant, the Triple MLM, ReLU or "
        "pre-LN layers) a class of pmlm's own shipped in DIR (modeling_pmlm.py; load with trust_remote_code=True). "
        "config.json's pmlm section carries model.json's settings and provenance; pmlm import DIR reads it back. "
        "With --adapter RUN, the run's LoRA adapters are merged into the weights first (an imported ESM encoder is "
        "then written as its own EsmForMaskedLM folder). "
        "DIR is a folder of its own: one holding files pmlm export did not write is refused (--overwrite replaces "
        "only its own); nothing appears there unless the export succeeds. See docs/huggingface.md."
    )
    p.add_argument("encoder", metavar="ENCODER", type=Path, help="model.safetensors (with model.json) or its folder")
    p.add_argument("-o", "--out", required=True, metavar="DIR", type=Path, help="folder to write (created if missing)")
    p.add_argument(
        "--adapter",
        metavar="RUN",
        help="a fine-tuned run with adapters (its head.safetensors or folder, trained on ENCODER): its adapters are "
        "merged into the exported weights (W + alpha / r * B A), a plain encoder without them",
    )
    p.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)


def run(args: argparse.Namespace) -> int:
    # engine imports on use, so that the parsers stay light (pmlm/commands/__init__.py)
    from pmlm.hf_export import LAYOUT_CLASSES, export_encoder

    out, layout = export_encoder(args.encoder, args.out, overwrite=args.overwrite, adapter=args.adapter)
    print(f"pmlm export: {args.encoder} -> {out} ({LAYOUT_CLASSES[layout]})", file=sys.stderr)
    return 0
