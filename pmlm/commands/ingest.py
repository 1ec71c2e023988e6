"""``pmlm ingest``: normalise FASTA, Pfam-A FASTA or UniRef XML into clean FASTA plus a stats JSON."""

from __future__ import annotations

import argparse
import sys

from pmlm.outputs import FILE_OVERWRITE_HELP

FASTA_SUFFIXES = (".fasta", ".fa", ".faa")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "inputs", nargs="+", help="FASTA, Pfam-A FASTA or UniRef XML files, plain or gzip (detected by content)"
    )
    p.add_argument("-o", "--output", required=True, metavar="CLEAN.fasta", help="clean FASTA to write")
    p.add_argument(
        "--stats",
        required=True,
        metavar="STATS.json",
        help="JSON accounting of read / kept / dropped-by-reason records",
    )
    p.add_argument("--policy", help="YAML mapping of ingest policy keys (see pmlm.data.normalise.IngestPolicy)")
    p.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override one policy key (repeatable)"
    )
    p.add_argument(
        "--format",
        default="auto",
        metavar="FMT[,FMT...]",
        help="source format: auto (by content, the default) or one of fasta, pfam_fasta, uniref_xml; "
        "one for all inputs or one per input, comma-separated",
    )
    p.add_argument("--overwrite", action="store_true", help=FILE_OVERWRITE_HELP)


def run(args: argparse.Namespace) -> int:
    # engine imports on use, so that the parsers stay light (pmlm/commands/__init__.py)
    from pmlm.data.ingest import ingest, read_policy
    from pmlm.outputs import file_target

    file_target(args.output, suffixes=FASTA_SUFFIXES, what="clean FASTA", overwrite=args.overwrite)
    file_target(args.stats, suffixes=(".json",), option="--stats", what="stats", overwrite=args.overwrite)

    policy = read_policy(args.policy, args.set)
    formats = args.format.split(",")
    if len(formats) == 1:
        formats *= len(args.inputs)
    stats = ingest(args.inputs, args.output, args.stats, policy, formats)
    dropped = ", ".join(f"{k}={v}" for k, v in stats["dropped"].items()) or "none"
    print(
        f"ingest: read {stats['read']}, kept {stats['kept']}, dropped {stats['dropped_total']} ({dropped})",
        file=sys.stderr,
    )
    return 0
