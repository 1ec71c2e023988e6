"""What the data stage of a workflow config costs before anything is downloaded (``pmlm plan``): per dataset and
data rule (ingest, MMseqs2 clustering and split, tokenization), the CPU-hours, the wall time at the rule's threads,
the peak memory, and the disk of what the rule leaves behind, at the size the config's sources state
(``sources.<name>.estimate: {records, mean_length}``; the run counts the real ones).

Rates per record were measured by ``bench/bench_data_scale.py`` at 10^6 UniRef-XML-shaped records (log-normal
lengths, mean ~320 residues) on the 2-core development machine (2026-11-23, bench/README.md "Data stage"), and bytes
per residue on the demo's 5,863 UniProt sequences (2.64 M residues): ``MEASURED`` holds each with its figure. A
step that reads residues scales with the mean length over the bench's; reading UniRef XML is bound by its metadata
(member lists) and scales with records. MMseqs2 is taken as linear in records and threads, as the projection in
docs/data.md does; nothing here is a measurement at UniRef50's size, and the table says so.
"""

from __future__ import annotations

from dataclasses import dataclass

from pmlm.errors import ConfigError

BENCH_MEAN_LENGTH = 320  # residues per record of bench_data_scale.py's records
# per 10^6 records at BENCH_MEAN_LENGTH, or per residue / record: bench/README.md "Data stage", docs/data.md
MEASURED = {
    "ingest_xml_s": 84.0,  # 3.07 GB of UniRef XML at 36.5 MB/s (the quiet runs; 26 MB/s under load 5-6)
    "ingest_fasta_s": 6.4,  # median of 5 rounds, 420 MB of FASTA
    "tokenize_s": 4.8,  # median of 5 rounds, 8 shards x 4,096-row groups
    "split_core_s": 336.0,  # MMseqs2 linclust + split: 133-168 s on 2 threads (the slower)
    "split_bytes_per_record": 1.0e3,  # peak RSS 1.0 GB at 10^6
    "ingest_peak_bytes": 0.2e9,  # flat: 105-140 MB at 10^5 and 10^6 (+ the largest entry, read whole)
    "tokenize_base_bytes": 0.23e9,  # 200-225 MB at 10^5 and 10^6, before the rows waiting for their row groups
    "row_overhead_bytes": 40,  # per waiting row besides its residues (bench_data_scale.projection)
    "xml_gz_bytes_per_record": 313.0,  # 313 MB of uniref50.xml.gz-shaped gzip at 10^6
    "fasta_gz_bytes_per_residue": 0.62,  # 198 MB of gzip for 10^6 records of ~320 residues
    "fasta_bytes_per_record": 28.0,  # header and newlines of a clean FASTA record (demo: 2.80 MB, 5,863 records)
    "shard_bytes_per_residue": 0.614,  # the demo's shards: 1.62 MB for 2.64 M residues (zstd level 1)
}
SPLIT_THREADS = 8  # split_clusters' threads in workflow/rules/data.smk
GB = 1e9


@dataclass(frozen=True)
class DatasetSize:
    name: str
    records: int
    mean_length: float
    formats: tuple[str, ...]  # the sources' formats (uniref_xml, fasta, pfam_fasta)


def dataset_sizes(config: dict, where: str) -> list[DatasetSize]:
    """The sizes the config's datasets state through their sources' ``estimate``; a dataset whose sources state
    none is left out (``missing`` of ``plan_data`` names it)."""
    sources = config.get("sources") or {}
    sizes = []
    for name, dataset in (config.get("datasets") or {}).items():
        records = residues = 0
        formats = []
        for source in (dataset or {}).get("sources") or []:
            estimate = (sources.get(source) or {}).get("estimate")
            if not estimate:
                records = 0
                break
            try:
                n, length = int(estimate["records"]), float(estimate["mean_length"])
            except (KeyError, TypeError, ValueError):
                raise ConfigError(
                    f"{where}: sources.{source}.estimate: give records and mean_length (e.g. {{records: 30000000, "
                    "mean_length: 320}})"
                ) from None
            if n < 1 or length < 1:
                raise ConfigError(f"{where}: sources.{source}.estimate: records and mean_length must be >= 1")
            records, residues = records + n, residues + n * length
            formats.append(str((sources.get(source) or {}).get("format", "fasta")))
        if records:
            sizes.append(DatasetSize(str(name), records, residues / records, tuple(formats)))
    return sizes


