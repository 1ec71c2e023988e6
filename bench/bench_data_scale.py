"""The data stage at UniRef50 scale: throughput against `gzip -dc`, marginal memory per record, MMseqs2 at
10^6 records, and a projection (stated as such) of every data rule for UniRef50 2018_03 on a 32-core node.

    python bench/bench_data_scale.py [--sizes 100000 1000000] [--repeats 3] [--no-mmseqs] [--quick]

For each N it writes one source in two forms with the same records: UniRef-XML-shaped (UniProt's 2018
layout: wrapped sequences, a representative dbReference and one <member> per further cluster member) and
the corresponding FASTA; lengths are log-normal (median 250, sigma 0.7: mean ~320 residues, as UniRef50's
representatives), member counts geometric (mean ~4.5, at most 1000). Each step runs as its own
`python -m pmlm` process under GNU time (wall time and peak RSS); `gzip -dc`, ingest and tokenize run side by
side in each of `--repeats` rounds and the medians (and the median of the per-round ratios) are reported. Bars: marginal memory (peak RSS at the largest N minus at the smallest, over the
difference in records) <= 20 bytes per record; ingest + tokenize of the FASTA >= 0.3x the speed of
`gzip -dc` of the same file. The XML path's throughput is reported beside it, and the nested-archive
extraction, MMseqs2's split at the largest N and the projection follow from the same runs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from isal import igzip

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from pmlm.data.uniref import document_head, document_tail, format_entry  # noqa: E402  (the format's one home)

RESIDUES = np.frombuffer(b"ACDEFGHIKLMNPQRSTVWY", np.uint8)
# UniProt-like background frequencies (tests/conftest.py)
FREQ = np.array([8.3, 1.4, 5.5, 6.7, 3.9, 7.1, 2.3, 5.9, 5.8, 9.7, 2.4, 4.1, 4.7, 3.9, 5.3, 6.6, 5.3, 6.9, 1.1, 2.9])
UNIREF50_2018_03_ENTRIES = 30_000_000  # ESM's 2018_03 held-out set is 3.016 M clusters, ~10 % of UniRef50
PAPER_SHARDS, PAPER_ROW_GROUP = 512, 4096  # config/paper.yaml, uniref50
NODE_CORES = 32


def write_sources(n: int, folder: Path, seed: int = 0) -> dict:
    """uniref50.xml.gz and uniref50.fasta.gz holding the same n records."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(np.log(250), 0.7, n), 12, 35_000).astype(np.int64)
    members = np.minimum(rng.geometric(0.22, n), 1000)
    residues = RESIDUES[rng.choice(20, size=int(lengths.sum()), p=FREQ / FREQ.sum())].tobytes().decode()
    xml_path, fasta_path = folder / "uniref50.xml.gz", folder / "uniref50.fasta.gz"
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    with igzip.open(xml_path, "wb", compresslevel=2) as xml, igzip.open(fasta_path, "wb", compresslevel=2) as fasta:
        xml.write(document_head("2018_03").encode())
        xb, fb = [], []
        for i in range(n):
            seq = residues[offsets[i] : offsets[i + 1]]
            acc, m = f"A{i:09d}", int(members[i])
            wrapped = "\n".join(seq[k : k + 60] for k in range(0, len(seq), 60))
            xb.append(format_entry(acc, seq, members=m, taxon=1386, release="2018_03"))
            fb.append(
                f">UniRef50_{acc} Uncharacterized protein n={m} Tax=Bacillus TaxID=1386 RepID={acc}_UNKP\n{wrapped}\n"
            )
            if len(xb) == 4096 or i == n - 1:
                xml.write("".join(xb).encode())
                fasta.write("".join(fb).encode())
                xb, fb = [], []
        xml.write(document_tail().encode())
    return {"xml": xml_path, "fasta": fasta_path, "residues": int(lengths.sum()), "members": int(members.sum())}


def nested_archive(xml_gz: Path, folder: Path) -> Path:
    """UniProt's layout around the XML: uniref2018_03.tar.gz -> uniref50.tar -> uniref50.xml.gz."""
    inner = folder / "uniref50.tar"
    subprocess.run(["tar", "cf", str(inner), "-C", str(xml_gz.parent), xml_gz.name], check=True)
    outer = folder / "uniref2018_03.tar.gz"
    subprocess.run(f"tar cf - -C {folder} uniref50.tar | gzip -1 > {outer}", shell=True, check=True)
    inner.unlink()
    return outer


