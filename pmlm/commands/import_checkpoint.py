"""``pmlm import CKPT -o DIR``: a released fairseq PMLM / MLM checkpoint as an encoder (pmlm.fairseq_checkpoint)."""

from __future__ import annotations

import argparse
from pathlib import Path

ENGINE = "pmlm.fairseq_checkpoint"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.epilog = ("Reads a checkpoint of the released PMLM code (fairseq 0.10.2: prot_pmlm_* or prot_mlm_* archs, e.g. "
                "pmlm_650m.pt) without fairseq and without running pickled code, and writes DIR/model.safetensors and "
                "DIR/model.json, an encoder that pmlm embed / contacts / score / finetune read. The file's name, "
                "sha256 and architecture are recorded in model.json.")
    p.add_argument("checkpoint", metavar="CKPT", type=Path, help="the fairseq checkpoint (.pt)")
    p.add_argument("-o", "--out", required=True, metavar="DIR", type=Path,
                   help="folder for model.safetensors and model.json (created if missing)")
    p.add_argument("--objective", choices=("mlm", "pmlm"),
                   help="the objective the checkpoint must have been trained with (an error otherwise; the workflow "
                        "passes its config's)")
