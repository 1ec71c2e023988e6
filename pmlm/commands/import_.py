"""``pmlm import SOURCE -o DIR``: a released fairseq PMLM / MLM checkpoint (pmlm.fairseq_checkpoint), a
``transformers`` ESM folder or hub id, or a folder written by ``pmlm export`` (pmlm.hf_import) as an encoder."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pmlm.outputs import OVERWRITE_HELP
from pmlm.vocabulary import OBJECTIVES


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.epilog = (
        "Reads a checkpoint of the released PMLM code (fairseq 0.10.2: prot_pmlm_* or prot_mlm_* archs, e.g. "
        "pmlm_650m.pt) without fairseq and without running pickled code, and writes DIR/model.safetensors and "
        "DIR/model.json, an encoder that pmlm embed / contacts / score / finetune read. The file's name, "
        "sha256 and architecture are recorded in model.json. A folder (or a hub id OWNER/NAME, fetched by "
        "transformers where the machine has network) is read as a transformers model: an ESM model (ESM-2; "
        "DIR becomes its transformers folder plus model.json, run through transformers) or a folder written by "
        "pmlm export (read back tensor for tensor). DIR is a folder of its own: one holding files pmlm import did "
        "not write is refused (--overwrite replaces only its own); nothing appears there unless the import succeeds. "
        "See docs/huggingface.md."
    )
    p.add_argument(
        "checkpoint",
        metavar="SOURCE",
        help="the fairseq checkpoint (.pt), a transformers model folder, or a hub id (OWNER/NAME)",
    )
    p.add_argument(
        "-o",
        "--out",
        required=True,
        metavar="DIR",
        type=Path,
        help="folder for model.safetensors and model.json (created if missing)",
    )
    p.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    p.add_argument("--revision", help="a hub id's revision (branch, tag or commit); ignored for local files")
    p.add_argument(
        "--objective",
        choices=OBJECTIVES,
        help="the objective the checkpoint must have been trained with (an error otherwise; the workflow "
        "passes its config's)",
    )


def run(args: argparse.Namespace) -> int:
    # engine imports on use, so that the parsers stay light (pmlm/commands/__init__.py)
    from pmlm.hf_import import import_source, is_transformers_source

    transformers_source = is_transformers_source(args.checkpoint)
    path = import_source(args.checkpoint, args.out, args.objective, args.revision, overwrite=args.overwrite)
    info = json.loads(path.with_suffix(".json").read_text())
    cfg = info["model"]
    if transformers_source:
        kind = "an ESM model" if cfg.get("architecture") else "an exported pmlm encoder"
        print(
            f"pmlm import: {args.checkpoint} ({kind}, {cfg['num_layers']} x {cfg['hidden']}, "
            f"{info['objective']['name']}) -> {path} (+ {path.with_suffix('.json').name})",
            file=sys.stderr,
        )
        return 0
    source = info["source"]
    print(
        f"pmlm import: {source['arch']} ({cfg['num_layers']} x {cfg['hidden']}, {info['objective']['name']}) "
        f"-> {path} (+ {path.with_suffix('.json').name}); left out: {', '.join(source['dropped']) or 'nothing'}",
        file=sys.stderr,
    )
    return 0