def run(cmd: list[str] | str) -> tuple[float, int]:
    """(wall seconds, peak RSS bytes) of one process and the children it waits for.

    GNU time reports the peak: a child forked from this (large) process would start with this
    process's resident pages counted, so the step is not forked from here directly.
    """
    shell = isinstance(cmd, str)
    timed = ["/usr/bin/time", "-f", "%e %M"] + (["sh", "-c", cmd] if shell else cmd)
    proc = subprocess.run(timed, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"failed: {cmd}\n{proc.stderr[-2000:]}")
    wall, rss_kb = proc.stderr.strip().splitlines()[-1].split()
    return float(wall), int(rss_kb) * 1024


def summary(runs: list[tuple[float, int]]) -> dict:
    return {
        "s": round(statistics.median(r[0] for r in runs), 3),
        "runs_s": [round(r[0], 2) for r in runs],
        "peak_rss_mb": round(statistics.median(r[1] for r in runs) / 2**20, 1),
    }


def pmlm(*args: str) -> list[str]:
    return [sys.executable, "-m", "pmlm", *args]


def uncompressed_mb(path: Path) -> float:
    with igzip.open(path, "rb") as fh:
        return sum(len(b) for b in iter(lambda: fh.read(1 << 22), b"")) / 1e6


def bench_size(n: int, work: Path, repeats: int, xml_repeats: int, mmseqs: bool) -> dict:
    folder = work / f"n{n}"
    folder.mkdir()
    t0 = time.perf_counter()
    src = write_sources(n, folder)
    out: dict = {"records": n, "residues": src["residues"], "generate_s": round(time.perf_counter() - t0, 1)}
    for kind in ("fasta", "xml"):
        path, clean = src[kind], folder / f"clean_{kind}.fasta"
        steps = {
            "gzip_dc": f"gzip -dc {path} > /dev/null",
            "ingest": pmlm("ingest", str(path), "-o", str(clean), "--stats", str(folder / "s.json")),
            "tokenize": pmlm(
                "tokenize",
                "--input",
                f"train={clean}",
                "--out-dir",
                str(folder / "shards"),
                "--num-shards",
                "8",
                "--row-group-size",
                str(PAPER_ROW_GROUP),
            ),
        }
        # the three steps side by side in each round, so a change of load hits all of them; the ratio is
        # taken per round and its median reported
        runs: dict[str, list] = {step: [] for step in steps}
        ratios = []
        for _ in range(repeats if kind == "fasta" else xml_repeats):
            for step, cmd in steps.items():
                runs[step].append(run(cmd))
            ratios.append(runs["gzip_dc"][-1][0] / (runs["ingest"][-1][0] + runs["tokenize"][-1][0]))
        out[kind] = {
            "gz_mb": round(path.stat().st_size / 1e6, 1),
            "mb": round(uncompressed_mb(path), 1),
            **{step: summary(r) for step, r in runs.items()},
            "ratio_ingest_tokenize_over_gzip": round(statistics.median(ratios), 3),
            "ratio_per_round": [round(r, 3) for r in ratios],
        }
        out[kind]["ingest_mb_per_s"] = round(out[kind]["mb"] / out[kind]["ingest"]["s"], 1)
    out["clean_mb"] = round((folder / "clean_xml.fasta").stat().st_size / 1e6, 1)
    archive = nested_archive(src["xml"], folder)
    out["extract"] = summary(
        [run(pmlm("extract", str(archive), "uniref50.tar/uniref50.xml.gz", "-o", str(folder / "member.xml.gz")))]
    )
    out["extract"]["archive_mb"] = round(archive.stat().st_size / 1e6, 1)
    if mmseqs:
        out["split"] = summary(
            [
                run(
                    pmlm(
                        "split",
                        str(folder / "clean_xml.fasta"),
                        "--out-dir",
                        str(folder / "split"),
                        "--threads",
                        "2",
                        "--valid-fraction",
                        "0.005",
                    )
                )
            ]
        )
    shutil.rmtree(folder)
    return out


