"""FASTA.gz -> Parquet tokenization throughput against `gzip -dc` of the same file, side by side.

    python bench/bench_tokenize.py [--copies 5] [--repeats 3]

Input: real UniProt sequences (Debian's mmseqs2-examples DB.fasta.gz when installed, else the
committed demo sample), normalised as `pmlm ingest` would and replicated with fresh ids to a file
large enough to time. Both commands
read the same .gz; the ratio is tokenize throughput / gzip -dc throughput (bar >= 0.5). The best
of ``--repeats`` runs is taken for each, so a busy machine penalises neither side more.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

from pmlm.data.formats import read_source
from pmlm.data.ingest import IngestPolicy, ingest
from pmlm.data.normalise import Normaliser
from pmlm.data.records import records_of
from pmlm.data.shards import tokenize

REPO = Path(__file__).resolve().parents[1]
CANDIDATES = [Path("/usr/share/doc/mmseqs2/example-data/DB.fasta.gz"), REPO / "data/demo/uniprot_sample.fasta.gz"]


def build_input(src: Path, dst: Path, copies: int) -> tuple[int, int]:
    norm = Normaliser(IngestPolicy())  # the tokenizer reads normalised FASTA
    records = [
        (rid.decode(), clean.decode())
        for rid, seq, line, _ in records_of(read_source(src, "fasta"))
        if (clean := norm(seq, str(src), line, rid)) is not None
    ]
    n = residues = 0
    with gzip.open(dst, "wt", compresslevel=6) as out:
        for c in range(copies):
            for rid, seq in records:
                out.write(f">{rid}_copy{c} cluster={rid}\n{seq}\n")
                n += 1
                residues += len(seq)
    return n, residues


def best_of(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--copies", type=int, default=5, help="times the source records are replicated")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--shards", type=int, default=8)
    args = ap.parse_args()
    src = next(p for p in CANDIDATES if p.exists())
    with tempfile.TemporaryDirectory() as tmp:
        fasta = Path(tmp) / "input.fasta.gz"
        n, residues = build_input(src, fasta, args.copies)
        raw_bytes = int(subprocess.run(f"gzip -dc {fasta} | wc -c", shell=True, capture_output=True, text=True).stdout)

        def gunzip():
            subprocess.run(["gzip", "-dc", str(fasta)], stdout=subprocess.DEVNULL, check=True)

        def tok():
            tokenize({"train": [str(fasta)]}, os.path.join(tmp, "shards"), num_shards=args.shards)

        def ing():
            ingest([str(fasta)], os.path.join(tmp, "clean.fasta"), os.path.join(tmp, "stats.json"), IngestPolicy())

        t_gzip = best_of(gunzip, args.repeats)
        t_tok = best_of(tok, args.repeats)
        t_ing = best_of(ing, args.repeats)
    mb = raw_bytes / 1e6
    result = {
        "bench": "tokenize_vs_gzip",
        "source": str(src),
        "records": n,
        "residues": residues,
        "uncompressed_mb": round(mb, 1),
        "gzip_dc_s": round(t_gzip, 3),
        "tokenize_s": round(t_tok, 3),
        "ingest_s": round(t_ing, 3),
        "gzip_dc_mb_per_s": round(mb / t_gzip, 1),
        "tokenize_mb_per_s": round(mb / t_tok, 1),
        "ingest_mb_per_s": round(mb / t_ing, 1),
        "ratio_tokenize_over_gzip": round(t_gzip / t_tok, 3),
        "bar": ">= 0.5",
    }
    print(json.dumps(result))
    print(
        f"tokenize {result['tokenize_mb_per_s']} MB/s vs gzip -dc {result['gzip_dc_mb_per_s']} MB/s on {mb:.0f} MB "
        f"({n} records): ratio {result['ratio_tokenize_over_gzip']} (bar >= 0.5); ingest {result['ingest_mb_per_s']} MB/s"
    )


if __name__ == "__main__":
    main()
