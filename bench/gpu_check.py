"""The Python half of bench/gpu_check.sh: its inputs, and the steps that are more than one command.

    python bench/gpu_check.py prepare [--tiny] DIR      shards, task JSONL and a co-evolution family (CPU, once)
    python bench/gpu_check.py env                        the machine and the packages, as JSON
    python bench/gpu_check.py junit FILE [--gpu]         the GPU-marked tests' verdict from pytest's JUnit XML
    python bench/gpu_check.py pretrain-resume ...        `pmlm pretrain` stopped by SIGTERM at a step, then resumed
    python bench/gpu_check.py compile COLD.json WARM.json a cold and a warm compiled start, from two bench runs
    python bench/gpu_check.py run RUN [--log LOG] [--expect TEXT] [--steps N]
                                                         a short run's steps, step time, loss, and a line it must print
    python bench/gpu_check.py tsv FILE                   an evaluation table as JSON
    python bench/gpu_check.py record OUT STEP STATUS SECONDS BUDGET [RESULT.json]
                                                         one line of OUT/results.jsonl, then OUT/figures.md again

Each prints one JSON object (the step's result); gpu_check.sh keeps it.
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import itertools
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
DEMO = ROOT / "data" / "demo"
REQUEUE_EXIT = 99  # pmlm.train.REQUEUE_EXIT_CODE, read without importing torch here


def load_script(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def prepare(out: Path, tiny: bool) -> dict:
    """Pre-training shards of the demo's UniProt sample (ingested, every 25th sequence held out), structure JSONL
    of its PDB chains (train / valid / test) and one sampled Potts family with its shards for the co-evolution
    curve; the sizes of everything written."""
    from pmlm.cli import main as pmlm  # the CLI in-process: one interpreter start for every command

    out.mkdir(parents=True, exist_ok=True)
    work = out / "scratch"
    work.mkdir(exist_ok=True)
    clean = work / "clean.fasta"
    assert (
        pmlm(["ingest", str(DEMO / "uniprot_sample.fasta.gz"), "-o", str(clean), "--stats", str(work / "s.json")]) == 0
    )
    records = clean.read_text().split(">")[1:]
    records = records[:600] if tiny else records
    for split, keep in (("train", lambda i: i % 25), ("valid", lambda i: not i % 25)):
        (work / f"{split}.fasta").write_text("".join(">" + r for i, r in enumerate(records) if keep(i)))
    sets = [f"--input={s}={work / f'{s}.fasta'}" for s in ("train", "valid")]
    assert (
        pmlm(["tokenize", *sets, "--out-dir", str(out / "shards"), "--num-shards", "2", "--row-group-size", "512"]) == 0
    )
    with gzip.open(DEMO / "pdb_chains_sample.jsonl.gz", "rt") as fh:
        chains = [line for line in fh if line.strip()][: 24 if tiny else 96]
    tasks = out / "tasks"
    tasks.mkdir(exist_ok=True)
    cut = (12, 16) if tiny else (64, 76)
    for split, part in (("train", chains[: cut[0]]), ("valid", chains[cut[0] : cut[1]]), ("test", chains[cut[1] :])):
        (tasks / f"{split}.jsonl").write_text("".join(part))
    curves = load_script(ROOT / "scripts" / "coupling_curves.py")
    family = ["--out", "-", "--length", "20" if tiny else "40", "--sequences", "300" if tiny else "4000"]
    try:  # splitting the family reads FASTA with Biopython: on the GPU image there is none (prepare on a CPU)
        curves.prepare(out / "coevolution", curves.arguments(family))
    except ImportError as exc:
        print(f"gpu_check prepare: no co-evolution family ({exc})", file=sys.stderr)
    for leftover in sorted(work.iterdir()):
        leftover.unlink()
    work.rmdir()
    if not tiny:  # the co-evolution read-out reads FASTA with Biopython, which the GPU image lacks: carry its wheel
        wheels(out / "wheels")
    files = sorted(p for p in out.rglob("*") if p.is_file())
    listing = {str(p.relative_to(out)): p.stat().st_size for p in files}
    return {"inputs": str(out), "bytes": sum(listing.values()), "files": listing}


def wheels(folder: Path) -> None:
    """The installed Biopython's wheel for the GPU image (CPython 3.12, x86-64 manylinux), through pip; without
    network the folder stays empty and the co-evolution curve, an optional step, fails there."""
    from importlib.metadata import version

    platforms = [f"--platform={p}" for p in ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")]
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version=3.12"]
    command += ["--implementation=cp", *platforms, "-d", str(folder), f"biopython=={version('biopython')}"]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        print(f"gpu_check prepare: no Biopython wheel ({done.stderr.strip().splitlines()[-1:]})", file=sys.stderr)


def environment() -> dict:
    """The card, torch and CUDA, the packages the steps use, and the data stage's packages (absent on the image)."""
    import torch

    info = {"python": sys.version.split()[0], "torch": torch.__version__, "cuda": torch.version.cuda}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        bench = load_script(ROOT / "bench" / "bench_gpu_throughput.py")
        peak, source = bench.peak_flops(torch.device("cuda"), None)
        info.update(
            device=props.name,
            capability=list(torch.cuda.get_device_capability(0)),
            memory_gib=round(props.total_memory / 2**30, 1),
            peak_bf16_tflops=None if peak is None else peak / 1e12,
            peak_source=source,
        )
    else:
        info["device"] = "cpu"
    for name in ("transformers", "pyarrow", "safetensors", "pandas", "numpy", "yaml", "pytest", "Bio", "snakemake"):
        try:
            info[name] = getattr(__import__(name), "__version__", "present")
        except ImportError as exc:
            info[name] = f"absent ({exc})"
    try:
        from torch.nn.attention.varlen import varlen_attn  # noqa: F401  (what the packed layout runs)

        info["varlen_attn"] = True
    except ImportError as exc:
        info["varlen_attn"] = f"absent: {exc}"
    return info


