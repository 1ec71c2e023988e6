"""``pmlm contacts-from-pdb``: build a C-beta contact set (the JSONL read by :mod:`pmlm.tasks.raptorx`)
from public structure files, for test sets distributed as lists of PDB chains (RaptorX-Contact).

Input: a list of chains, one per line (``1abcA``, ``1abc_A``, ``1abc A`` or ``1abc.A``; ``#`` starts
a comment), and a folder of the PDB's coordinate files named as the PDB's archive names them
(``1abc.pdb``, ``1abc.cif``, ``pdb1abc.ent``, each optionally ``.gz``), read with Biopython.
Output: one JSON object per chain: ``id`` (``1abcA``), ``seq`` (the modelled residues of the first
model, in order; MSE read as M, other non-standard residues as X) and ``cb`` (C-beta in Angstrom;
glycine and residues without a C-beta get the ideal virtual C-beta built from N, CA and C, null
when those are missing too).
"""

from __future__ import annotations

import gzip
import io
import json
import re
import warnings
from pathlib import Path

import numpy as np
from Bio.Data.PDBData import protein_letters_3to1_extended
from Bio.PDB import MMCIFParser, PDBParser
from Bio.PDB.PDBExceptions import PDBConstructionWarning

from pmlm.errors import InputError
from pmlm.files import atomic_output

_CHAIN = re.compile(r"^([0-9][A-Za-z0-9]{3})[\s_.:]?([A-Za-z0-9]{1,4})$")
_SUFFIXES = ("{id}.cif", "{id}.pdb", "pdb{id}.ent", "{ID}.cif", "{ID}.pdb")
# ideal virtual C-beta from the backbone (the constants used by trRosetta and ESM)
_CB_A, _CB_B, _CB_C = -0.58273431, 0.56802827, -0.54067466


def parse_chain_list(path: str | Path) -> list[tuple[str, str]]:
    """(PDB id, chain id) per line of ``path``."""
    chains = []
    for n, raw in enumerate(Path(path).read_text().splitlines(), start=1):
        text = raw.split("#", 1)[0].strip()
        if not text:
            continue
        match = _CHAIN.match(text)
        if match is None:
            raise InputError(path, f"expected a PDB chain such as 1abcA or 1abc_A, got {text!r}", line=n)
        chains.append((match.group(1).lower(), match.group(2)))
    if not chains:
        raise InputError(path, "no chains listed")
    return chains


def find_structure(folder: Path, pdb_id: str) -> Path:
    for pattern in _SUFFIXES:
        name = pattern.format(id=pdb_id, ID=pdb_id.upper())
        for candidate in (folder / name, folder / (name + ".gz")):
            if candidate.is_file():
                return candidate
    raise InputError(
        folder,
        f"no coordinate file for {pdb_id} (looked for {pdb_id}.cif, {pdb_id}.pdb, pdb{pdb_id}.ent, optionally .gz)",
    )


def virtual_cb(n: np.ndarray, ca: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Ideal C-beta position from backbone N, CA, C (..., 3)."""
    b, c_ = ca - n, c - ca
    return _CB_A * np.cross(b, c_) + _CB_B * b + _CB_C * c_ + ca


def chain_record(path: Path, pdb_id: str, chain_id: str) -> dict:
    """{id, seq, cb} of one chain of a PDB or mmCIF file."""
    name = path.name[:-3] if path.name.endswith(".gz") else path.name
    parser = MMCIFParser(QUIET=True) if name.endswith(".cif") else PDBParser(QUIET=True)
    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rt") as fh, warnings.catch_warnings():
            warnings.simplefilter("ignore", PDBConstructionWarning)
            structure = parser.get_structure(pdb_id, io.StringIO(fh.read()))
    except (OSError, ValueError, KeyError, IndexError, EOFError) as exc:
        raise InputError(path, f"cannot read coordinates ({exc})") from None
    model = next(iter(structure), None)
    if model is None or chain_id not in model:
        chains = ", ".join(c.id for c in model) if model is not None else "none"
        raise InputError(path, f"no chain {chain_id!r} in the first model (chains: {chains})")
    letters, cb = [], []
    for residue in model[chain_id]:
        hetero, resname = residue.id[0], residue.get_resname()
        if hetero == "W" or (hetero != " " and resname != "MSE") or "CA" not in residue:
            continue  # water, ligands, residues without a C-alpha
        letters.append(protein_letters_3to1_extended.get(resname, "X") if resname != "MSE" else "M")
        if "CB" in residue and resname != "GLY":
            cb.append(residue["CB"].coord.astype(np.float64))
        elif all(atom in residue for atom in ("N", "CA", "C")):
            cb.append(virtual_cb(*(residue[a].coord.astype(np.float64) for a in ("N", "CA", "C"))))
        else:
            cb.append(None)
    if not letters:
        raise InputError(path, f"chain {chain_id!r} has no amino-acid residues")
    return {
        "id": f"{pdb_id}{chain_id}",
        "seq": "".join(letters),
        "cb": [None if x is None else [round(float(v), 3) for v in x] for x in cb],
    }


def convert(chain_list: str | Path, pdb_dir: str | Path, output: str | Path) -> int:
    """Write the JSONL for every listed chain to ``output`` atomically; returns the number of chains."""
    folder = Path(pdb_dir)
    if not folder.is_dir():
        raise InputError(folder, "no such folder")
    chains = parse_chain_list(chain_list)
    with atomic_output(output) as tmp, open(tmp, "w") as out:
        for pdb_id, chain_id in chains:
            out.write(json.dumps(chain_record(find_structure(folder, pdb_id), pdb_id, chain_id)) + "\n")
    return len(chains)
