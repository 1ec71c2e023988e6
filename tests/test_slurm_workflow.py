"""The demo workflow's data and pre-training stages on a real SLURM cluster (tests/slurm/cluster.sh), run as a user
runs it: `snakemake --profile slurm` from the repository root, with only the cluster's CPU partition and account on
the command line. Data rules go as CPU jobs, pre-training as 4-GPU jobs in the GPU partition whose trainers `pmlm
launch` starts in their own srun step. The finished run plans no job for the same config with its keys in another
order. A pre-training job that meets its time limit again and again (a real one, then SIGUSR1 as `--signal` sends it)
requeues itself each time and finishes as one SLURM job, no retry spent, with the uninterrupted run's weights."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest
import yaml
from conftest import reversed_keys
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parent / "slurm"))
from local_cluster import (
    CLUSTER_ACCOUNT,
    CLUSTER_GPU_PARTITION,
    CLUSTER_PARTITION,
    FAST_STATUS,
    REPO,
    SITE_PROFILE,
    LocalCluster,
    cluster_default_resources,
    release,
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
# The demo, with pre-training cut to 30 steps of twice the recipe's batch (about a minute of PMLM training on 2
# cores, long enough for a time limit to fall inside it, see below). Decontamination against the structure set (an
# MMseqs2 search of ~50 s here) is switched off: the SLURM path changes nothing in it.
SHORT = {
    "datasets": {"demo": {"sources": ["uniprot_sample"], "decontaminate": []}},
    "pretrain": {
        "set": {"optim.total_steps": 30, "optim.warmup_steps": 5, "eval_every": 15, "save_every": 15,
                "eval_batches": 4, "tokens_per_step": 4 * 8192},  # 8,192 tokens per rank
        "kl": {"sequences": 8, "pairs": 4},
    },
}  # fmt: skip
# the GPUs profiles/slurm gives a pre-training job: one trainer each
PRETRAIN_GPUS = 4

# A third encoder trained exactly as the demo's pmlm-tiny (same recipe, settings and data, under a name of its own),
# stopped again and again through the literal profile: first by a real time limit, then by SIGUSR1 sent as SLURM's
# warning sends it (`scancel --signal=USR1`) as soon as each run has resumed. The real limit: once the first run is
# training, the job's limit is lowered (`scontrol update TimeLimit`, as an administrator or the job's owner may) to
# LIMIT_AHEAD_S from now, inside the profile's warning (`--signal=USR1@600`): SLURM's time-limit check, every 30 s,
# then sends the warning itself, while about a minute of training is left. The limit is set back to the profile's
# before the job runs again, so that only the test's signals stop the later runs.
REQUEUED_PRESET = "tiny_requeued"
REQUEUED = {
    "pretrain": {
        "recipes": {REQUEUED_PRESET: "config/train/tiny.yaml"},
        "models": [{"dataset": "demo", "objective": "pmlm", "preset": REQUEUED_PRESET}],
    }
}
REQUEUED_RUN_DIR = f"{RESULTS}/pretrain_runs/demo/pmlm-{REQUEUED_PRESET}"
REQUEUED_WEIGHTS = f"{RESULTS}/pretrain/demo/pmlm-{REQUEUED_PRESET}/model.safetensors"
UNINTERRUPTED_WEIGHTS = f"{RESULTS}/pretrain/demo/pmlm-tiny/model.safetensors"
LIMIT_AHEAD_S = 600  # the profile's warning comes 600 s before the limit, SLURM's check up to 30 s later
PROGRESS = re.compile(r"^pmlm pretrain: \d+/\d+ steps", re.M)  # the trainers are at it (their handlers installed)
STOPS_BY_SIGNAL = 5  # after the real time limit: six stops at least

# bounds against a hang only
DEMO_TIMEOUT_S = 900
REQUEUE_TIMEOUT_S = 600
EVENT_WAIT_S = 150
POLL_S = 0.2

DATA_RULES = {"ingest_sequences", "split_clusters", "tokenize_shards"}
LOCAL_RULES = {"fetch_source", "tabulate_pretrain_scores"}
RESUMED = re.compile(r"^pmlm pretrain: resuming from (\S+)/checkpoints/step-(\d+) \(step (\d+)\)$", re.M)
# start-up over, the loop under way: a stop signal from here on is answered after a step, with progress saved
TRAINING = re.compile(r"^pmlm pretrain: resumed; training from step \d+ of \d+$", re.M)
SAVED = re.compile(r"^pmlm pretrain: SIGUSR1 received; saved checkpoint at step (\d+); exiting with 99", re.M)
REQUEUED_LINE = re.compile(r"^pmlm launch: .*; job (\d+) requeued in place \(restart (\d+)\): ", re.M)


def _snakemake_args(workdir: Path, configfiles: list[Path], *targets: str, extra: tuple[str, ...] = ()) -> list[str]:
    """`snakemake --profile slurm` as docs/slurm.md gives it, run from the repository root: the profile and the
    workflow profile as they are, the cluster's partition and account, and what to run where."""
    return [
        "--profile", "slurm",
        "--default-resources", *cluster_default_resources(),
        *FAST_STATUS, *extra,
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
    """The demo DAG up to pre-training through the executor, once; the other tests reuse its data and encoders."""
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

    # every run of a training job is appended to train.log in its run folder: here one run, the rule log's
    for model in ("mlm-tiny", "pmlm-tiny"):
        rule_log = (workdir / "logs" / "demo" / "pretrain" / "demo" / f"{model}.log").read_text()
        assert (workdir / RESULTS / "pretrain_runs" / "demo" / model / "train.log").read_text() == rule_log


def test_the_same_config_in_another_key_order_plans_no_job(demo_run, slurm_cluster: LocalCluster):
    """Snakemake reruns a job whose params changed: after the run, the same config files with every mapping's keys
    reversed must plan nothing (`split_clusters` once saw its options in another order as changed params)."""
    root, workdir, short, first = demo_run
    if first.returncode != 0:
        pytest.fail("the demo run failed (see test_demo_dag_runs_as_slurm_jobs); its outputs are needed here")
    reordered = []
    for path in (REPO / "config" / "config.yaml", short):
        data = reversed_keys(yaml.safe_load(path.read_text()))
        reordered.append(root / f"reordered-{path.name}")
        reordered[-1].write_text(yaml.safe_dump(data, sort_keys=False))
    args = ["--profile", "slurm", "--default-resources", *cluster_default_resources(), "-n", "--directory",
            str(workdir), "--configfile", *map(str, reordered), "--", DEMO_TARGET]  # fmt: skip
    dry = subprocess.run(snakemake_command(args, 120), cwd=REPO, capture_output=True, text=True, env=snakemake_env())
    out = dry.stdout + dry.stderr
    assert dry.returncode == 0 and "Nothing to be done" in out, tail(out)


# -- a job that meets its time limit again and again ---------------------------------------------------------------


def _text(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


class _Requeues:
    """Watches one pre-training job through the run folder's train.log (every run of the job, appended) and the
    controller's record; releases each requeue at once; notes when each thing first happened (time.time())."""

    def __init__(self, job: str, train_log: Path, before_release=None):
        self.job, self.train_log, self.before_release = job, train_log, before_release
        self.seen: dict[tuple[str, int], float] = {}  # (event, its index from 0) -> when first seen
        self.released = 0
        self.state, self.restarts = "", 0
        self.text = ""

    def _note(self, event: str, count: int) -> None:
        for index in range(count):
            self.seen.setdefault((event, index), time.time())

    def poll(self) -> None:
        self.text = _text(self.train_log)
        self._note("saved", len(SAVED.findall(self.text)))
        self._note("requeued", len(REQUEUED_LINE.findall(self.text)))
        self._note("resumed", len(RESUMED.findall(self.text)))
        self._note("training", len(TRAINING.findall(self.text)))
        record = scontrol_job(self.job)
        self.state, self.restarts = record.get("JobState", ""), int(record.get("Restarts", "0"))
        if self.state == "PENDING" and self.restarts > self.released:
            self.seen.setdefault(("pending", self.restarts - 1), time.time())
            if self.before_release is not None:
                self.before_release(self.restarts)
            release(self.job)  # instead of SLURM's hold of about two minutes after a requeue
            self.seen.setdefault(("released", self.restarts - 1), time.time())
            self.released = self.restarts
        if self.state == "RUNNING":
            self._note("running", self.restarts + 1)

    def count(self, event: str) -> int:
        return sum(1 for kind, _ in self.seen if kind == event)


def _lower_time_limit(job: str) -> float:
    """The job's limit put LIMIT_AHEAD_S from now (whole minutes from its start); when that was done."""
    started = datetime.fromisoformat(scontrol_job(job)["StartTime"]).timestamp()  # SLURM's records: local time
    minutes = int((time.time() - started + LIMIT_AHEAD_S) // 60)
    subprocess.run(["scontrol", "update", f"jobid={job}", f"TimeLimit={minutes}"], check=True, capture_output=True)
    return time.time()


def test_time_limits_requeue_the_job_in_place_and_it_ends_as_if_uninterrupted(demo_run, slurm_cluster: LocalCluster):
    root, workdir, short, first = demo_run
    if first.returncode != 0:
        pytest.fail("the demo run failed (see test_demo_dag_runs_as_slurm_jobs); its data and encoders are needed here")
    config = _write_yaml(root / "requeued.yaml", REQUEUED)
    profile_limit = yaml.safe_load((SITE_PROFILE / "config.yaml").read_text())["set-resources"]["pretrain"]["runtime"]
    args = _snakemake_args(workdir, [short, config], REQUEUED_WEIGHTS)
    out_path = root / "requeued.out"
    signals: list[float] = []
    limit_lowered = None
    restored: list[float] = []

    def restore_limit(restarts: int) -> None:  # before the second run: the profile's limit again
        if restarts == 1:
            subprocess.run(["scontrol", "update", f"jobid={job}", f"TimeLimit={profile_limit}"], check=True,
                           capture_output=True)  # fmt: skip
            restored.append(time.time())

    started = time.time()
    with out_path.open("w") as out:
        snakemake = subprocess.Popen(snakemake_command(args, REQUEUE_TIMEOUT_S), cwd=REPO, stdout=out,
                                     stderr=subprocess.STDOUT, text=True, env=snakemake_env())  # fmt: skip
        try:
            job = None
            while job is None:
                assert snakemake.poll() is None and time.time() < started + EVENT_WAIT_S, tail(_text(out_path))
                job = next((j.job_id for j in submissions(_text(out_path)) if j.rule == "pretrain"), None)
                time.sleep(POLL_S)
            watch = _Requeues(job, workdir / REQUEUED_RUN_DIR / "train.log", before_release=restore_limit)
            while snakemake.poll() is None:
                if limit_lowered is None and PROGRESS.search(_text(watch.train_log)):
                    limit_lowered = _lower_time_limit(job)
                watch.poll()
                # after the time limit's own stop, SIGUSR1 to each run as soon as its start-up is over (a signal
                # during start-up would be a stop without progress, which the trainers answer differently)
                training, stopped = watch.count("training"), watch.count("saved")
                if stopped >= 1 and len(signals) < STOPS_BY_SIGNAL and training > len(signals) and training == stopped:
                    subprocess.run(["scancel", "--signal=USR1", job], check=True, capture_output=True)
                    signals.append(time.time())
                assert time.time() < started + REQUEUE_TIMEOUT_S, tail(watch.text)
                time.sleep(POLL_S)
            watch.poll()
        finally:
            returncode = snakemake.wait()
    log = out_path.read_text()
    assert returncode == 0, f"snakemake exited {returncode} (124: timed out)\n{tail(log)}\n{slurm_cluster.log_tails()}"
    text = watch.text

    # one SLURM job from start to end: submitted once, requeued in place at every stop, no Snakemake retry spent
    jobs = [j for j in submissions(log) if j.rule == "pretrain"]
    assert [j.job_id for j in jobs] == [job], jobs
    assert "Error in rule" not in log, tail(log)
    assert "--signal=USR1@600" in jobs[0].sbatch and f"-t {profile_limit}" in jobs[0].sbatch, jobs[0].sbatch
    record = scontrol_job(job)
    saved = [int(step) for step in SAVED.findall(text)]
    stops = len(saved)
    assert stops == 1 + STOPS_BY_SIGNAL, text[-3000:]
    assert record["JobState"] == "COMPLETED" and int(record["Restarts"]) == stops, record
    assert slurm_cluster.jobcomp_record(job)["JobState"] == "COMPLETED"
    assert [(j, int(r)) for j, r in REQUEUED_LINE.findall(text)] == [(job, k) for k in range(1, stops + 1)], text
    # the first stop was the time limit's: SLURM's own warning after the limit came within its reach, before the test
    # sent any signal
    assert limit_lowered < watch.seen[("saved", 0)] < restored[0] < signals[0] and len(restored) == 1
    # each run resumed from the checkpoint the previous one saved, and made progress
    resumed = [(path, int(a), int(b)) for path, a, b in RESUMED.findall(text)]
    assert [(path, step) for path, step, _ in resumed] == [(REQUEUED_RUN_DIR, step) for step in saved], resumed
    assert saved == sorted(set(saved)), saved
    scores = json.loads((workdir / RESULTS / f"pretrain/demo/pmlm-{REQUEUED_PRESET}/final_scores.json").read_text())
    assert scores["step"] == SHORT["pretrain"]["set"]["optim.total_steps"], scores
    # and ended with the weights of the uninterrupted run (the demo's pmlm-tiny: same recipe, settings, data, world)
    requeued, uninterrupted = load_file(workdir / REQUEUED_WEIGHTS), load_file(workdir / UNINTERRUPTED_WEIGHTS)
    assert requeued.keys() == uninterrupted.keys()
    assert all(bool((requeued[k] == uninterrupted[k]).all()) for k in requeued), "weights differ"

    # the timeline of each stop, from the signal (the first: from the limit's change; SLURM's warning came at its
    # next check) to the resumed step
    rows = []
    for i in range(stops):
        t0 = signals[i - 1] if i else limit_lowered
        marks = [(name, watch.seen.get((name, i))) for name in ("saved", "requeued", "pending", "released")]
        marks += [("running", watch.seen.get(("running", i + 1))), ("resumed", watch.seen.get(("resumed", i)))]
        row = ", ".join(f"{name} {when - t0:+.1f} s" for name, when in marks if when is not None)
        rows.append(f"stop {i + 1} at step {saved[i]} ({'time limit' if not i else 'SIGUSR1'}): {row}")
    print(f"job {job}: {stops} stops, {record['Restarts']} requeues, finished {time.time() - started:.0f} s after "
          "submission\n" + "\n".join(rows))  # fmt: skip
