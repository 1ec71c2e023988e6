"""``pmlm throughput RESULT.json ... -o config/throughput.yaml``: a GPU check's measured pre-training rates as the
throughput file `pmlm plan` prices with (see pmlm.train.throughput)."""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.epilog = (
        "Each RESULT.json is bench/bench_gpu_throughput.py's result (the GPU check's OUT/throughput.json, or its WORK copy). "
        "Per recipe preset (its dims) and objective the best non-pad tokens/s of our rows is kept, with the card, "
        "torch, layout, micro-batch and MFU; the section is rewritten from the given results (give every result "
        "to keep), the file's other sections (the inference rates) and comments are kept as they are. An existing "
        "-o that is not a throughput file is refused. docs/gpu.md, 'How long will it take', says how pmlm plan uses it."
    )
    p.add_argument("results", nargs="+", metavar="RESULT.json", help="bench_gpu_throughput.py result file(s)")
    p.add_argument("-o", "--out", required=True, metavar="THROUGHPUT.yaml", help="the throughput file to write")
    p.add_argument(
        "--overwrite", action="store_true", help="replace an existing -o that is not a throughput file (all of it)"
    )
    p.add_argument("--allow-cpu", action="store_true", help="take a CPU run's rates too (tests, rehearsals)")


def run(args: argparse.Namespace) -> int:
    # engine imports on use, so that the parsers stay light (pmlm/commands/__init__.py)
    from pmlm.train.throughput import rates_from_results, throughput_target, write_rates

    out = throughput_target(args.out, args.overwrite)
    rates = rates_from_results(args.results, allow_cpu=args.allow_cpu)
    write_rates(out, rates)
    for preset, entries in sorted(rates.items()):
        for objective, rate in sorted(entries.items()):
            print(
                f"pmlm throughput: {preset} {objective}: {rate.tokens_per_second:,.0f} tokens/s per GPU on {rate.card}"
            )
    print(f"pmlm throughput: wrote {out}")
    return 0
