"""The demo workflow's data and pre-training stages on a real one-node SLURM cluster (tests/slurm/cluster.sh),
run as a user runs it: `snakemake --profile slurm` from the repository root, with only the cluster's CPU
partition and account on the command line. Data rules go as CPU jobs, pre-training as 4-GPU jobs in the GPU
partition whose trainers `pmlm launch` starts in their own srun step, and a pre-training job stopped with
SIGUSR1 is resubmitted and resumes from its checkpoint."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent / "slurm"))
from local_cluster import (
    CLUSTER_ACCOUNT,
    CLUSTER_GPU_PARTITION,
    CLUSTER_PARTITION,
    REPO,
    LocalCluster,
    cluster_default_resources,
    scontrol_job,
    slurm_cluster,  # noqa: F401  (module-scoped fixture)
    snakemake_command,
    snakemake_env,
    submissions,
    tail,
)

pytestmark = pytest.mark.slurm

RESULTS = "results/demo"
# The demo DAG up to pre-training (shards, both encoders, the scores table and the KL figure); the
# fine-tuning stage would add a dozen more jobs of the same kinds and minutes of status polling.
DEMO_TARGET = "pretraining"
# The demo, with pre-training cut to seconds. Decontamination against the structure set (an MMseqs2
# search of ~50 s here) is switched off: the SLURM path changes nothing in it.
SHORT = {
    "datasets": {"demo": {"sources": ["uniprot_sample"], "decontaminate": []}},
    "pretrain": {
        "set": {"optim.total_steps": 30, "optim.warmup_steps": 5, "eval_every": 15, "save_every": 15,
                "eval_batches": 4},
        "kl": {"sequences": 8, "pairs": 4},
    },
}  # fmt: skip
# A third model, long enough to be stopped mid-run: small batches, a checkpoint every 10 steps.
RESUME_TOTAL_STEPS = 200
# the GPUs profiles/slurm gives a pre-training job: one trainer each
PRETRAIN_GPUS = 4
RESUME = {
    "pretrain": {
        "models": [{"dataset": "demo", "objective": "pmlm_pair_only", "preset": "tiny"}],
        "set": {"optim.total_steps": RESUME_TOTAL_STEPS, "optim.warmup_steps": 5, "eval_every": 100,
                "save_every": 10, "eval_batches": 2, "data.tokens_per_batch": 1024},
    }
}  # fmt: skip
RESUME_RUN_DIR = f"{RESULTS}/pretrain_runs/demo/pmlm_pair_only-tiny"
RESUME_WEIGHTS = f"{RESULTS}/pretrain/demo/pmlm_pair_only-tiny/model.safetensors"

# bounds against a hang only (the demo took ~5 min here, the resume case ~3 min: the profile's first
# status query comes 40 s after a submission, later ones 10 s further apart each)
DEMO_TIMEOUT_S = 900
RESUME_TIMEOUT_S = 600
CHECKPOINT_WAIT_S = 300
POLL_S = 0.5

DATA_RULES = {"ingest_sequences", "split_clusters", "tokenize_shards"}
LOCAL_RULES = {"fetch_source", "tabulate_pretrain_scores"}
RESUMED = re.compile(r"pmlm pretrain: resuming from (\S+)/checkpoints/step-(\d+) \(step (\d+)\)")


def _snakemake_args(workdir: Path, configfiles: list[Path], *targets: str) -> list[str]:
    """`snakemake --profile slurm` as the README gives it, run from the repository root: the profile and the
    workflow profile as they are, the cluster's partition and account, and what to run where."""
    return [
        "--profile", "slurm",
        "--default-resources", *cluster_default_resources(),
        "--directory", str(workdir),
        "--configfile", str(REPO / "config" / "config.yaml"), *map(str, configfiles),
        "--verbose",  # logs each sbatch call
        *targets,
    ]  # fmt: skip


