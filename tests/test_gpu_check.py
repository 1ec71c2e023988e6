"""bench/gpu_check.sh's rehearsal: `--dry-run` runs every step of the five-minute GPU check on tiny inputs on this
CPU, with the data stage's packages (Biopython, Snakemake, jsonschema, isal) blocked as on the GPU image, and
writes each step's result as it goes; the figures table reads those results."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
STEPS = ["env", "inputs", "gpu_tests", "throughput", "compile", "pretrain_resume", "fsdp", "finetune", "coupling_curve"]


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_the_dry_run_runs_every_step(tmp_path):
    out, work = tmp_path / "out", tmp_path / "work"
    env = {**os.environ, "WORK": str(work), "OMP_NUM_THREADS": "2"}
    done = subprocess.run(
        ["bash", "bench/gpu_check.sh", "--dry-run", str(out)], cwd=ROOT, env=env, capture_output=True, text=True
    )
    log = (out / "check.log").read_text() if (out / "check.log").exists() else ""
    assert done.returncode == 0, done.stdout + log[-4000:]
    summary = [line.split("\t") for line in (out / "summary.tsv").read_text().splitlines()[1:]]
    assert [row[0] for row in summary] == STEPS and all(row[1] == "ok" for row in summary), summary
    results = {r["step"]: r["result"] for r in map(json.loads, (out / "results.jsonl").read_text().splitlines())}
    # the rehearsal ran without the packages the GPU image lacks
    assert results["env"]["Bio"].startswith("absent") and results["env"]["snakemake"].startswith("absent")
    assert results["gpu_tests"]["tests"] >= 4 and results["gpu_tests"]["failures"] == 0
    resume = results["pretrain_resume"]
    assert resume["first_exit"] == 99 and resume["resumed_line"] and resume["final_step"] == 40
    throughput = results["throughput"]["rows"]
    assert {r["objective"] for r in throughput} == {"mlm", "pmlm"}
    assert all(r["syncs_counted"] == 0 for r in throughput if r["model"] == "ours")
    compiled = results["compile"]
    assert compiled["graph_breaks"] == 0 and compiled["cold_first_step_s"] > 0 and compiled["warm_first_step_s"] > 0
    assert results["fsdp"]["expected_line"]
    assert results["finetune"]["rows"] and results["coupling_curve"]["step"] == 4
    inputs = results["inputs"]
    assert inputs["bytes"] == sum(inputs["files"].values()) and "shards/manifest.json" in inputs["files"]
    assert len(list(out.iterdir())) <= 8  # the device tool returns at most 8 files
    assert "| pretrain_resume | ok |" in (out / "figures.md").read_text()


def test_a_step_past_its_limit_is_stopped_and_recorded(tmp_path):
    """The step wrapper itself: a command that outlives its limit gets SIGTERM, its line says timeout, and the
    script's exit status says a step failed, whatever came after."""
    script = (ROOT / "bench" / "gpu_check.sh").read_text()
    wrapper = script[script.index("# limit NAME") : script.index("# into FILE")]
    test = tmp_path / "t.sh"
    test.write_text(
        "set -uo pipefail\nDRY=1 TOTAL_S=60 START=$SECONDS FAILED=0 PY=python3\n"
        f"OUT={tmp_path} WORK={tmp_path}\n{wrapper}\n"
        'limit() { echo 6; }\nstep slow -- sleep 30\nstep quick -- true\nexit "$FAILED"\n'
    )
    (tmp_path / "summary.tsv").write_text("")
    done = subprocess.run(["bash", str(test)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    rows = [line.split("\t") for line in (tmp_path / "summary.tsv").read_text().splitlines()]
    assert done.returncode == 1
    assert rows[0][:2] == ["slow", "timeout"] and int(rows[0][3]) < 15 and rows[1][:2] == ["quick", "ok"]
    lines = [json.loads(x) for x in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert [(x["step"], x["status"]) for x in lines] == [("slow", "timeout"), ("quick", "ok")]


def test_figures_table_from_results():
    figures = load("gpu_figures")
    best = {"micro_tokens": 131072, "layout": "packed", "compiled": False, "step_ms": 400.0}
    throughput = {
        "peak_source": "table: H100",
        "device": "NVIDIA H100 80GB HBM3",
        "bars": {"mfu_base": 0.4, "mfu_xl": 0.5},
        "summary": {
            "base": {
                "best_mlm": {**best, "non_pad_tokens_per_s": 700000, "mfu": 0.41},
                "best_pmlm": {**best, "non_pad_tokens_per_s": 620000, "mfu": 0.45},
                "pmlm_over_mlm_step": 1.1,
                "ours_mlm_over_hf_tokens_per_s": 3.2,
                "auto_vs_best_layout": [
                    {"objective": "pmlm", "micro_tokens": 16384, "compiled": False, "auto": "packed", "best_over_auto": 1.01}
                ],
            }
        },
        "rows": [
            {"model": "ours", "step_ms": 1.0, "syncs_counted": 0, "cuda_syncs": 0, "alloc_retries": 0,
             "peak_mem_gib": 60.0, "estimate_gib": 63.0}
        ],
    }  # fmt: skip
    table = figures.render(
        [{"step": "throughput", "status": "ok", "seconds": 100, "budget_s": 120, "result": throughput}]
    )
    assert "| PMLM-base MFU at the recipe's step (NVIDIA H100 80GB HBM3, peak table: H100) | 45.0% (620,000" in table
    assert "| PMLM / MLM step, base | 1.100 | <= 1.15 |" in table
    assert "| ours MLM / HF EsmForMaskedLM non-pad tokens/s, base | 3.20x | >= 3x |" in table
    assert "| best layout / auto, base | 1.010 (worst: pmlm, 16,384 tokens, auto packed) | <= 1.03 |" in table
    assert (
        "| synchronisations per step, all configurations | 0 counted ops; CUDA: 0; allocator retries 0 | 0 |" in table
    )
    # a step that left no result still gets its line
    assert "| fsdp | timeout | 40 (40) |" in figures.render(
        [{"step": "fsdp", "status": "timeout", "seconds": 40, "budget_s": 40, "result": None}]
    )
