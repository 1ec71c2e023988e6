"""``pmlm import CKPT -o DIR``: a released fairseq PMLM / MLM checkpoint as an encoder (pmlm.fairseq_checkpoint)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pmlm.vocabulary import MLM, PMLM


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.epilog = (
        "Reads a checkpoint of the released PMLM code (fairseq 0.10.2: prot_pmlm_* or prot_mlm_* archs, e.g. "
        "pmlm_650m.pt) without fairseq and without running pickled code, and writes DIR/model.safetensors and "
        "DIR/model.json, an encoder that pmlm embed / contacts / score / finetune read. The file's name, "
        "sha256 and architecture are recorded in model.json."
    )
    p.add_argument("checkpoint", metavar="CKPT", type=Path, help="the fairseq checkpoint (.pt)")
    p.add_argument(
        "-o",
        "--out",
        required=True,
        metavar="DIR",
        type=Path,
        help="folder for model.safetensors and model.json (created if missing)",
    )
    p.add_argument(
        "--objective",
        choices=(MLM, PMLM),
        help="the objective the checkpoint must have been trained with (an error otherwise; the workflow "
        "passes its config's)",
    )


def run(args: argparse.Namespace) -> int:
    # engine imports on use, so that the parsers stay light (pmlm/commands/__init__.py)
    from pmlm.fairseq_checkpoint import import_checkpoint

    path = import_checkpoint(args.checkpoint, args.out, args.objective)
    info = json.loads(path.with_suffix(".json").read_text())
    cfg, source = info["model"], info["source"]
    print(
        f"pmlm import: {source['arch']} ({cfg['num_layers']} x {cfg['hidden']}, {info['objective']['name']}) "
        f"-> {path} (+ {path.with_suffix('.json').name}); left out: {', '.join(source['dropped']) or 'nothing'}",
        file=sys.stderr,
    )
    return 0
