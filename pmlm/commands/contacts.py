"""``pmlm contacts MODEL FASTA -o OUT/``: contact maps per sequence (see pmlm.inference.contacts)."""

from __future__ import annotations

import argparse
import sys

from pmlm.commands import add_precision


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.epilog = (
        "Per sequence: NAME.tsv (pairs i < j, 1-based, highest score first), NAME.npz (scores (L, L)) and with "
        "--png NAME.png. With --head the score is the head's contact probability; without, the pair head's "
        "unsupervised read-out (KL of the joint from independence, APC), a ranking score. NAME.npz also records "
        "the score kind and the precision the forward passes used."
    )
    p.add_argument("model", metavar="MODEL", help="encoder: model.safetensors (with model.json) or its folder")
    p.add_argument("fasta", metavar="FASTA", help="sequences (FASTA or FASTA.gz)")
    p.add_argument("-o", "--out", required=True, metavar="OUT_DIR", help="output folder (replaced as a whole)")
    p.add_argument(
        "--head",
        metavar="HEAD",
        help="fine-tuned contact head: head.safetensors (with head.json) or its folder; "
        "MODEL must be the encoder it was fine-tuned on (checked by sha256)",
    )
    p.add_argument(
        "--structure",
        metavar="CHAINS.jsonl",
        help="true structures (the tasks' structure JSONL) matched to FASTA ids by id_chain or id: "
        "adds a contact column, P@L/5 and the true map to the PNG",
    )
    p.add_argument("--png", action="store_true", help="also write a contact-map PNG per sequence")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    add_precision(p, "the head's (without --head the encoder's)")


def run(args: argparse.Namespace) -> int:
    # engine imports on use, so that the parsers stay light (pmlm/commands/__init__.py)
    from pmlm.inference.contacts import predict_contacts

    done = predict_contacts(
        args.model,
        args.fasta,
        args.out,
        head=args.head,
        structure=args.structure,
        png=args.png,
        device=args.device,
        precision=args.precision,
    )
    missing = done["without_structure"]
    note = f"; {missing} without a structure in {args.structure}" if missing else ""
    summary = f"{done['sequences']} sequences ({done['kind']}, {done['precision']}) -> {args.out}{note}"
    print(f"pmlm contacts: {summary}", file=sys.stderr)
    return 0
