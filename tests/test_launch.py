"""`pmlm launch`: the command it builds from SLURM's environment (1 x 1, 1 x 4, 2 x 4, with and without
the variables the executor strips), and, with real child processes, the requeue exit code and signal
forwarding through torchrun."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from pmlm.cli import main
from pmlm.errors import ConfigError
from pmlm.train import REQUEUE_EXIT_CODE
from pmlm.train.allocation import count_visible_gpus, first_host, read_allocation
from pmlm.train.launch import plan_launch

PY = "python"
MARKER = Path("/shared/run/.pmlm-launch-x")
COMMAND = ["-m", "pmlm", "pretrain", "--config", "base.yaml"]
WORKER = ["-m", "pmlm.train.launch", "--requeue-marker", str(MARKER), *COMMAND]
AGENT = [PY, "-m", "pmlm.train.launch", "--ignore-usr1", "-m", "torch.distributed.run"]
# bound for each real launch below (torchrun with two CPU workers starts in ~3 s here)
LAUNCH_TIMEOUT_S = 120
READY_WAIT_S = 60


def _no_job_record(job_id: str) -> dict[str, str]:
    raise AssertionError(f"scontrol consulted for job {job_id} although the environment had everything")


def _plan(env: dict[str, str], gpus_per_node: int | None = None, job_record=_no_job_record):
    alloc = read_allocation(env, gpus_per_node=gpus_per_node, job_record=job_record)
    return plan_launch(alloc, COMMAND, marker_dir=MARKER, python=PY)


BATCH_2X4 = {
    "SLURM_JOB_ID": "4242", "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_NODELIST": "gpu[07-08]",
    "SLURM_CPUS_ON_NODE": "32", "CUDA_VISIBLE_DEVICES": "0,1,2,3",
}  # fmt: skip
SRUN_2X4 = ["srun", "--nodes=2", "--ntasks-per-node=1", "--kill-on-bad-exit=1", "--cpus-per-task=32"]
TORCHRUN_2X4 = [
    "--nnodes", "2", "--nproc_per_node", "4", "--rdzv_backend", "c10d",
    "--rdzv_endpoint", "gpu07:29500", "--rdzv_id", "4242",
]  # fmt: skip


# -- command construction ------------------------------------------------------------------------


def test_one_gpu_outside_slurm_runs_the_command_itself():
    plan = _plan({"CUDA_VISIBLE_DEVICES": "0"})
    assert plan.mode == "exec" and plan.argv == [PY, *COMMAND] and plan.marker_dir is None


def test_no_gpu_outside_slurm_is_one_cpu_process():
    plan = _plan({})
    assert (plan.mode, plan.procs_per_node, plan.argv) == ("exec", 1, [PY, *COMMAND])


def test_one_gpu_inside_a_job_step_runs_the_command_itself():
    # the executor's default: the rule already runs inside `srun -n1`; a nested srun would wait forever
    env = {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_NNODES": "1", "SLURM_STEP_NUM_TASKS": "1",
           "SLURM_JOB_NODELIST": "n1", "CUDA_VISIBLE_DEVICES": "0"}  # fmt: skip
    assert _plan(env).argv == [PY, *COMMAND]


def test_one_gpu_in_a_batch_job_gets_its_own_srun_step():
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NUM_NODES": "1", "SLURM_JOB_NODELIST": "n1",
           "SLURM_CPUS_ON_NODE": "8", "CUDA_VISIBLE_DEVICES": "0"}  # fmt: skip
    plan = _plan(env)
    assert plan.mode == "srun"
    assert plan.argv == ["srun", "--nodes=1", "--ntasks-per-node=1", "--kill-on-bad-exit=1", "--cpus-per-task=8",
                         PY, *COMMAND]  # fmt: skip


def test_four_gpus_on_one_node_use_standalone_torchrun():
    plan = _plan({"CUDA_VISIBLE_DEVICES": "0,1,2,3"})
    assert plan.mode == "torchrun" and plan.marker_dir == MARKER
    assert plan.argv == [*AGENT, "--standalone", "--nproc_per_node", "4", *WORKER]


def test_four_gpus_in_a_batch_job_run_torchrun_in_an_srun_step():
    env = {**BATCH_2X4, "SLURM_JOB_NUM_NODES": "1", "SLURM_JOB_NODELIST": "gpu07"}
    plan = _plan(env)
    assert plan.argv == [*SRUN_2X4[:1], "--nodes=1", *SRUN_2X4[2:], *AGENT, "--standalone", "--nproc_per_node", "4",
                         *WORKER]  # fmt: skip


def test_two_nodes_by_four_gpus_rendezvous_on_the_first_node():
    plan = _plan(BATCH_2X4)
    assert (plan.mode, plan.nodes, plan.procs_per_node) == ("srun", 2, 4)
    assert plan.argv == [*SRUN_2X4, *AGENT, *TORCHRUN_2X4, *WORKER]


def test_two_nodes_from_the_job_record_when_the_executor_stripped_slurm_variables():
    # the Snakemake executor keeps only SLURM_JOB_ID (and a few others) before the rule's shell runs
    asked = []

    def record(job_id):
        asked.append(job_id)
        return {"JobId": job_id, "NumNodes": "2", "NumCPUs": "64", "NodeList": "gpu[07-08]", "JobState": "RUNNING"}

    plan = _plan({"SLURM_JOB_ID": "4242", "CUDA_VISIBLE_DEVICES": "0,1,2,3"}, job_record=record)
    assert asked == ["4242"]
    assert plan.argv == [*SRUN_2X4, *AGENT, *TORCHRUN_2X4, *WORKER]


def test_older_variable_names_and_explicit_gpu_count():
    env = {"SLURM_JOBID": "4242", "SLURM_NNODES": "2", "SLURM_NODELIST": "gpu[07-08]", "SLURM_CPUS_ON_NODE": "32"}
    plan = _plan(env, gpus_per_node=4)
    assert plan.argv == [*SRUN_2X4, *AGENT, *TORCHRUN_2X4, *WORKER]


def test_one_launcher_per_node_inside_a_user_step_runs_torchrun_without_srun():
    env = {"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "3", "SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_NUM_TASKS": "2",
           "SLURM_STEP_NODELIST": "gpu[07-08]", "CUDA_VISIBLE_DEVICES": "0,1,2,3"}  # fmt: skip
    assert _plan(env).argv == [*AGENT, *TORCHRUN_2X4, *WORKER]


def test_a_step_with_several_tasks_per_node_is_refused():
    env = {"SLURM_JOB_ID": "1", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_NUM_TASKS": "8",
           "SLURM_STEP_NODELIST": "n[1-2]"}  # fmt: skip
    with pytest.raises(ConfigError, match="--ntasks-per-node=1"):
        _plan(env)


def test_cpu_count_is_optional_but_nodes_are_not():
    env = {"SLURM_JOB_ID": "9", "SLURM_JOB_NUM_NODES": "1", "SLURM_JOB_NODELIST": "n1"}

    def unavailable(job_id):
        raise ConfigError("scontrol not on PATH")

    plan = _plan(env, job_record=unavailable)
    assert plan.argv[:4] == ["srun", "--nodes=1", "--ntasks-per-node=1", "--kill-on-bad-exit=1"]
    assert not any(a.startswith("--cpus-per-task") for a in plan.argv)
    with pytest.raises(ConfigError, match="scontrol"):
        _plan({"SLURM_JOB_ID": "9"}, job_record=unavailable)
    with pytest.raises(ConfigError, match="pending"):
        _plan({"SLURM_JOB_ID": "9"}, job_record=lambda j: {"NumNodes": "1", "NodeList": "(null)"})


def test_bad_arguments_are_one_line_errors():
    with pytest.raises(ConfigError, match="no command"):
        plan_launch(read_allocation({}), [])
    with pytest.raises(ConfigError, match="--port"):
        plan_launch(read_allocation({}, gpus_per_node=2), COMMAND, port=70000)
    with pytest.raises(ConfigError, match="gpus-per-node"):
        read_allocation({}, gpus_per_node=-1)
    with pytest.raises(ConfigError, match="not a number"):
        read_allocation({"SLURM_JOB_ID": "1", "SLURM_JOB_NUM_NODES": "two"}, job_record=_no_job_record)


@pytest.mark.parametrize(
    "nodelist, first",
    [("gpu07", "gpu07"), ("gpu[07-08]", "gpu07"), ("gpu[07-08,12],cpu1", "gpu07"), ("n[3,1-2]", "n3"),
     ("rack[1-2]-n[01-04]", "rack1-n01"), ("a1,b[2-3]", "a1"), (" node-x ", "node-x")],
)  # fmt: skip
def test_first_host_of_a_hostlist(nodelist, first):
    # expected values as `scontrol show hostnames` prints them first
    assert first_host(nodelist) == first


@pytest.mark.parametrize("nodelist", ["", "[1-2]", "gpu[", "gpu]", "gpu[a-b]", "gpu[[1]]"])
def test_unreadable_hostlists_are_refused(nodelist):
    with pytest.raises(ConfigError, match="node list"):
        first_host(nodelist)


@pytest.mark.parametrize(
    "value, count",
    [(None, 0), ("", 0), ("NoDevFiles", 0), ("-1", 0), ("0", 1), ("0,1,2,3", 4), ("GPU-1a2b,GPU-3c4d", 2)],
)
def test_visible_gpu_count(value, count):
    assert count_visible_gpus(value) == count


def test_dry_run_prints_the_command(monkeypatch, capsys):
    for name in list(os.environ):
        if name.startswith("SLURM_") or name == "CUDA_VISIBLE_DEVICES":
            monkeypatch.delenv(name)
    assert main(["launch", "--gpus-per-node", "2", "--marker-dir", str(MARKER), "--dry-run", "--", *COMMAND]) == 0
    printed = capsys.readouterr().out.split()
    assert printed == [sys.executable, *AGENT[1:], "--standalone", "--nproc_per_node", "2", *WORKER]
    assert main(["launch", "--dry-run", "--"]) == 2  # no command: one-line error
    assert "no command" in capsys.readouterr().err


# -- real child processes: exit codes and signals --------------------------------------------------

# Each worker says it is ready (handlers installed), then waits for a stop signal and exits 99 as the
# trainer does, or exits at once with the code given for its rank.
WORKER_SCRIPT = textwrap.dedent(
    """
    import os, signal, sys, time
    from pathlib import Path

    out, codes = Path(sys.argv[1]), sys.argv[2].split(",")
    rank = int(os.environ.get("RANK", "0"))
    if codes[rank] != "wait":
        sys.exit(int(codes[rank]))
    signal.signal(signal.SIGUSR1, lambda s, f: sys.exit(99))
    signal.signal(signal.SIGTERM, lambda s, f: sys.exit(99))
    (out / f"ready-{rank}").write_text(str(os.getpid()))
    time.sleep(60)
    sys.exit(5)
    """
)


def _launch(tmp_path: Path, gpus: int, codes: str) -> subprocess.Popen:
    script = tmp_path / "worker.py"
    script.write_text(WORKER_SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") and k != "CUDA_VISIBLE_DEVICES"}
    cmd = [sys.executable, "-m", "pmlm", "launch", "--gpus-per-node", str(gpus), "--",
           str(script), str(tmp_path), codes]  # fmt: skip
    return subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _finish(proc: subprocess.Popen) -> tuple[int, str]:
    out, _ = proc.communicate(timeout=LAUNCH_TIMEOUT_S)
    return proc.returncode, out


def _wait_ready(tmp_path: Path, ranks: int, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + READY_WAIT_S
    while len(list(tmp_path.glob("ready-*"))) < ranks:
        assert proc.poll() is None, _finish(proc)[1]
        assert time.monotonic() < deadline, "workers never became ready"
        time.sleep(0.1)


def test_single_process_exit_code_passes_through(tmp_path):
    code, out = _finish(_launch(tmp_path, 1, "99"))
    assert code == REQUEUE_EXIT_CODE, out
    code, out = _finish(_launch(tmp_path, 1, "3"))
    assert code == 3, out


def test_a_worker_requeue_exit_under_torchrun_becomes_99(tmp_path):
    # torchrun itself reports any failed worker as exit 1
    code, out = _finish(_launch(tmp_path, 2, "0,99"))
    assert code == REQUEUE_EXIT_CODE, out
    assert "exitcode  : 99" in out or "exitcode: 99" in out  # torchrun saw the worker's 99
    assert not list(tmp_path.glob(".pmlm-launch-*")), "marker folder left behind"
    code, out = _finish(_launch(tmp_path, 2, "0,3"))
    assert code == 1, out  # an ordinary failure stays a failure


@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGTERM])
def test_stop_signals_reach_every_worker_and_the_requeue_code_comes_back(tmp_path, sig):
    proc = _launch(tmp_path, 2, "wait,wait")
    _wait_ready(tmp_path, 2, proc)
    proc.send_signal(sig)  # to the launcher only: workers run in sessions of their own under torchrun
    code, out = _finish(proc)
    # a worker exited through its handler (99); had the signal killed the launcher, the code would be 128 + n
    assert code == REQUEUE_EXIT_CODE, out
    if sig == signal.SIGUSR1:
        # torchrun ignored it (USR1's default action is to die) and reported its workers' exits itself
        assert "exitcode  : 99" in out, out
    assert not list(tmp_path.glob(".pmlm-launch-*")), "marker folder left behind"


def test_worker_wrapper_records_a_requeue_exit(tmp_path):
    marker = tmp_path / "markers"
    script = tmp_path / "w.py"
    script.write_text("import sys\nassert sys.argv[1:] == ['a', 'b'], sys.argv\nsys.exit(99)\n")
    wrapper = [sys.executable, "-m", "pmlm.train.launch", "--requeue-marker", str(marker)]
    env = {**os.environ, "RANK": "3"}
    done = subprocess.run([*wrapper, str(script), "a", "b"], capture_output=True, text=True, env=env)
    assert done.returncode == REQUEUE_EXIT_CODE, done.stderr
    assert [p.name.split("-")[:2] for p in marker.iterdir()] == [["requeue", "3"]]
    done = subprocess.run([*wrapper, "-c", "import sys; sys.exit(4)"], capture_output=True, text=True)
    assert done.returncode == 4 and len(list(marker.iterdir())) == 1  # other exits leave no marker