def projection(small: dict, large: dict) -> dict:
    """UniRef50 2018_03 from the two sizes: times scale with records, memory with the marginal rate."""
    n = UNIREF50_2018_03_ENTRIES
    scale = n / large["records"]

    def marginal(key, step):
        return (
            (large[key][step]["peak_rss_mb"] - small[key][step]["peak_rss_mb"])
            * 2**20
            / (large["records"] - small["records"])
        )

    row_bytes = large["residues"] / large["records"] + 40
    proj = {
        "assumptions": f"{n / 1e6:.0f} M UniRef50 entries; uniref50.xml.gz and clean FASTA scale with entries as in the "
        f"XML-shaped data; ingest and tokenize single-threaded; MMseqs2 linear in records and in threads "
        f"(2 -> {NODE_CORES}); tokenize buffers {PAPER_SHARDS} shards x {PAPER_ROW_GROUP} rows",
        "uniref50_xml_gz_gb": round(large["xml"]["gz_mb"] * scale / 1e3, 1),
        "clean_fasta_gb": round(large["clean_mb"] * scale / 1e3, 1),
        "extract_min_per_100gb_archive": round(
            100e3 / (large["extract"]["archive_mb"] / large["extract"]["s"]) / 60, 1
        ),
        "ingest_xml_h": round(large["xml"]["ingest"]["s"] * scale / 3600, 2),
        "ingest_xml_gb": round(
            (small["xml"]["ingest"]["peak_rss_mb"] + marginal("xml", "ingest") * n / 2**20) / 1024, 2
        ),
        "tokenize_h": round(large["xml"]["tokenize"]["s"] * scale / 3600, 2),
        "tokenize_gb": round(
            (
                small["xml"]["tokenize"]["peak_rss_mb"]
                + marginal("xml", "tokenize") * n / 2**20
                + PAPER_SHARDS * PAPER_ROW_GROUP * row_bytes / 2**20
            )
            / 1024,
            2,
        ),
    }
    if "split" in large:
        proj["split_h"] = round(large["split"]["s"] * scale * 2 / NODE_CORES / 3600, 2)
        proj["split_gb"] = round(large["split"]["peak_rss_mb"] * scale / 1024, 1)
    return proj


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs=2, default=[100_000, 1_000_000], metavar=("SMALL", "LARGE"))
    ap.add_argument(
        "--repeats", type=int, default=5, help="rounds of gzip -dc, ingest and tokenize of the FASTA (median)"
    )
    ap.add_argument("--xml-repeats", type=int, default=1, help="rounds for the XML (its ingest is the slowest step)")
    ap.add_argument("--no-mmseqs", action="store_true", help="skip MMseqs2 at the largest size")
    ap.add_argument("--workdir", help="where the sources are written (default: a temporary folder)")
    ap.add_argument("--quick", action="store_true", help="20,000 and 60,000 records, one run each: a smoke run")
    args = ap.parse_args()
    if args.quick:
        args.sizes, args.repeats, args.xml_repeats = [20_000, 60_000], 1, 1
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        small = bench_size(args.sizes[0], Path(tmp), args.repeats, args.xml_repeats, mmseqs=False)
        large = bench_size(args.sizes[1], Path(tmp), args.repeats, args.xml_repeats, mmseqs=not args.no_mmseqs)
    diff = large["records"] - small["records"]
    marginal = {
        f"{kind}_{step}": round((large[kind][step]["peak_rss_mb"] - small[kind][step]["peak_rss_mb"]) * 2**20 / diff, 1)
        for kind in ("fasta", "xml")
        for step in ("ingest", "tokenize")
    }
    result = {
        "bench": "data_scale",
        "cores": os.cpu_count(),
        "load_before": [round(x, 2) for x in load],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "small": small,
        "large": large,
        "marginal_bytes_per_record": marginal,
        "bar_marginal": "<= 20",
        "bar_ratio": ">= 0.3 (FASTA)",
        "projection_uniref50_2018_03": projection(small, large),
    }
    print(json.dumps(result))
    f = large["fasta"]
    print(
        f"{large['records']} records: ingest + tokenize of the FASTA at {f['ratio_ingest_tokenize_over_gzip']}x gzip -dc "
        f"(bar >= 0.3); UniRef XML ingest {large['xml']['ingest_mb_per_s']} MB/s of XML "
        f"(ratio {large['xml']['ratio_ingest_tokenize_over_gzip']}x); marginal memory "
        + ", ".join(f"{k} {v} B" for k, v in marginal.items())
        + " per record (bar <= 20)"
    )


if __name__ == "__main__":
    main()
