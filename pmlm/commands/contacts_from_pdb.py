"""``pmlm contacts-from-pdb``: C-beta contact set (JSONL) of listed PDB chains from coordinate files."""

from __future__ import annotations

import argparse
import sys

from pmlm.outputs import FILE_OVERWRITE_HELP


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--chains", required=True, help="list of PDB chains, one per line (1abcA, 1abc_A, ...)")
    p.add_argument("--pdb-dir", required=True, help="folder of the PDB's coordinate files (.cif/.pdb/.ent, .gz)")
    p.add_argument(
        "-o", "--output", required=True, metavar="CHAINS.jsonl", help="contact-set JSONL (id, seq, cb) to write"
    )
    p.add_argument("--overwrite", action="store_true", help=FILE_OVERWRITE_HELP)


def run(args: argparse.Namespace) -> int:
    # engine imports on use, so that the parsers stay light (pmlm/commands/__init__.py)
    from pmlm.outputs import file_target
    from pmlm.tasks.pdbchains import convert

    file_target(args.output, suffixes=(".jsonl",), what="contact set", overwrite=args.overwrite)

    n = convert(args.chains, args.pdb_dir, args.output)
    print(f"contacts-from-pdb: {n} chains -> {args.output}", file=sys.stderr)
    return 0
