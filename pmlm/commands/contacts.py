"""``pmlm contacts MODEL FASTA -o DIR|NAME.parquet``: the contact pairs of every sequence, from a fine-tuned contact
head or an unsupervised read-out of the encoder (see pmlm.inference.contacts)."""

from __future__ import annotations

import argparse
import sys

from pmlm.commands import add_adapter, add_device, add_precision, add_unknown, print_repairs
from pmlm.inference.options import Readout
from pmlm.outputs import OVERWRITE_HELP
from pmlm.tokens import DEFAULT_TOKENS_PER_BATCH

EPILOG = """\
Scores: with --head the head's contact probability (score_kind probability); without, an unsupervised read-out
that ranks pairs (not a probability; it can be negative): --readout pair, the pair head's KL of the joint from
independence with APC (pair_kl_apc, PMLM encoders), or --readout jacobian, the token head's categorical Jacobian
(Frobenius norm of each pair's 20 x 20 block, symmetrised, APC: jacobian_apc, any encoder with a token head: MLM,
PMLM, imported ESM). auto (default): pair where the encoder has a pair head, else jacobian. The Jacobian costs
L x 20 + 1 forward passes per window, batched by --tokens-per-batch.

Rows: pairs with j - i >= --min-separation (default 6; short range 6-11, medium 12-23, long >= 24), highest score
first, with --top L, L/K (floor(L/K)) or N the first of them per sequence. A sequence longer than the window is read
as overlapping windows (half a window apart) and a pair's score is the mean over the windows holding both residues;
pairs no window holds get no row (the summary counts them).

-o DIR writes per-sequence files: NAME.tsv (i j residue_i residue_j separation score, 1-based, + contact with
--structure), NAME.npz (scores (L, L) float32 of every pair, NaN where no window holds it, with the score kind,
precision and settings) and with --png NAME.png. -o NAME.parquet writes one table of every sequence's pairs: id, i,
j, residue_i, residue_j, separation, score (+ contact), the settings (model sha256, score_kind, window, precision,
min_separation, top, unknown, pmlm_version) as JSON under the schema metadata key pmlm. A folder holding files this command
did not write is refused (--overwrite replaces only its own); nothing appears unless the command succeeds.

With --structure: the long-range (j - i >= 24) P@L and P@L/5 of each sequence with a structure, and their means."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.epilog = EPILOG
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument(
        "model", metavar="MODEL", help="encoder: model.safetensors (with model.json), its folder or its model.json"
    )
    p.add_argument("fasta", metavar="FASTA", help="sequences (FASTA or FASTA.gz)")
    p.add_argument(
        "-o",
        "--out",
        required=True,
        metavar="DIR|NAME.parquet",
        help="-o DIR writes per-sequence files; -o NAME.parquet writes one table of every sequence's pairs",
    )
    p.add_argument(
        "--head",
        metavar="HEAD",
        help="fine-tuned contact head: head.safetensors (with head.json) or its folder; "
        "MODEL must be the encoder it was fine-tuned on (checked by sha256)",
    )
    p.add_argument(
        "--readout",
        type=Readout.argument,
        choices=Readout.values(),
        default=Readout.AUTO,
        help="unsupervised read-out without --head: pair (the pair head's KL + APC), jacobian (the token head's "
        "categorical Jacobian + APC) or auto (default: pair if the encoder has a pair head, else jacobian)",
    )
    p.add_argument(
        "--min-separation",
        type=int,
        default=6,
        metavar="S",
        help="rows for pairs with j - i >= S (default 6; short 6-11, medium 12-23, long >= 24)",
    )
    p.add_argument(
        "--top",
        metavar="L|L/K|N",
        help="rows per sequence: the top L, floor(L/K) or N pairs by score after the separation filter (default: all)",
    )
    p.add_argument(
        "--tokens-per-batch",
        type=int,
        default=DEFAULT_TOKENS_PER_BATCH,
        metavar="T",
        help=f"token budget of one forward pass of the Jacobian's substituted copies (default {DEFAULT_TOKENS_PER_BATCH})",
    )
    p.add_argument(
        "--structure",
        metavar="CHAINS.jsonl",
        help="true structures (the tasks' structure JSONL) matched to FASTA ids by id_chain or id: "
        "adds a contact column, the long-range P@L and P@L/5, and the true map to the PNG",
    )
    p.add_argument("--png", action="store_true", help="also write a contact-map PNG per sequence (-o DIR only)")
    add_unknown(p)
    add_device(p)
    add_precision(p, "the head's (without --head the encoder's)")
    add_adapter(p)
    p.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)


def run(args: argparse.Namespace) -> int:
    # engine imports on use, so that the parsers stay light (pmlm/commands/__init__.py)
    from pmlm.inference.contacts import predict_contacts

    done = predict_contacts(
        args.model,
        args.fasta,
        args.out,
        head=args.head,
        readout=args.readout,
        structure=args.structure,
        png=args.png,
        device=args.device,
        precision=args.precision,
        min_separation=args.min_separation,
        top=args.top,
        tokens_per_batch=args.tokens_per_batch,
        unknown=args.unknown,
        overwrite=args.overwrite,
        adapter=args.adapter,
    )
    print_repairs("pmlm contacts", done["report"])
    parts = [
        f"{done['sequences']} sequences ({done['kind']}, {done['precision']}) -> {args.out}",
        f"{done['rows']:,} pairs with j - i >= {args.min_separation}" + (f", top {args.top}" if args.top else ""),
    ]
    if done["beyond_windows"]:
        parts.append(f"{done['beyond_windows']:,} pairs beyond the windows left out (no window holds both residues)")
    if done["with_structure"]:
        mean = ", ".join(
            f"P@{k} {'n/a' if v is None else f'{v:.3f}'}" for k, v in (("L", done["p_at_l"]), ("L/5", done["p_at_l5"]))
        )
        parts.append(f"long range mean over {done['with_structure']} chains: {mean}")
    if done["without_structure"]:
        parts.append(f"{done['without_structure']} without a structure in {args.structure}")
    print(f"pmlm contacts: {'; '.join(parts)}", file=sys.stderr)
    return 0
