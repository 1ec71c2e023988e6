"""Derive the demo's example task of one's own, data/demo/net_charge.csv, from data/demo/uniprot_sample.fasta.gz.

Every sixth sequence of 40-400 residues, with a label the sequence determines: its net charge per residue at
neutral pH counted from the letters, (K + R - D - E) / L. A model that reads the sequence can learn it exactly, so
a test can require a learned Spearman far above chance. Deterministic: rerunning gives the same file byte for byte.
"""

from __future__ import annotations

import csv
import gzip
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "data" / "demo" / "uniprot_sample.fasta.gz"
OUT = ROOT / "data" / "demo" / "net_charge.csv"
EVERY, MIN_LEN, MAX_LEN = 6, 40, 400


def fasta(path: Path):
    name, seq = None, []
    with gzip.open(path, "rt") as fh:
        for line in fh:
            line = line.strip()
            if line.startswith(">"):
                if name is not None:
                    yield name, "".join(seq)
                name, seq = line[1:].split()[0], []
            elif line:
                seq.append(line)
    if name is not None:
        yield name, "".join(seq)


def net_charge(seq: str) -> float:
    return (sum(seq.count(c) for c in "KR") - sum(seq.count(c) for c in "DE")) / len(seq)


def main() -> int:
    rows = [
        (name, seq, f"{net_charge(seq):.6f}")
        for i, (name, seq) in enumerate(fasta(SOURCE))
        if i % EVERY == 0 and MIN_LEN <= len(seq) <= MAX_LEN
    ]
    with open(OUT, "w", newline="") as fh:
        writer = csv.writer(fh, lineterminator="\n")
        writer.writerow(["id", "sequence", "net_charge"])
        writer.writerows(rows)
    print(f"{OUT}: {len(rows)} sequences", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
