"""``pmlm contacts-from-pdb``: C-beta contact set (JSONL) of listed PDB chains from coordinate files."""

from __future__ import annotations

import argparse
import sys


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--chains", required=True, help="list of PDB chains, one per line (1abcA, 1abc_A, ...)")
    p.add_argument("--pdb-dir", required=True, help="folder of the PDB's coordinate files (.cif/.pdb/.ent, .gz)")
    p.add_argument("-o", "--output", required=True, help="contact-set JSONL (id, seq, cb) to write")


def run(args: argparse.Namespace) -> int:
    # engine imports on use, so that the parsers stay light (pmlm/commands/__init__.py)
    from pmlm.tasks.pdbchains import convert

    n = convert(args.chains, args.pdb_dir, args.output)
    print(f"contacts-from-pdb: {n} chains -> {args.output}", file=sys.stderr)
    return 0