def _write_yaml(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture(scope="module")
def demo_run(slurm_cluster: LocalCluster, tmp_path_factory):
    """The demo DAG up to pre-training through the executor, once; the resume case reuses its data."""
    root = tmp_path_factory.mktemp("slurm-demo")
    workdir = root / "work"
    short = _write_yaml(root / "short.yaml", SHORT)
    started = time.monotonic()
    result = subprocess.run(
        snakemake_command(_snakemake_args(workdir, [short], DEMO_TARGET), DEMO_TIMEOUT_S),
        cwd=REPO, capture_output=True, text=True, env=snakemake_env(),
    )  # fmt: skip
    print(f"demo up to pre-training through SLURM: {time.monotonic() - started:.0f} s")
    return root, workdir, short, result


def test_demo_dag_runs_as_slurm_jobs(demo_run, slurm_cluster: LocalCluster):
    _root, workdir, _, result = demo_run
    log = result.stdout + result.stderr
    assert result.returncode == 0, (
        f"snakemake exited {result.returncode} (124: timed out)\n{tail(log)}\n{slurm_cluster.log_tails()}"
    )
    assert "Using profiles slurm and workflow specific profile" in log  # both profiles, as a user gets them
    assert "command=sacct" in log  # jobs seen to finish through the accounting database

    for name in (
        "tables/pretrain_scores.md",
        "tables/pretrain_scores.csv",
        "figures/kl_histogram.png",
        "pretrain/demo/mlm-tiny/model.safetensors",
        "pretrain/demo/pmlm-tiny/model.safetensors",
    ):
        assert (workdir / RESULTS / name).stat().st_size > 0, name

    jobs = submissions(log)
    by_rule: dict[str, list] = {}
    for job in jobs:
        by_rule.setdefault(job.rule, []).append(job)
    assert set(by_rule) == DATA_RULES | {"pretrain", "plot_kl_histogram"}, sorted(by_rule)
    assert len(by_rule["pretrain"]) == 2  # mlm and pmlm, each once: nothing failed or was resubmitted
    for rule in LOCAL_RULES:
        assert f"localrule {rule}:" in log, f"{rule} did not run locally"

    for job in jobs:
        record = slurm_cluster.jobcomp_record(job.job_id)
        assert record["JobState"] == "COMPLETED", record
        assert Path(record["WorkDir"]) == workdir, record
        # the profile's settings reached sbatch: partitions, account, requeue
        assert f"-A {CLUSTER_ACCOUNT}" in job.sbatch and "--requeue" in job.sbatch, job.sbatch
        controller = scontrol_job(job.job_id)
        tres = controller.get("TresPerJob", "")
        if job.rule == "pretrain":
            assert controller, f"job {job.job_id} already gone from the controller"  # they end last
            assert record["Partition"] == CLUSTER_GPU_PARTITION, record
            assert f"--gpus={PRETRAIN_GPUS}" in job.sbatch and f"gres:gpu:{PRETRAIN_GPUS}" in tres, (job.sbatch, tres)
            assert "--ntasks-per-gpu" not in job.sbatch, job.sbatch
        else:
            assert record["Partition"] == CLUSTER_PARTITION, record
            assert "--gpus" not in job.sbatch and "gpu" not in tres, (job.rule, job.sbatch, tres)

    # the rule's shell ran in the batch script (`mpi`), and `pmlm launch` started the trainer in its own step
    for job in by_rule["pretrain"]:
        assert "--ntasks-per-node=" in job.sbatch and "--signal=USR1@" in job.sbatch, job.sbatch
    for model in ("mlm-tiny", "pmlm-tiny"):
        rule_log = (workdir / "logs" / "demo" / "pretrain" / "demo" / f"{model}.log").read_text()
        launch = f"^pmlm launch: 1 node\\(s\\) x {PRETRAIN_GPUS} process\\(es\\), inside SLURM's srun step: srun "
        assert re.search(launch, rule_log, re.M), rule_log[:2000]
        # the job says how far it is: a progress line at each tenth of the 30 steps
        steps = [int(s) for s in re.findall(r"^pmlm pretrain: (\d+)/30 steps", rule_log, re.M)]
        assert steps == [3 * k for k in range(1, 11)], rule_log[-3000:]


def _first_checkpoint(run_dir: Path, snakemake: subprocess.Popen) -> int:
    deadline = time.monotonic() + CHECKPOINT_WAIT_S
    while time.monotonic() < deadline and snakemake.poll() is None:
        names = [p.name for p in run_dir.glob("checkpoints/step-*")]
        steps = [int(n.removeprefix("step-")) for n in names if re.fullmatch(r"step-\d+", n)]  # not step-N.tmp
        if steps:
            return min(steps)
        time.sleep(POLL_S)
    raise AssertionError(f"no checkpoint in {run_dir} after {CHECKPOINT_WAIT_S} s (snakemake exit: {snakemake.poll()})")


def _running_job(comment_prefix: str) -> str:
    squeue = ["squeue", "-h", "-t", "RUNNING", "-o", "%i %k"]  # job id, comment (rule and wildcards)
    out = subprocess.run(squeue, capture_output=True, text=True, check=True).stdout
    rows = [line.split() for line in out.splitlines()]
    ids = [row[0] for row in rows if len(row) > 1 and row[1].startswith(comment_prefix)]
    assert len(ids) == 1, f"expected one running job with comment {comment_prefix}*:\n{out}"
    return ids[0]


def test_stopped_pretraining_is_resubmitted_and_resumes(demo_run, slurm_cluster: LocalCluster):
    root, workdir, short, first = demo_run
    if first.returncode != 0:
        pytest.fail("the demo run failed (see test_demo_dag_runs_as_slurm_jobs); its data is needed here")
    resume = _write_yaml(root / "resume.yaml", RESUME)
    out_path = root / "resume.out"
    started = time.monotonic()
    with out_path.open("w") as out:
        snakemake = subprocess.Popen(
            snakemake_command(_snakemake_args(workdir, [short, resume], RESUME_WEIGHTS), RESUME_TIMEOUT_S),
            cwd=REPO, stdout=out, stderr=subprocess.STDOUT, text=True, env=snakemake_env(),
        )  # fmt: skip
        try:
            first_step = _first_checkpoint(workdir / RESUME_RUN_DIR, snakemake)
            # to the job's steps only: the srun step of `pmlm launch`, i.e. the trainers
            job_id = _running_job("rule_pretrain_wildcards_demo_pmlm_pair_only_tiny")
            subprocess.run(["scancel", "--signal=USR1", job_id], check=True, capture_output=True, text=True)
        finally:
            returncode = snakemake.wait()
    print(f"stop, resubmission and resume through SLURM: {time.monotonic() - started:.0f} s")
    log = out_path.read_text()
    assert returncode == 0, f"snakemake exited {returncode} (124: timed out)\n{tail(log)}\n{slurm_cluster.log_tails()}"

    # the stopped job failed and Snakemake submitted it again. Its rule's command ended with the requeue exit
    # 99 (torchrun reports its workers' 99 as 1 for the srun step; `pmlm launch` maps it back from the marker
    # the workers left), as the job's SLURM log says, which the executor keeps for a failed job
    jobs = [job for job in submissions(log) if job.rule == "pretrain"]
    assert [job.job_id for job in jobs][:1] == [job_id] and len(jobs) == 2, jobs
    stopped, resumed = (slurm_cluster.jobcomp_record(job.job_id) for job in jobs)
    assert stopped["JobState"] == "FAILED", stopped
    job_log = jobs[0].log if jobs[0].log.is_absolute() else workdir / jobs[0].log
    assert "returned non-zero exit status 99" in job_log.read_text(), job_log
    assert resumed["JobState"] == "COMPLETED", resumed
    assert "--requeue" in jobs[0].sbatch and "--signal=USR1@" in jobs[0].sbatch

    # the second job's trainer resumed from the checkpoint the stop signal left, not from scratch
    rule_log = (workdir / "logs" / "demo" / "pretrain" / "demo" / "pmlm_pair_only-tiny.log").read_text()
    match = RESUMED.search(rule_log)
    assert match, f"no resume line in the rule log:\n{rule_log[:3000]}"
    assert match.group(1) == RESUME_RUN_DIR and match.group(2) == match.group(3), match.group(0)
    assert first_step <= int(match.group(3)) < RESUME_TOTAL_STEPS, (first_step, match.group(0))
    scores = json.loads((workdir / RESULTS / "pretrain/demo/pmlm_pair_only-tiny/final_scores.json").read_text())
    assert scores["step"] == RESUME_TOTAL_STEPS, scores
    assert (workdir / RESUME_WEIGHTS).stat().st_size > 0