def plan_data(config: dict, where: str, split_threads: int = SPLIT_THREADS) -> tuple[list[dict], list[str]]:
    """Rows (one per dataset and rule) and the datasets without a stated size."""
    sizes = dataset_sizes(config, where)
    priced = {s.name for s in sizes}
    missing = [str(n) for n in (config.get("datasets") or {}) if str(n) not in priced]
    rows = []
    m = MEASURED
    for size in sizes:
        n, per_length = size.records / 1e6, size.mean_length / BENCH_MEAN_LENGTH
        residues = size.records * size.mean_length
        shards = ((config.get("datasets") or {}).get(size.name) or {}).get("shards") or {}
        waiting = int(shards.get("num_shards", 64)) * int(shards.get("row_group_size", 4096))
        xml = "uniref_xml" in size.formats
        clean = residues + size.records * m["fasta_bytes_per_record"]
        source = size.records * m["xml_gz_bytes_per_record"] if xml else residues * m["fasta_gz_bytes_per_residue"]
        ingest_s = n * (m["ingest_xml_s"] if xml else m["ingest_fasta_s"] * per_length)
        split_s = n * m["split_core_s"] * per_length
        tokenize_s = n * m["tokenize_s"] * per_length
        tokenize_peak = m["tokenize_base_bytes"] + waiting * (size.mean_length + m["row_overhead_bytes"])
        for rule, cpu_s, threads, peak, disk, leaves in (
            ("ingest_sequences", ingest_s, 1, m["ingest_peak_bytes"], clean, "clean.fasta"),
            ("split_clusters", split_s, split_threads, size.records * m["split_bytes_per_record"], clean,
             "split/train.fasta + valid.fasta"),
            ("tokenize_shards", tokenize_s, 1, tokenize_peak, residues * m["shard_bytes_per_residue"], "shards/"),
        ):  # fmt: skip
            rows.append({
                "dataset": size.name, "records": size.records, "mean_length": size.mean_length, "rule": rule,
                "cpu_hours": cpu_s / 3600, "threads": threads, "wall_hours": cpu_s / threads / 3600,
                "peak_gb": peak / GB, "disk_gb": disk / GB, "leaves": leaves, "source_gb": source / GB,
            })  # fmt: skip
    return rows, missing


def _figure(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:.2g}"


def render(rows: list[dict], missing: list[str]) -> str:
    """The data stage as a Markdown table, then what it assumes."""
    lines = [
        "| dataset | records | rule | CPU-hours | threads | wall hours | peak GB | leaves on disk (GB) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['dataset']} | {r['records'] / 1e6:,.1f} M x {r['mean_length']:,.0f} | {r['rule']} | "
            f"{_figure(r['cpu_hours'])} | {r['threads']} | {_figure(r['wall_hours'])} | {_figure(r['peak_gb'])} | "
            f"{r['leaves']} ({_figure(r['disk_gb'])}) |"
        )
    sources = {r["dataset"]: r["source_gb"] for r in rows}
    notes = [
        "",
        "data stage: projected from per-record rates measured at 10^6 records on 2 cores (bench/bench_data_scale.py, "
        "bench/README.md) to the records and mean length each source's estimate states; MMseqs2 taken as linear in "
        "records and threads. Downloaded sources (gzip, before extraction): "
        + "; ".join(f"{d} ~{_figure(gb)} GB" for d, gb in sources.items())
        + ". The split FASTAs are kept so that re-sharding never re-clusters.",
    ]
    if missing:
        notes.append(
            f"not priced: {', '.join(missing)} (its sources state no estimate: sources.<name>.estimate: "
            "{records: N, mean_length: L})."
        )
    return "\n".join(lines + notes) + "\n"