def junit(path: Path, gpu: bool) -> dict:
    """Counts of the JUnit report; on a GPU every test must pass (a skip there is a path that did not run)."""
    suite = ET.parse(path).getroot()
    suite = suite.find("testsuite") if suite.tag == "testsuites" else suite
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    names = [f"{c.get('classname')}::{c.get('name')}" for c in suite.iter("testcase")]
    bad = counts["failures"] + counts["errors"] + (counts["skipped"] if gpu else 0)
    return {**counts, "passed": counts["tests"] > 0 and bad == 0, "tests_run": names}


def step_seconds(rows: list[dict]) -> list[float]:
    """Seconds per step from consecutive rows of one run (metrics.csv's elapsed_s counts from the run's start)."""
    elapsed = [float(r["elapsed_s"]) for r in rows]
    return [b - a for a, b in itertools.pairwise(elapsed) if b > a]


def metrics_rows(run: Path, split: str = "train") -> list[dict]:
    path = run / "metrics.csv"
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    header = lines[0].split(",")
    return [dict(zip(header, line.split(","))) for line in lines[1:] if line.startswith(split + ",")]


def pretrain_resume(args) -> dict:
    """Run `python -m pmlm pretrain`, send SIGTERM once its metrics show step ``--stop-at``, expect exit 99 and a
    checkpoint, run the same command again and expect it to resume from that checkpoint and finish."""
    run = Path(args.out)
    command = [sys.executable, "-m", "pmlm", "pretrain", "--config", args.config, "--shards", args.shards]
    command += ["--out", str(run), "--final", str(run / "model.safetensors")]
    for item in args.set:
        command += ["--set", item]
    logs = [run.parent / f"{run.name}.first.log", run.parent / f"{run.name}.resumed.log"]
    run.parent.mkdir(parents=True, exist_ok=True)
    with open(logs[0], "w") as log:
        first = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        while first.poll() is None and not any(int(r["step"]) >= args.stop_at for r in metrics_rows(run)):
            time.sleep(0.1)
        sent_at = max((int(r["step"]) for r in metrics_rows(run)), default=None)
        first.send_signal(signal.SIGTERM)
        first_exit = first.wait()
    checkpoints = sorted((run / "checkpoints").glob("step-*"), key=lambda p: int(p.name.split("-")[1]))
    with open(logs[1], "w") as log:
        second_exit = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT).returncode
    said = logs[1].read_text()
    resumed = [line for line in said.splitlines() if "resuming from" in line]
    rows = metrics_rows(run)
    info = json.loads((run / "model.json").read_text()) if (run / "model.json").exists() else {}
    step_s = step_seconds(rows[1:])  # past the first step's start-up
    result = {
        "signal_sent_after_step": sent_at,
        "first_exit": first_exit,
        "checkpoint": checkpoints[-1].name if checkpoints else None,
        "resumed_line": resumed[0].strip() if resumed else None,
        "second_exit": second_exit,
        "final_step": info.get("step"),
        "median_step_s": round(statistics.median(step_s), 4) if step_s else None,
        "median_residues_per_s": round(statistics.median(float(r["residues_per_s"]) for r in rows[2:]))
        if rows[2:]
        else None,
        "loss_first_last": [float(rows[0]["loss"]), float(rows[-1]["loss"])] if rows else None,
    }
    stopped = first_exit == REQUEUE_EXIT and bool(checkpoints)
    result["passed"] = stopped and bool(resumed) and second_exit == 0 and info.get("step") == args.total_steps
    return result


