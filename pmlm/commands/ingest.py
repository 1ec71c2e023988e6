"""``pmlm ingest``: normalise FASTA, Pfam-A FASTA or UniRef XML into clean FASTA plus a stats JSON."""

from __future__ import annotations

import argparse

ENGINE = "pmlm.data.ingest"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("inputs", nargs="+", help="FASTA, Pfam-A FASTA or UniRef XML files, plain or gzip (detected by content)")
    p.add_argument("-o", "--output", required=True, help="clean FASTA to write")
    p.add_argument("--stats", required=True, help="JSON accounting of read / kept / dropped-by-reason records")
    p.add_argument("--policy", help="YAML mapping of ingest policy keys (see pmlm.data.ingest.IngestPolicy)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override one policy key (repeatable)")
    p.add_argument("--format", default="auto", metavar="FMT[,FMT...]",
                   help="source format: auto (by content, the default) or one of fasta, pfam_fasta, uniref_xml; "
                        "one for all inputs or one per input, comma-separated")
