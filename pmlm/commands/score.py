"""``pmlm score MODEL --sequence FASTA --mutations muts.csv -o scores.tsv``: mutant scores
(see pmlm.inference.mutations)."""

from __future__ import annotations

import argparse
import sys

from pmlm.commands import add_precision


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.epilog = (
        "Singles A23G: masked marginal log P(mut) - log P(wt), the site masked. Doubles A23G:L40P: the pair "
        "head's joint with both sites masked, log P(a', b') - log P(a, b), and epistasis = that minus the sum "
        "of the singles; encoders without a pair head (MLM) give the additive double score. Triples "
        "A23G:L40P:K51E: the Triple MLM's joint with the three sites masked, else the singles plus the three "
        "pairs' epistasis (pairs), else additive. Output TSV: mutant, kind, score, additive, epistasis, "
        "double_from (pair_joint | additive), triple_from (triple_joint | pairs | additive), precision (fp32 | bf16, "
        "the arithmetic of the forward passes)."
    )
    p.add_argument("model", metavar="MODEL", help="encoder: model.safetensors (with model.json) or its folder")
    p.add_argument("--sequence", required=True, metavar="FASTA", help="the wild-type sequence (one record)")
    p.add_argument(
        "--mutations",
        required=True,
        metavar="CSV",
        help="CSV with a header and a 'mutant' column: A23G, A23G:L40P or A23G:L40P:K51E (1-based)",
    )
    p.add_argument("-o", "--out", required=True, metavar="SCORES.tsv")
    p.add_argument(
        "--double",
        choices=("auto", "pair", "additive"),
        default="auto",
        help="double mutants: from the pair head's joint (pair), the sum of the singles (additive), or "
        "the joint when the encoder has a pair head (auto, default)",
    )
    p.add_argument(
        "--triple",
        choices=("auto", "triple", "pairs", "additive"),
        default="auto",
        help="triple mutants: from the triple head's joint (triple, a Triple MLM), the singles plus the "
        "pairs' epistasis (pairs), the sum of the singles (additive), or the richest the encoder has "
        "(auto, default)",
    )
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    add_precision(p, "the encoder's")


def run(args: argparse.Namespace) -> int:
    # engine imports on use, so that the parsers stay light (pmlm/commands/__init__.py)
    from pmlm.inference.mutations import score_fasta

    done = score_fasta(
        args.model,
        args.sequence,
        args.mutations,
        args.out,
        double=args.double,
        triple=args.triple,
        device=args.device,
        precision=args.precision,
    )
    rows = done["rows"]
    parts = [f"{sum(r['kind'] == 'single' for r in rows)} single"]
    for kind in ("double", "triple"):
        chosen = [r for r in rows if r["kind"] == kind]
        if chosen:
            sources = sorted({r[f"{kind}_from"] for r in chosen})
            parts.append(f"{len(chosen)} {kind} ({kind}_from {', '.join(sources)})")
    print(f"pmlm score: {done['id']}: {', '.join(parts)} mutants ({done['precision']}) -> {args.out}", file=sys.stderr)
    return 0
