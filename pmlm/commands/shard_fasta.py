"""``pmlm shard-fasta FASTA -o DIR``: a FASTA file checked once and cut into shards balanced by residues, for one
inference job each (see pmlm.inference.fasta_shards)."""

from __future__ import annotations

import argparse
import sys

from pmlm.commands.embed import UNKNOWN_CHOICES
from pmlm.outputs import OVERWRITE_HELP

DEFAULT_RESIDUES_PER_SHARD = 250_000


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.epilog = (
        "The records are checked as the inference commands check them (one-line error naming file and line; ids "
        "unique across the whole file), then cut into contiguous runs of about the same residue count: "
        "ceil(residues / --residues-per-shard) shards, each record in the one holding the middle of its residues, "
        "so the shards' outputs concatenated in order are the input's. DIR gets 00000.fasta, 00001.fasta, ... and "
        "manifest.json (input sha256, counts, repairs, and each shard's records, residues and ids' sha256, which "
        "pmlm gather checks the outputs against)."
    )
    p.add_argument("fasta", metavar="FASTA", help="sequences (FASTA or FASTA.gz)")
    p.add_argument(
        "-o",
        "--out",
        required=True,
        metavar="DIR",
        help="a folder of its own for the shards and manifest.json (one holding files this command did not write is "
        "refused; --overwrite keeps them and replaces only its own)",
    )
    p.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    p.add_argument(
        "--residues-per-shard",
        type=int,
        default=DEFAULT_RESIDUES_PER_SHARD,
        metavar="N",
        help="residues per shard: ceil(residues / N) shards of about equal size (each about N or less, give or take a record); default %(default)s",
    )
    p.add_argument(
        "--unknown",
        choices=UNKNOWN_CHOICES,
        default="error",
        help="letters outside the alphabet (B, Z, J, U, O, ...), as pmlm embed's --unknown: error (default: one "
        "line naming the file and line), x = read each as X, skip = leave such records out; counted on stderr and in "
        "the manifest",
    )


def run(args: argparse.Namespace) -> int:
    # engine imports on use, so that the parsers stay light (pmlm/commands/__init__.py)
    from pmlm.inference.fasta_shards import shard_fasta
    from pmlm.inference.sequences import SequenceReport

    manifest = shard_fasta(args.fasta, args.out, args.residues_per_shard, args.unknown, overwrite=args.overwrite)
    report = SequenceReport(sequences=manifest.records, residues=manifest.residues, **manifest.repairs)
    for line in report.repairs() or ["nothing repaired or skipped"]:
        print(f"pmlm shard-fasta: {line}", file=sys.stderr)
    residues = [s.residues for s in manifest.shards]
    print(
        f"pmlm shard-fasta: {manifest.records:,} sequences, {manifest.residues:,} residues -> {len(residues)} "
        f"shard(s) of {min(residues):,}-{max(residues):,} residues (contiguous runs) in {args.out}",
        file=sys.stderr,
    )
    return 0