def compile_summary(cold: Path, warm: Path) -> dict:
    """The compile step: the first step of a cold Inductor build and of a warm start on its cache (each includes the
    compilation), then the compiled step's time, from two bench_gpu_throughput.py --compile-only runs."""
    rows = []
    for path in (cold, warm):
        result = json.loads(path.read_text())
        rows.append(next(r for r in result["rows"] if r.get("compiled") and "step_ms" in r))
    first, second = rows
    return {
        "device": json.loads(cold.read_text())["device"],
        "micro_tokens": first.get("micro_tokens"),
        "cold_first_step_s": first["first_step_s"],
        "warm_first_step_s": second["first_step_s"],
        "step_ms": second["step_ms"],
        "non_pad_tokens_per_s": second["non_pad_tokens_per_s"],
        "mfu": second.get("mfu"),
        "graph_breaks": second.get("graph_breaks"),
        "passed": second["first_step_s"] <= first["first_step_s"],
    }


def run_summary(args) -> dict:
    """A short `pmlm pretrain` run: how far it got, its step time and loss, and whether its log says ``--expect``."""
    rows = metrics_rows(Path(args.run))
    info = json.loads((Path(args.run) / "model.json").read_text()) if (Path(args.run) / "model.json").exists() else {}
    step_s = step_seconds(rows)
    said = Path(args.log).read_text() if args.log and Path(args.log).exists() else ""
    seen = [line.strip() for line in said.splitlines() if args.expect and args.expect in line]
    result = {
        "final_step": info.get("step"),
        "train_rows": len(rows),
        "first_step_s": float(rows[0]["elapsed_s"]) if rows else None,
        "median_step_s_after_first": round(statistics.median(step_s), 4) if step_s else None,
        "loss_first_last": [float(rows[0]["loss"]), float(rows[-1]["loss"])] if rows else None,
        "expected_line": seen[0] if seen else None,
    }
    result["passed"] = info.get("step") == args.steps and (not args.expect or bool(seen))
    return result


def tsv(path: Path) -> dict:
    lines = [line.split("\t") for line in path.read_text().splitlines() if line.strip()]
    rows = [dict(zip(lines[0], line)) for line in lines[1:]]
    return {"rows": rows, "passed": bool(rows)}


def record(out: Path, step: str, status: str, seconds: str, budget_s: str, result: str | None) -> None:
    """Append the step's line to OUT/results.jsonl and rewrite OUT/figures.md from every line so far."""
    value = None
    if result and Path(result).is_file() and Path(result).stat().st_size:
        text = Path(result).read_text().strip()
        for candidate in (text, text.splitlines()[-1]):  # a JSON file, or a log whose last line is the JSON
            try:
                value = json.loads(candidate)
                break
            except json.JSONDecodeError:
                value = {"unparsed": text[-2000:]}
    line = {"step": step, "status": status, "seconds": int(seconds), "budget_s": int(budget_s), "result": value}
    with open(out / "results.jsonl", "a") as fh:
        fh.write(json.dumps(line) + "\n")
    figures = load_script(ROOT / "bench" / "gpu_figures.py")
    lines = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines() if x.strip()]
    (out / "figures.md").write_text(figures.render(lines))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="what", required=True)
    s = sub.add_parser("prepare")
    s.add_argument("out")
    s.add_argument("--tiny", action="store_true", help="small inputs for the CPU rehearsal")
    sub.add_parser("env")
    s = sub.add_parser("junit")
    s.add_argument("path")
    s.add_argument("--gpu", action="store_true")
    s = sub.add_parser("pretrain-resume")
    for name in ("--config", "--shards", "--out"):
        s.add_argument(name, required=True)
    s.add_argument("--set", action="append", default=[])
    s.add_argument("--stop-at", type=int, required=True)
    s.add_argument("--total-steps", type=int, required=True)
    s = sub.add_parser("compile")
    s.add_argument("cold")
    s.add_argument("warm")
    s = sub.add_parser("run")
    s.add_argument("run")
    s.add_argument("--log")
    s.add_argument("--expect")
    s.add_argument("--steps", type=int, required=True)
    s = sub.add_parser("tsv")
    s.add_argument("path")
    s = sub.add_parser("record")
    for name in ("out", "step", "status", "seconds", "budget"):
        s.add_argument(name)
    s.add_argument("result", nargs="?")
    args = p.parse_args(argv)
    if args.what == "record":
        record(Path(args.out), args.step, args.status, args.seconds, args.budget, args.result)
        return 0
    result = {
        "prepare": lambda: prepare(Path(args.out), args.tiny),
        "env": environment,
        "junit": lambda: junit(Path(args.path), args.gpu),
        "pretrain-resume": lambda: pretrain_resume(args),
        "compile": lambda: compile_summary(Path(args.cold), Path(args.warm)),
        "run": lambda: run_summary(args),
        "tsv": lambda: tsv(Path(args.path)),
    }[args.what]()
    print(json.dumps(result))
    return 0 if result.get("passed", True) else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
