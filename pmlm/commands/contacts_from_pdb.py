"""``pmlm contacts-from-pdb``: C-beta contact set (JSONL) of listed PDB chains from coordinate files."""

from __future__ import annotations

import argparse

ENGINE = "pmlm.tasks.pdbchains"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--chains", required=True, help="list of PDB chains, one per line (1abcA, 1abc_A, ...)")
    p.add_argument("--pdb-dir", required=True, help="folder of the PDB's coordinate files (.cif/.pdb/.ent, .gz)")
    p.add_argument("-o", "--output", required=True, help="contact-set JSONL (id, seq, cb) to write")
