"""Derive the committed demo data (data/demo/) from its two public sources, deterministically.

    python scripts/make_demo_data.py \
        --uniprot /usr/share/doc/mmseqs2/example-data/DB.fasta.gz \
        --structures pdb_chains.jsonl.gz --out data/demo

Sources: Debian package ``mmseqs2-examples`` 14-7e284+ds-1 (20,000 UniProt sequences, CC BY 4.0)
and a PDB chain set derived from Debian's ``promod3-data`` (Apache-2.0; structures from the PDB,
public domain). Records are sampled with a fixed seed and written unchanged (no filtering or
repair: the demo's ingest step does that and counts it).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import random
from pathlib import Path

from Bio.SeqIO.FastaIO import SimpleFastaParser


def sample_fasta(src: Path, dst: Path, n: int, seed: int) -> int:
    with gzip.open(src, "rt") as fh:
        records = list(SimpleFastaParser(fh))
    chosen = sorted(random.Random(seed).sample(range(len(records)), n))
    with gzip.GzipFile(dst, "wb", mtime=0) as out:  # mtime=0: byte-identical reruns
        for i in chosen:
            title, seq = records[i]
            out.write(f">{title}\n{seq}\n".encode())
    return len(chosen)


def sample_structures(src: Path, dst: Path, n: int, seed: int, min_len: int, max_len: int) -> int:
    with gzip.open(src, "rt") as fh:
        entries = [json.loads(line) for line in fh]
    eligible = [e for e in entries if min_len <= len(e["seq"]) <= max_len]
    chosen = random.Random(seed).sample(eligible, n)
    chosen.sort(key=lambda e: (e["id"], e["chain"], e["start_resnum"]))
    keys = ("id", "chain", "start_resnum", "seq", "dssp", "ca", "cb")
    with gzip.GzipFile(dst, "wb", mtime=0) as out:
        for e in chosen:
            out.write((json.dumps({k: e[k] for k in keys}, separators=(",", ":")) + "\n").encode())
    return len(chosen)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--uniprot", type=Path, required=True, help="mmseqs2-examples DB.fasta.gz")
    ap.add_argument("--structures", type=Path, required=True, help="pdb_chains.jsonl.gz")
    ap.add_argument("--out", type=Path, default=Path("data/demo"))
    ap.add_argument("--sequences", type=int, default=6000)
    ap.add_argument("--chains", type=int, default=700)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    n_seq = sample_fasta(args.uniprot, args.out / "uniprot_sample.fasta.gz", args.sequences, args.seed)
    n_str = sample_structures(args.structures, args.out / "pdb_chains_sample.jsonl.gz", args.chains, args.seed, 40, 300)
    for name in ("uniprot_sample.fasta.gz", "pdb_chains_sample.jsonl.gz"):
        digest = hashlib.sha256((args.out / name).read_bytes()).hexdigest()
        print(f"{name}\t{(args.out / name).stat().st_size} bytes\tsha256 {digest}")
    print(f"{n_seq} sequences, {n_str} chains")


if __name__ == "__main__":
    main()
