"""bench/gpu_science.sh, the equal-compute co-evolution study at GPU length in one call: its rehearsal (`--dry-run`)
runs the GPU call's code path on tiny inputs on this CPU, with the packages the GPU image lacks blocked; a run cut
short keeps the budgets its arms reached; and the GPU-length config trains on the CPU study's own families."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pmlm.coevolution.curves import synth_seed
from pmlm.coevolution.curves_config import CurvesConfig

ROOT = Path(__file__).resolve().parent.parent
GPU_LENGTH = ROOT / "config" / "coevolution_curves_gpu_length.yaml"
CPU_STUDY = ROOT / "config" / "coevolution_curves.yaml"


def _rows(path: Path) -> list[dict]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle, delimiter="\t"))


def test_the_gpu_length_study_is_the_cpu_study_longer():
    """Its families are the CPU study's seed-1 40-residue draws (same sampler seeds and parameters), its recipe,
    batch and read-outs the same, its three arms the issue's, its last budget >= 20,000 steps."""
    gpu, cpu = CurvesConfig.from_yaml(GPU_LENGTH), CurvesConfig.from_yaml(CPU_STUDY)
    assert gpu.total_steps >= 20_000 and gpu.total_steps >= 5 * cpu.total_steps
    assert set(gpu.seeds) <= set(cpu.seeds)
    cpu_index = {name: g for g, name in enumerate(cpu.groups)}
    for g, (name, group) in enumerate(gpu.groups.items()):
        assert group.length == 40 and name in cpu.groups
        assert group == cpu.groups[name]
        for seed in gpu.seeds:
            assert synth_seed(seed, g) == synth_seed(seed, cpu_index[name])
    assert (gpu.sequences, gpu.valid_fraction, gpu.split_seed) == (cpu.sequences, cpu.valid_fraction, cpu.split_seed)
    assert gpu.recipe == cpu.recipe and gpu.evaluate == cpu.evaluate
    assert {k: v for k, v in gpu.set.items() if k in cpu.set} == cpu.set
    assert {a: (arm.objective, arm.set) for a, arm in gpu.arms.items()} == {
        "mlm": ("mlm", {}),
        "pmlm": ("pmlm", {"model.overrides.product_base": False}),
        "pmlm_product": ("pmlm", {"model.overrides.product_base": True}),
    }
    assert gpu.jobs == len(gpu.arms) * len(gpu.seeds)  # every arm at once on the one GPU


@pytest.mark.slow
def test_the_dry_run_and_a_run_cut_short(tmp_path):
    out, work = tmp_path / "out", tmp_path / "work"
    env = {**os.environ, "WORK": str(work), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        ["bash", "bench/gpu_science.sh", "--dry-run", str(out)], cwd=ROOT, env=env, capture_output=True, text=True
    )
    log = (out / "science.log").read_text() if (out / "science.log").exists() else ""
    assert done.returncode == 0, done.stdout + log[-4000:]
    assert len(list(out.iterdir())) <= 8  # the device tool returns at most 8 files
    # the rehearsal ran without the packages the GPU image lacks (Biopython comes from the carried wheel there)
    assert json.loads((out / "env.json").read_text())["snakemake"].startswith("absent")
    rows = _rows(out / "curves.tsv")
    arms = {r["arm"] for r in rows}
    assert arms == {"mlm", "pmlm", "pmlm_product", "baseline"}
    for arm in ("mlm", "pmlm", "pmlm_product"):
        assert {int(r["step"]) for r in rows if r["arm"] == arm and r["readout"] != "training"} == {10, 20}
    # the baselines were computed on the CPU while preparing, not in the GPU call
    assert "baselines done" not in log.split("curves: limit")[1]
    summary = json.loads((out / "summary.json").read_text())
    assert all(a["budgets"] == [10, 20] and a["steps_per_s"] > 0 for a in summary["arms"].values())
    assert summary["answer"]["step"] == 20 and "pmlm_pair_joint" in summary["answer"]
    assert "**The answer at 20 steps**" in (out / "curves.md").read_text()
    units = work / "run" / "units"
    assert not list(units.glob("*.partial.tsv"))  # an arm that ended leaves its rows only

    # a run stopped by a time limit after the pmlm arm's first budget: the report keeps the budgets reached and
    # answers at the last one every arm reached
    pmlm = units / "seed1-L40-pmlm.tsv"
    kept = [line for line in pmlm.read_text().splitlines() if "\t20\t" not in line]
    (units / "seed1-L40-pmlm.partial.tsv").write_text("\n".join(kept) + "\n")
    pmlm.unlink()
    (units / "seed1-L40-pmlm_product.tsv").unlink()
    collect = [sys.executable, "-m", "pmlm", "coevolution", "curves", "--config", str(work / "inputs" / "config.yaml")]
    done = subprocess.run(
        [*collect, "--out", str(work / "run"), "--collect", "--no-figure"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert "seed1-L40-mlm: done" in done.stderr and "seed1-L40-pmlm: stopped after step 10" in done.stderr
    assert "seed1-L40-pmlm_product: missing" in done.stderr
    report = (work / "run" / "curves.md").read_text()
    assert "**The answer at 10 steps**" in report and "budgets 10, 20 steps" in report
    assert {r["arm"] for r in _rows(work / "run" / "curves.tsv")} == {"mlm", "pmlm", "baseline"}


def test_a_gpu_run_is_costed_in_wall_seconds():
    """On a GPU the CPU only launches kernels: the cost table gives training wall-seconds per step there, CPU-seconds
    on CPUs, each arm relative to the MLM."""
    from pmlm.coevolution.curve_report import Results, cost_table
    from pmlm.coevolution.curves import ALL

    def rows(on_gpu: float) -> list[tuple]:
        out = []
        for arm, cpu, wall in (("mlm", 100.0, 20.0), ("pmlm", 150.0, 30.0)):
            out += [(1, "L40", ALL, arm, 0, "training", "flops_per_step", 2e9)]
            out += [(1, "L40", ALL, arm, 1000, "training", m, v) for m, v in (("cpu_s", cpu), ("wall_s", wall))]
            out += [(1, "L40", ALL, arm, 1000, "training", "on_gpu", on_gpu)]
            out += [(1, "L40-strong", "f0", arm, 1000, "substitution", "spearman_planted", 0.5)]
        return out

    gpu, cpu = cost_table(Results(rows(1.0))), cost_table(Results(rows(0.0)))
    assert "GPU wall-s per step" in gpu[0] and gpu[-1].endswith("| 0.0300 | 1.50 |")
    assert "CPU-s per step" in cpu[0] and cpu[-1].endswith("| 0.1500 | 1.50 |")
