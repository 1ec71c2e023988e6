"""A tiny workflow run through profiles/slurm on a real SLURM cluster (tests/slurm/cluster.sh), to prove jobs, GPU
requests included, really go through sbatch and are seen to finish through accounting; and `pmlm launch` in a batch
job putting the job back in its queue (same job id) after a worker's exit 99, as often as it comes, and not after any
other exit."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "slurm"))
from local_cluster import (
    CLUSTER_ACCOUNT,
    CLUSTER_PARTITION,
    FAST_STATUS,
    SITE_PROFILE,
    VENV_BIN,
    LocalCluster,
    cluster_default_resources,
    job_state,
    release,
    run_snakemake,
    slurm_cluster,  # noqa: F401  (module-scoped fixture)
    snakemake_env,
)
from local_cluster import fields as _fields
from local_cluster import scontrol_job as _scontrol_job
from local_cluster import tail as _tail

# whole-workflow bound for the tiny two-job Snakefile below
SNAKEMAKE_TIMEOUT_S = 240

# Two rules submitted as SLURM jobs; each writes the variables only a SLURM job step has.
# Rules run under `set -euo pipefail`, hence the `:-` defaults.
TINY_SNAKEFILE = textwrap.dedent(
    """\
    rule all:
        input: "cpu.txt", "gpu.txt"

    rule cpu_job:
        output: "cpu.txt"
        threads: 1
        shell: "echo job=${{SLURM_JOB_ID:-}} cuda=${{CUDA_VISIBLE_DEVICES:-}} > {output}"

    rule gpu_job:
        output: "gpu.txt"
        threads: 1
        resources: gpu=1, cpus_per_gpu=1
        shell:
            "echo job=${{SLURM_JOB_ID:-}} cuda=${{CUDA_VISIBLE_DEVICES:-}}"
            " gpus=${{SLURM_JOB_GPUS:-}} > {output}"
    """
)


def _sbatch_calls(log: str) -> dict[str, str]:
    """rule name -> the sbatch command line the executor logged for it (with --verbose)."""
    calls = {}
    for line in log.splitlines():
        if line.startswith("sbatch call:"):
            match = re.search(r"--comment (\S+)", line)
            assert match, f"no --comment in {line}"
            calls[match.group(1).removeprefix("rule_")] = line
    return calls


pytestmark = pytest.mark.slurm


def test_rules_run_as_slurm_jobs_with_gpu_request(slurm_cluster: LocalCluster, tmp_path: Path):
    (tmp_path / "Snakefile").write_text(TINY_SNAKEFILE)
    result = run_snakemake(
        [
            "--snakefile", str(tmp_path / "Snakefile"),
            "--directory", str(tmp_path),
            # the site profile, outside the repository: by path, and without the workflow's own profile
            "--profile", str(SITE_PROFILE),
            "--workflow-profile", "none",
            "--default-resources", *cluster_default_resources(),
            *FAST_STATUS,
            "--verbose",
        ],
        cwd=tmp_path,
        timeout_s=SNAKEMAKE_TIMEOUT_S,
    )  # fmt: skip
    log = result.stdout + result.stderr
    assert result.returncode == 0, (
        f"snakemake exited {result.returncode} (124: timed out)\n{_tail(log)}\n{slurm_cluster.log_tails()}"
    )
    # the executor saw the jobs finish through the accounting database (sacct), as on a real cluster
    assert "command=sacct" in log

    cpu = _fields((tmp_path / "cpu.txt").read_text())
    gpu = _fields((tmp_path / "gpu.txt").read_text())
    for out in (cpu, gpu):
        assert out["job"].isdigit(), f"output not written inside a SLURM job: {out}"
    assert cpu["job"] != gpu["job"]

    calls = _sbatch_calls(log)
    assert set(calls) == {"cpu_job", "gpu_job"}, calls
    assert "--gpus=1" in calls["gpu_job"]
    assert "--gpus" not in calls["cpu_job"]
    for call in calls.values():
        assert f"-p {CLUSTER_PARTITION}" in call and f"-A {CLUSTER_ACCOUNT}" in call and "--requeue" in call, call

    # the controller's own record: same job ids, finished, and only one asked for a GPU
    for rule, out in (("cpu_job", cpu), ("gpu_job", gpu)):
        record = _scontrol_job(out["job"])
        assert record["JobState"] == "COMPLETED", record
        assert record["Comment"] == f"rule_{rule}", record
        assert Path(record["WorkDir"]) == tmp_path, record
        assert record["Partition"] == CLUSTER_PARTITION, record
        assert slurm_cluster.jobcomp_record(out["job"])["JobState"] == "COMPLETED"
    assert "gres:gpu:1" in _scontrol_job(gpu["job"]).get("TresPerJob", ""), gpu
    assert "gpu" not in _scontrol_job(cpu["job"]).get("TresPerJob", "")
    # SLURM's gpu plugin bound the (fake) device to the GPU job's step and to no other
    assert gpu["cuda"] != "", gpu
    assert cpu["cuda"] == "", cpu


# -- `pmlm launch` in a batch job: a worker's exit 99 requeues the job in place, any other exit does not ----------

# Stands in for a trainer (which exits 99 only after saving a checkpoint on a stop signal, and after the documented
# count of stops without a newer checkpoint, or on a NaN loss, exits otherwise with one line): each run of the job
# appends its job id and restart count; runs 1 and 2 exit 99, run 3 exits 3 with one line.
STAND_IN = textwrap.dedent(
    """\
    import os, sys
    from pathlib import Path

    runs = Path(sys.argv[1])
    with runs.open("a") as out:
        out.write(f"{os.environ['SLURM_JOB_ID']} {os.environ.get('SLURM_RESTART_COUNT', '0')}\\n")
    run = len(runs.read_text().splitlines())
    if run < 3:
        print(f"stand-in: run {run}: checkpoint saved; exiting with 99", file=sys.stderr)
        sys.exit(99)
    print("stand-in: error: stopped 2 times without a newer checkpoint than step-3; not requeued", file=sys.stderr)
    sys.exit(3)
    """
)
STAND_IN_RUNS = 3
REQUEUE_WAIT_S = 120


def test_a_saved_job_requeues_itself_in_place_and_any_other_exit_ends_it(slurm_cluster: LocalCluster, tmp_path: Path):
    (tmp_path / "stand_in.py").write_text(STAND_IN)
    script = tmp_path / "job.sh"
    script.write_text(f"#!/bin/bash\nexec {VENV_BIN / 'python'} -m pmlm launch -- stand_in.py runs.txt\n")
    submit = subprocess.run(
        ["sbatch", "--parsable", "--requeue", "-p", CLUSTER_PARTITION, "-A", CLUSTER_ACCOUNT, "-t", "5",
         "--open-mode=append", "-o", str(tmp_path / "job-%j.out"), "-D", str(tmp_path), str(script)],
        capture_output=True, text=True, check=True, env=snakemake_env(),
    )  # fmt: skip
    job = submit.stdout.strip().split(";")[0]
    deadline, released, states = time.monotonic() + STAND_IN_RUNS * REQUEUE_WAIT_S, 0, []
    while (state := job_state(job)) not in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"):
        assert time.monotonic() < deadline, f"job {job} still {state} ({states})\n{slurm_cluster.log_tails()}"
        if not states or states[-1] != state:
            states.append(state)
        restarts = int(_scontrol_job(job).get("Restarts", "0"))
        if state == "PENDING" and restarts > released:
            release(job)  # instead of SLURM's hold of about two minutes after a requeue
            released = restarts
        time.sleep(0.2)
    record = _scontrol_job(job)
    runs = [line.split() for line in (tmp_path / "runs.txt").read_text().splitlines()]
    # one job id throughout, run again after each 99 (SLURM counts the restarts), and not after the exit 3
    assert runs == [[job, str(k)] for k in range(STAND_IN_RUNS)], runs
    assert record["JobState"] == "FAILED" and record["Restarts"] == str(STAND_IN_RUNS - 1), record
    assert record["ExitCode"] == "3:0", record
    out = (tmp_path / f"job-{job}.out").read_text()  # every run's (SLURM truncates it at a restart without append)
    requeued = re.findall(rf"^pmlm launch: .*; job {job} requeued in place \(restart (\d)\): .*$", out, re.M)
    assert requeued == ["1", "2"], out
    assert out.count("stand-in: error:") == 1 and "Traceback" not in out, out
