"""`pmlm launch`: the command it builds from SLURM's environment (1 x 1, 1 x 4, 2 x 4, with and without
the variables the executor strips), the rendezvous port, the timeouts and the environment it hands to every
node, and, with real child processes, the requeue exit code and signal forwarding through torchrun, what each
node and rank says, the one line on a failure, and a collective that times out when a rank hangs."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from pmlm.cli import main
from pmlm.errors import ConfigError
from pmlm.train import COLLECTIVE_TIMEOUT_ENV, REQUEUE_EXIT_CODE
from pmlm.train.allocation import (
    count_visible_gpus,
    expand_hostlist,
    parse_hostlist,
    pick_rendezvous_port,
    read_allocation,
    rendezvous_port,
    scontrol_hostnames,
)
from pmlm.train.launch import LaunchPlan, failure_summary, plan_launch

PY = "python"
MARKER = Path("/shared/run/.pmlm-launch-x")
COMMAND = ["-m", "pmlm", "pretrain", "--config", "base.yaml"]
WORKER = ["-m", "pmlm.train.wrapper", "--requeue-marker", str(MARKER), *COMMAND]
AGENT = [PY, "-m", "pmlm.train.wrapper", "--ignore-usr1", "--node-report", str(MARKER), "-m", "torch.distributed.run",
         "--log-dir", str(MARKER / "torchrun-logs")]  # fmt: skip
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
SRUN_2X4 = ["srun", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--kill-on-bad-exit=1", "--cpus-per-task=32"]
# the port from the job id: 29500 + 4242 mod 2000
TORCHRUN_2X4 = [
    "--nnodes", "2", "--nproc_per_node", "4", "--rdzv_backend", "c10d",
    "--rdzv_endpoint", "gpu07:29742", "--rdzv_id", "4242", "--rdzv_conf", "join_timeout=600", "--max_restarts", "0",
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
    assert plan.argv == ["srun", "--nodes=1", "--ntasks=1", "--ntasks-per-node=1", "--kill-on-bad-exit=1",
                         "--cpus-per-task=8", PY, *COMMAND]  # fmt: skip


def test_four_gpus_on_one_node_use_standalone_torchrun():
    plan = _plan({"CUDA_VISIBLE_DEVICES": "0,1,2,3"})
    assert plan.mode == "torchrun" and plan.marker_dir == MARKER
    assert plan.argv == [*AGENT, "--standalone", "--nproc_per_node", "4", *WORKER]


def test_four_gpus_in_a_batch_job_run_torchrun_in_an_srun_step():
    env = {**BATCH_2X4, "SLURM_JOB_NUM_NODES": "1", "SLURM_JOB_NODELIST": "gpu07"}
    plan = _plan(env)
    assert plan.argv == ["srun", "--nodes=1", "--ntasks=1", *SRUN_2X4[3:], *AGENT, "--standalone", "--nproc_per_node",
                         "4", *WORKER]  # fmt: skip


def test_two_nodes_by_four_gpus_rendezvous_on_the_first_node():
    plan = _plan(BATCH_2X4)
    assert (plan.mode, plan.nodes, plan.procs_per_node, plan.world_size) == ("srun", 2, 4, 8)
    assert plan.argv == [*SRUN_2X4, *AGENT, *TORCHRUN_2X4, *WORKER]
    assert plan.hosts == ["gpu07", "gpu08"] and plan.rendezvous == "gpu07:29742"
    # every node's workers get the collective timeout (the trainer reads it)
    assert plan.env == {COLLECTIVE_TIMEOUT_ENV: "600"}


def test_rendezvous_port_follows_the_job_id_and_timeouts_reach_torchrun():
    # jobs that share a first node meet at different ports; below Linux's ephemeral ports (32768-)
    assert [rendezvous_port(j) for j in ("7", "4242", "2007", "1999", None)] == [29507, 29742, 29507, 31499, 29500]
    alloc = read_allocation(BATCH_2X4, job_record=_no_job_record)
    plan = plan_launch(alloc, COMMAND, port=31000, marker_dir=MARKER, python=PY, join_timeout=45, collective_timeout=30)
    assert "gpu07:31000" in plan.argv and "join_timeout=45" in plan.argv
    assert plan.env == {COLLECTIVE_TIMEOUT_ENV: "30"}
    with pytest.raises(ConfigError, match="--join-timeout"):
        plan_launch(alloc, COMMAND, join_timeout=0)


def test_a_taken_port_on_the_first_node_moves_to_the_next_free_one(monkeypatch):
    import socket

    job = {**BATCH_2X4, "SLURM_JOB_NODELIST": f"{socket.gethostname()},gpu08"}
    alloc = read_allocation(job, job_record=_no_job_record)
    port = rendezvous_port("4242")
    with socket.socket() as busy:  # something listens at the job's port on this (the first) node
        busy.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            busy.bind(("", port))
        except OSError:
            pytest.skip(f"port {port} is in use on this machine already")
        busy.listen()
        chosen, note = pick_rendezvous_port(alloc)
    assert chosen != port and 29500 <= chosen < 31500, (chosen, note)
    assert f"{port} was in use here" in note
    # elsewhere (not the first node) nothing can be probed: the job id's port
    other = read_allocation(BATCH_2X4, job_record=_no_job_record)
    assert pick_rendezvous_port(other) == (port, "from job id 4242")


def test_a_user_batch_script_keeps_one_task_per_node():
    # sbatch --ntasks-per-node=4 exports SLURM_NTASKS=8 to the script; the step asks for one task per node
    # explicitly, or srun would start 8 torchruns and ask for more CPUs than the job has
    plan = _plan({**BATCH_2X4, "SLURM_NTASKS": "8", "SLURM_NTASKS_PER_NODE": "4"})
    assert plan.argv[:4] == ["srun", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1"]


HOSTLISTS = [
    ("gpu07", ["gpu07"]), ("gpu[07-08,12],cpu1", ["gpu07", "gpu08", "gpu12", "cpu1"]), ("n[3,1-2]", ["n3", "n1", "n2"]),
    ("rack[1-2]-n[01-02]", ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]),
    ("pmlm-n[1-3]", ["pmlm-n1", "pmlm-n2", "pmlm-n3"]),
]  # fmt: skip
FIRST_HOSTS = [
    ("gpu07", "gpu07"), ("gpu[07-08]", "gpu07"), ("gpu[07-08,12],cpu1", "gpu07"), ("n[3,1-2]", "n3"),
    ("rack[1-2]-n[01-04]", "rack1-n01"), ("a1,b[2-3]", "a1"), (" node-x ", "node-x"),
]  # fmt: skip
# a configuration scontrol can start from (`scontrol show hostnames` reads it, contacts no controller)
MINIMAL_SLURM_CONF = (
    "ClusterName=pmlm-test\nSlurmctldHost=localhost\nNodeName=localhost\nPartitionName=p Nodes=localhost\n"
)


@pytest.mark.parametrize("nodelist, hosts", HOSTLISTS)
def test_parse_hostlist(nodelist, hosts):
    # the parser expand_hostlist falls back on without scontrol; expected values as `scontrol show hostnames` prints
    # them
    assert parse_hostlist(nodelist) == hosts


@pytest.mark.skipif(shutil.which("scontrol") is None, reason="scontrol is not installed here")
def test_scontrol_and_the_fallback_parser_expand_alike(tmp_path, monkeypatch):
    """expand_hostlist's answer where scontrol runs is SLURM's own, and the fallback parser gives the same hosts.
    scontrol needs a configuration, not a cluster: a minimal one where this host has none."""
    if scontrol_hostnames("n1") is None:
        (tmp_path / "slurm.conf").write_text(MINIMAL_SLURM_CONF)
        monkeypatch.setenv("SLURM_CONF", str(tmp_path / "slurm.conf"))
    lists = [n for n, _ in HOSTLISTS] + [n for n, _ in FIRST_HOSTS] + ["gpu[07-08],cpu[1-3,5]", "x[098-101]"]
    for nodelist in lists:
        by_slurm = scontrol_hostnames(nodelist)
        assert by_slurm is not None, "scontrol show hostnames did not run"
        assert by_slurm == parse_hostlist(nodelist) == expand_hostlist(nodelist), nodelist
    for nodelist in ["", "gpu[", "gpu]", "gpu[a-b]", "gpu[[1]]"]:  # what scontrol says it cannot read, or garbles
        with pytest.raises(ConfigError, match="node list"):
            expand_hostlist(nodelist)


def test_without_scontrol_the_parser_expands_hostlists(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no scontrol
    assert scontrol_hostnames("gpu[07-08]") is None
    assert expand_hostlist("gpu[07-08],cpu1") == ["gpu07", "gpu08", "cpu1"]
    with pytest.raises(ConfigError, match="node list"):
        expand_hostlist("[1-2]")  # the parser's refusal (scontrol reads it as hosts 1 and 2)


def test_failure_summary_names_each_node():
    plan = LaunchPlan("srun", ["srun"], 2, 2, MARKER, ["n1", "n2"], "n1:29501", {})
    line = failure_summary(
        plan,
        137,
        8.4,
        {"n1": "torchrun exited 1: rank 0 exit 2, rank 1 exit 2 after 40 s"},
        ["n2: task 1: Killed", "n1: task 0: Exited with exit code 1"],
    )
    assert "\n" not in line
    assert line == (
        "pmlm launch: error: exit 137 after 8 s on 2 node(s): n1: torchrun exited 1: rank 0 exit 2, "
        "rank 1 exit 2 after 40 s; n2: no report (its processes were killed, or the node was lost, "
        "before torchrun ended); srun: n2: task 1: Killed | n1: task 0: Exited with exit code 1"
    )
    # one process in its srun step (fine-tuning): no torchrun, no node reports to miss; srun's account says it
    single = LaunchPlan("srun", ["srun"], 1, 1, None, ["n1"], None, {})
    assert failure_summary(single, 3, 0.4, {}, ["n1: task 0: Exited with exit code 3"]) == (
        "pmlm launch: error: exit 3 after 0 s on 1 node(s); srun: n1: task 0: Exited with exit code 3"
    )


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
    assert plan.argv[:5] == ["srun", "--nodes=1", "--ntasks=1", "--ntasks-per-node=1", "--kill-on-bad-exit=1"]
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


@pytest.mark.parametrize("nodelist, first", FIRST_HOSTS)
def test_first_host_of_a_hostlist(nodelist, first):
    # expected values as `scontrol show hostnames` prints them first: the rendezvous host of a multi-node launch
    assert parse_hostlist(nodelist)[0] == first


@pytest.mark.parametrize("nodelist", ["", "[1-2]", "gpu[", "gpu]", "gpu[a-b]", "gpu[[1]]"])
def test_unreadable_hostlists_are_refused(nodelist):
    with pytest.raises(ConfigError, match="node list"):
        parse_hostlist(nodelist)


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
    assert main(["launch", "--env", "NO_EQUALS", "--dry-run", "--", *COMMAND]) == 2
    assert "--env expects NAME=VALUE" in capsys.readouterr().err
    monkeypatch.setenv("PMLM_JOIN_TIMEOUT", "soon")
    assert main(["launch", "--gpus-per-node", "2", "--dry-run", "--", *COMMAND]) == 2
    assert "PMLM_JOIN_TIMEOUT must be a whole number of seconds" in capsys.readouterr().err


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
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("SLURM_") and k not in ("CUDA_VISIBLE_DEVICES", "PET_LOG_DIR")
    }
    # a system temporary folder of its own, where a torchrun without a log folder would leave torchelastic_*
    (tmp_path / "systemp").mkdir(exist_ok=True)
    env["TMPDIR"] = str(tmp_path / "systemp")
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
    # torchrun saw the worker's 99, and the node's wrapper says so in one line instead of torchrun's traceback
    assert re.search(r"^pmlm launch: node \S+: torchrun exited 1: .*rank 1 exit 99 \(requeue\)", out, re.M), out
    assert "Traceback" not in out, out
    assert not list(tmp_path.glob(".pmlm-launch-*")), "marker folder left behind"
    assert not list((tmp_path / "systemp").iterdir()), "torchrun's log folder left in the temporary folder"
    code, out = _finish(_launch(tmp_path, 2, "0,3"))
    assert code == 1, out  # an ordinary failure stays a failure, said in one line at the end
    host = socket.gethostname()
    assert re.search(
        rf"^pmlm launch: error: exit 1 after \d+ s on 1 node\(s\): {re.escape(host)}: torchrun exited 1: "
        r".*rank 1 exit 3 after \d+ s$",
        out,
        re.M,
    ), out
    # each worker says which rank runs where
    for rank in (0, 1):
        assert re.search(rf"^pmlm launch: rank {rank} of 2 \(local rank {rank}\) on {re.escape(host)} ", out, re.M), out


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
        assert re.search(r"^pmlm launch: node \S+: torchrun exited 1: .*exit 99 \(requeue\)", out, re.M), out
    assert not list(tmp_path.glob(".pmlm-launch-*")), "marker folder left behind"
    assert not list((tmp_path / "systemp").iterdir()), "torchrun's log folder left in the temporary folder"


def test_worker_wrapper_records_a_requeue_exit(tmp_path):
    marker = tmp_path / "markers"
    script = tmp_path / "w.py"
    script.write_text("import sys\nassert sys.argv[1:] == ['a', 'b'], sys.argv\nsys.exit(99)\n")
    wrapper = [sys.executable, "-m", "pmlm.train.wrapper", "--requeue-marker", str(marker)]
    env = {**os.environ, "RANK": "3"}
    done = subprocess.run([*wrapper, str(script), "a", "b"], capture_output=True, text=True, env=env)
    assert done.returncode == REQUEUE_EXIT_CODE, done.stderr
    assert [p.name.split("-")[:2] for p in marker.iterdir()] == [["requeue", "3"]]
    done = subprocess.run([*wrapper, "-c", "import sys; sys.exit(4)"], capture_output=True, text=True)
    assert done.returncode == 4 and len(list(marker.iterdir())) == 1  # other exits leave no marker


# -- a rank that hangs: the collective timeout ends the run, in one line ---------------------------------------

HANG_TIMEOUT_S = 4


@pytest.mark.slow
def test_a_hung_rank_fails_the_run_after_the_collective_timeout(shard_dir, tmp_path):
    """The trainer under `pmlm launch --collective-timeout`: one of two ranks is stopped (SIGSTOP, as a hung node);
    the other gives up after the timeout with one line naming the step and the intact last checkpoint, instead of
    waiting in its all-reduce for good (torch's own default is 30 minutes)."""
    cfg = {
        "model": {"preset": "tiny", "overrides": {"num_layers": 1, "hidden": 32, "ffn": 64, "heads": 2, "max_len": 64}},
        "optim": {"lr": 1e-3, "warmup_steps": 1, "total_steps": 100000},
        "tokens_per_step": 256, "data": {"buffer_rows": 32, "num_workers": 0},
        "log_every": 1, "eval_every": 0, "save_every": 5, "tensorboard": False, "device": "cpu",
    }  # fmt: skip
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    out_dir, log = tmp_path / "run", tmp_path / "launch.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") and k != "CUDA_VISIBLE_DEVICES"}
    env["OMP_NUM_THREADS"] = "1"
    cmd = [sys.executable, "-m", "pmlm", "launch", "--gpus-per-node", "2", "--collective-timeout", str(HANG_TIMEOUT_S),
           "--", "-m", "pmlm", "pretrain", "--config", str(tmp_path / "cfg.yaml"), "--shards", str(shard_dir),
           "--out", str(out_dir), "--final", str(tmp_path / "final" / "model.safetensors")]  # fmt: skip
    with log.open("w") as fh:
        proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=fh, stderr=subprocess.STDOUT)
    stopped = None
    try:
        deadline = time.monotonic() + READY_WAIT_S
        while not (out_dir / "checkpoints" / "step-5").is_dir():  # training is under way, a checkpoint written
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        pids = dict(re.findall(r"^pmlm launch: rank (\d) of 2 .*, pid (\d+);", log.read_text(), re.M))
        stopped = int(pids["1"])
        os.kill(stopped, signal.SIGSTOP)
        started = time.monotonic()
        lost = re.compile(
            r"^pmlm pretrain: error: rank 0 on \S+ lost the other ranks at step (\d+) \((.*)\); "
            r"last checkpoint: (\S+), rerun to resume from it$",
            re.M,
        )
        while not lost.search(log.read_text()):
            assert proc.poll() is None and time.monotonic() < started + LAUNCH_TIMEOUT_S, log.read_text()
            time.sleep(0.1)
        print(
            f"rank 1 stopped -> rank 0 gave up after {time.monotonic() - started:.1f} s "
            f"(collective timeout {HANG_TIMEOUT_S} s)"
        )
    finally:
        if stopped is not None:
            os.kill(stopped, signal.SIGCONT)  # so that it can be torn down
        code = proc.wait(timeout=LAUNCH_TIMEOUT_S)
    text = log.read_text()
    step, reason, checkpoint = lost.search(text).groups()
    # gloo's own timeout (the waits above are far shorter than its default of 600 s): the operation that waited,
    # or, when another was first to notice, the pair it closed
    assert re.search(rf"Timed out waiting {HANG_TIMEOUT_S * 1000}ms|timeout caused pair closure", reason), reason
    assert Path(checkpoint).parent == out_dir / "checkpoints" and int(step) > int(Path(checkpoint).name[5:])
    assert code not in (0, REQUEUE_EXIT_CODE), text
    assert re.search(r"^pmlm launch: error: exit \d+ after \d+ s on 1 node\(s\): ", text, re.M), text
    assert "Traceback" not in text, text
