"""Pre-training on two nodes of a real SLURM cluster, started as a user starts it.

``multinode_cluster`` (tests/slurm/cluster.sh with PMLM_SLURM_NODES=3) runs three nodes pmlm-n1..3, each a
slurmd in a network namespace of its own, with its own host name and address on a bridge (10.199.77.11-13),
and the controller and accounting daemon on the host (tests/slurm/README.md). Snakemake runs from the
repository root with `--profile slurm`, the cluster's partition and account on the command line, and `pretrain`
resources asking for two nodes: the profile's own two-node block, with two (fake) GPUs per node on this small
machine and, in `launch_env`, the nodes' interface and shorter timeouts. Each pre-training job thus runs one
torchrun per node and two trainers on each: world size 4, gloo over the bridge.

- the trainers run on two nodes (rank -> host in the log) and meet at the first node's address;
- the model after 20 steps on two nodes is the model after 20 steps of four trainers on one node;
- two two-node jobs at once on overlapping nodes meet at different ports and train the same model;
- SIGTERM to every process of a job on every node (SLURM's preemption with requeue, `scontrol requeue`): the
  trainers save, SLURM requeues the job, it resumes on another pair of nodes and ends with the weights of the
  uninterrupted run;
- one node's processes killed: the job fails within a bound with one line naming that node, leaves no process
  behind, and its resubmission resumes from the last checkpoint and ends with the uninterrupted run's weights.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest
import yaml
from conftest import reorder_tolerance
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parent / "slurm"))
from local_cluster import (
    FAST_STATUS,
    MULTINODE_INTERFACE,
    MULTINODE_NODES,
    MULTINODE_SUBNET,
    REPO,
    SITE_PROFILE,
    LocalCluster,
    cluster_default_resources,
    cluster_set_resources,
    multinode_cluster,  # noqa: F401  (module-scoped fixture)
    node_job_pids,
    release,
    scontrol_job,
    snakemake_command,
    snakemake_env,
    submissions,
    tail,
)
from workflow_rules import commented_block

from pmlm.train.allocation import PORT_BASE, PORT_SPAN, expand_hostlist

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

RESULTS = "results/demo"
GPUS_PER_NODE = 2  # trainers per node: two nodes x two = world size 4 on this 2-core machine
WORLD = 2 * GPUS_PER_NODE
STEPS, SAVE_EVERY = 20, 10
JOIN_TIMEOUT_S = COLLECTIVE_TIMEOUT_S = 120
# The demo's data, made locally (its SLURM jobs are test_slurm_workflow's); decontamination off as there.
DATA = {"datasets": {"demo": {"sources": ["uniprot_sample"], "decontaminate": []}}}
SET = {"optim.total_steps": STEPS, "optim.warmup_steps": 5, "eval_every": 100, "save_every": SAVE_EVERY,
       "eval_batches": 2, "tokens_per_step": 4096}  # fmt: skip
RECIPE = "config/train/tiny.yaml"
# Four encoders trained alike under names of their own: PLAIN and TWIN at once (the first run), STOPPED
# (SIGTERM, requeue) and KILLED (one node's processes killed) at once (the second run).
PLAIN, TWIN, STOPPED, KILLED = "tiny", "tiny_twin", "tiny_stopped", "tiny_killed"

# bounds against a hang only: a job of 20 steps takes one to two minutes here; the profile's status queries come
# 40 s after a submission, then 50 s, 60 s ... later
DATA_TIMEOUT_S = 300
RUN_TIMEOUT_S = 600
WAIT_S = 300
POLL_S = 0.5
# A killed node's job ends this soon: its peers see their connections to it closed at once, srun
# (--kill-on-bad-exit) ends the step, and SLURM gives what is left of it KillWait (30 s) before SIGKILL.
NODE_FAILURE_BOUND_S = 60

JOB_LINE = re.compile(r"^pmlm launch: job (\d+): (\d+) node\(s\) (\S+) \(([^)]*)\) x (\d+) process\(es\) "
                      r"= world size (\d+);", re.M)  # fmt: skip
RDZV_LINE = re.compile(r"^pmlm launch: rendezvous c10d at (\S+):(\d+) \(([^)]*)\), join timeout (\d+) s; "
                       r"collective timeout (\d+) s; (.*)$", re.M)  # fmt: skip
NODE_LINE = re.compile(r"^pmlm launch: node (\S+) \((\S+)\): torchrun for (\d+) process\(es\); "
                       r"rendezvous (\S+):(\d+) = (\S+?)(, hosted here)?$", re.M)  # fmt: skip
RANK_LINE = re.compile(r"^pmlm launch: rank (\d+) of (\d+) \(local rank (\d+)\) on (\S+) \((\S+)\), pid \d+; "
                       r"process group via (\S+):(\d+)$", re.M)  # fmt: skip
RESUMED = re.compile(r"^pmlm pretrain: resuming from (\S+)/checkpoints/step-(\d+) \(step (\d+)\)", re.M)


def _node_address(node: str) -> str:
    return f"{MULTINODE_SUBNET}.{10 + MULTINODE_NODES.index(node) + 1}"


def _two_node_block() -> dict:
    """The profile's commented two-node `pretrain` block, uncommented as the profile says."""
    return yaml.safe_load(commented_block(SITE_PROFILE / "config.yaml", "  #   pretrain:"))["pretrain"]


# The site's two-node block with this cluster's GPUs per node, and the nodes' interface and timeouts passed
# through the profile (launch_env), as a site would for its fabric.
TWO_NODES = {
    **_two_node_block(),
    "gres": f"gpu:{GPUS_PER_NODE}",
    "tasks_per_node": GPUS_PER_NODE,
    "launch_env": f"'GLOO_SOCKET_IFNAME={MULTINODE_INTERFACE} PMLM_JOIN_TIMEOUT={JOIN_TIMEOUT_S} "
    f"PMLM_COLLECTIVE_TIMEOUT={COLLECTIVE_TIMEOUT_S}'",
}


def _pretrain_config(*presets: str) -> dict:
    return {"pretrain": {"recipes": dict.fromkeys(presets, RECIPE),
                         "models": [{"dataset": "demo", "objective": "pmlm", "preset": p} for p in presets],
                         "set": SET}}  # fmt: skip


def _write_yaml(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


def _weights(preset: str) -> str:
    return f"{RESULTS}/pretrain/demo/pmlm-{preset}/model.safetensors"


def _run_dir(preset: str) -> str:
    return f"{RESULTS}/pretrain_runs/demo/pmlm-{preset}"


def _rule_log(workdir: Path, preset: str) -> Path:
    return workdir / "logs" / "demo" / "pretrain" / "demo" / f"pmlm-{preset}.log"


def _rule_log_so_far(workdir: Path, preset: str) -> str:
    """The rule log's text while a job runs, "" while there is none: Snakemake removes a rule's log before the job
    runs it again, so a requeued job's log is missing for a moment when it starts."""
    try:
        return _rule_log(workdir, preset).read_text()
    except FileNotFoundError:
        return ""


def _snakemake_args(workdir: Path, configfiles: list[Path], *targets: str) -> list[str]:
    """`snakemake --profile slurm` from the repository root, with the cluster's partition and account, and the
    `pretrain` resources asking for two nodes."""
    return [
        "--profile", "slurm",
        "--default-resources", *cluster_default_resources(),
        "--set-resources", *cluster_set_resources(pretrain=TWO_NODES),
        *FAST_STATUS,
        "--directory", str(workdir),
        "--configfile", str(REPO / "config" / "config.yaml"), *map(str, configfiles),
        "--verbose",  # logs each sbatch call
        *targets,
    ]  # fmt: skip


def _max_difference(a: Path, b: Path) -> float:
    wa, wb = load_file(a), load_file(b)
    assert wa.keys() == wb.keys()
    return max(float((wa[k].double() - wb[k].double()).abs().max()) for k in wa)


def _wait_for(condition, what: str, timeout_s: float = WAIT_S, process: subprocess.Popen | None = None):
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if process is not None and process.poll() is not None:
            raise AssertionError(f"snakemake ended (exit {process.returncode}) while waiting for {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} after {timeout_s} s")
        time.sleep(POLL_S)


def _squeue_job(comment_prefix: str) -> str | None:
    out = subprocess.run(["squeue", "-h", "-t", "RUNNING", "-o", "%i %k"], capture_output=True, text=True,
                         check=True).stdout  # fmt: skip
    ids = [
        row.split()[0] for row in out.splitlines() if len(row.split()) > 1 and row.split()[1].startswith(comment_prefix)
    ]
    return ids[0] if len(ids) == 1 else None


def _job_state(job_id: str) -> str:
    return scontrol_job(job_id).get("JobState", "")


def _epoch(stamp: str) -> float:
    return datetime.fromisoformat(stamp).timestamp()  # SLURM's records: local time


def _checkpoints(run_dir: Path) -> list[int]:
    return sorted(int(p.name[5:]) for p in run_dir.glob("checkpoints/step-*") if re.fullmatch(r"step-\d+", p.name))


def _launch(log: str) -> dict:
    """What `pmlm launch` said at the start of a job: its nodes, rendezvous, each node's and each rank's line."""
    job, rdzv = JOB_LINE.search(log), RDZV_LINE.search(log)
    assert job and rdzv, log[:3000]
    return {
        "job": job.group(1), "nodes": job.group(4).split(", "), "world": int(job.group(6)),
        "procs": int(job.group(5)), "host": rdzv.group(1), "port": int(rdzv.group(2)), "port_note": rdzv.group(3),
        "join_timeout": int(rdzv.group(4)), "collective_timeout": int(rdzv.group(5)), "network": rdzv.group(6),
        "node_lines": NODE_LINE.findall(log), "ranks": RANK_LINE.findall(log),
    }  # fmt: skip


# -- the work folder and the first run: two two-node jobs at once ------------------------------------------------


@pytest.fixture(scope="module")
def site(multinode_cluster: LocalCluster, tmp_path_factory):
    """The work folder with the demo's shards, made on this host."""
    root = tmp_path_factory.mktemp("multinode")
    workdir = root / "work"
    data = _write_yaml(root / "data.yaml", DATA)
    args = ["--cores", "2", "--directory", str(workdir), "--configfile", str(REPO / "config" / "config.yaml"),
            str(data), "--", f"{RESULTS}/data/demo/shards"]  # fmt: skip
    done = subprocess.run(snakemake_command(args, DATA_TIMEOUT_S), cwd=REPO, capture_output=True, text=True,
                          env=snakemake_env())  # fmt: skip
    assert done.returncode == 0, tail(done.stdout + done.stderr)
    return root, workdir, data


@pytest.fixture(scope="module")
def first_run(site, multinode_cluster: LocalCluster):
    """PLAIN and TWIN, two two-node jobs submitted together, through the executor."""
    root, workdir, data = site
    config = _write_yaml(root / "first.yaml", _pretrain_config(PLAIN, TWIN))
    started = time.monotonic()
    result = subprocess.run(
        snakemake_command(_snakemake_args(workdir, [data, config], _weights(PLAIN), _weights(TWIN)), RUN_TIMEOUT_S),
        cwd=REPO, capture_output=True, text=True, env=snakemake_env(),
    )  # fmt: skip
    print(f"two two-node pre-training jobs through SLURM: {time.monotonic() - started:.0f} s")
    log = result.stdout + result.stderr
    assert result.returncode == 0, (
        f"snakemake exited {result.returncode} (124: timed out)\n{tail(log)}\n{multinode_cluster.log_tails()}"
    )
    jobs = {job.job_id: job for job in submissions(log) if job.rule == "pretrain"}
    return workdir, log, jobs


def test_trainers_run_on_two_nodes_and_meet_at_the_first(first_run, multinode_cluster: LocalCluster):
    workdir, log, jobs = first_run
    assert "Using profiles slurm and workflow specific profile" in log and "command=sacct" in log
    assert len(jobs) == 2, jobs  # one job each, none resubmitted
    for job in jobs.values():
        # the profile's two-node block reached sbatch
        for option in ("--nodes=2", f"--ntasks-per-node={GPUS_PER_NODE}", "--signal=USR1@600", "--requeue"):
            assert option in job.sbatch, (option, job.sbatch)
        record = multinode_cluster.jobcomp_record(job.job_id)
        assert record["JobState"] == "COMPLETED" and record["NodeCnt"] == "2", record
        assert f"gres/gpu={WORLD}" in record["Tres"], record

    for preset in (PLAIN, TWIN):
        rule_log = _rule_log(workdir, preset).read_text()
        launch = _launch(rule_log)
        record = multinode_cluster.jobcomp_record(launch["job"])
        nodes = expand_hostlist(record["NodeList"])
        assert launch["nodes"] == nodes and set(nodes) <= set(MULTINODE_NODES), (launch, record)
        assert (launch["world"], launch["procs"]) == (WORLD, GPUS_PER_NODE)
        # the rendezvous: on the first node, at its bridge address, at the port of the job id
        assert launch["host"] == nodes[0]
        assert launch["port"] == PORT_BASE + int(launch["job"]) % PORT_SPAN, launch
        assert f"GLOO_SOCKET_IFNAME={MULTINODE_INTERFACE}" in launch["network"], launch["network"]
        assert (launch["join_timeout"], launch["collective_timeout"]) == (JOIN_TIMEOUT_S, COLLECTIVE_TIMEOUT_S)
        node_lines = {line[0]: line for line in launch["node_lines"]}
        assert sorted(node_lines) == sorted(nodes), launch["node_lines"]
        for node, (_, address, procs, host, port, host_address, hosted) in node_lines.items():
            assert address == _node_address(node) and procs == str(GPUS_PER_NODE)
            assert (host, int(port), host_address) == (nodes[0], launch["port"], _node_address(nodes[0]))
            assert not host_address.startswith("127.")  # not localhost
            assert bool(hosted) == (node == nodes[0])
        # rank -> host: four ranks, two on each node, each at its node's address
        ranks = {int(r[0]): r for r in launch["ranks"]}
        assert sorted(ranks) == list(range(WORLD)), launch["ranks"]
        for rank, (_, world, _local, host, address, master, _) in ranks.items():
            assert int(world) == WORLD and host in nodes and address == _node_address(host), ranks[rank]
            assert master in nodes  # the process group's store: on the node of rank 0, by name
        assert sorted(r[3] for r in ranks.values()) == sorted(nodes * GPUS_PER_NODE)
        assert ranks[0][5] == ranks[0][3]
        steps = [int(s) for s in re.findall(rf"^pmlm pretrain: (\d+)/{STEPS} steps", rule_log, re.M)]
        assert steps == [STEPS // 10 * k for k in range(1, 11)], rule_log[-3000:]  # a line per tenth of the run
        assert (workdir / _weights(preset)).stat().st_size > 0


def test_two_jobs_on_shared_nodes_meet_at_different_ports(first_run, multinode_cluster: LocalCluster):
    workdir, _, _ = first_run
    plain, twin = (_launch(_rule_log(workdir, p).read_text()) for p in (PLAIN, TWIN))
    records = [multinode_cluster.jobcomp_record(launch["job"]) for launch in (plain, twin)]
    spans = [(_epoch(r["StartTime"]), _epoch(r["EndTime"])) for r in records]
    print(
        f"jobs {plain['job']} on {records[0]['NodeList']} {records[0]['StartTime']}-{records[0]['EndTime']}, "
        f"{twin['job']} on {records[1]['NodeList']} {records[1]['StartTime']}-{records[1]['EndTime']}; "
        f"rendezvous {plain['host']}:{plain['port']} and {twin['host']}:{twin['port']}"
    )
    # at the same time, on overlapping nodes (two two-node jobs on three nodes always share one)
    assert spans[0][0] < spans[1][1] and spans[1][0] < spans[0][1], spans
    assert set(plain["nodes"]) & set(twin["nodes"])
    # each job its own rendezvous (on a shared first node, a shared port would have one job join the other's store)
    assert (plain["host"], plain["port"]) != (twin["host"], twin["port"])
    assert plain["port"] != twin["port"]
    # and each trained its own copy of the same run: identical weights
    assert _max_difference(workdir / _weights(PLAIN), workdir / _weights(TWIN)) == 0.0


def test_two_nodes_train_the_one_node_model(first_run, site):
    """The same global batch (four trainers) on one node, here, outside SLURM: rank r reads the same data, draws
    the same masks and dropout on either, so only the order of the cross-rank gradient sums could differ."""
    workdir, _, _ = first_run
    root = site[0]
    out = root / "one-node"
    env = {k: v for k, v in snakemake_env().items() if not k.startswith("SLURM_") and k != "CUDA_VISIBLE_DEVICES"}
    env["OMP_NUM_THREADS"] = "1"  # as the rule runs its trainers
    sets = [arg for key, value in {"objective.name": "pmlm", **SET}.items() for arg in ("--set", f"{key}={value}")]
    cmd = [sys.executable, "-m", "pmlm", "launch", "--gpus-per-node", str(WORLD), "--", "-m", "pmlm", "pretrain",
           "--config", str(REPO / RECIPE), "--shards", str(workdir / RESULTS / "data" / "demo" / "shards"),
           "--out", str(out), "--final", str(out / "final" / "model.safetensors"), *sets]  # fmt: skip
    done = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert done.returncode == 0, tail(done.stderr)
    two, one = load_file(workdir / _weights(PLAIN)), load_file(out / "final" / "model.safetensors")
    assert two.keys() == one.keys()
    # each gradient element is a sum over the 4 ranks; a different order of those fp32 additions would move it
    # by reorder_tolerance (8 sqrt(n) eps |largest|); gloo sums in an order fixed by the ranks, not their hosts
    worst = {k: float((two[k].double() - one[k].double()).abs().max()) for k in two}
    tolerance = {k: reorder_tolerance(one[k], n_terms=WORLD) for k in one}
    print(
        f"2 nodes x {GPUS_PER_NODE} vs 1 node x {WORLD}, {STEPS} steps: max |difference| {max(worst.values()):.3g} "
        f"over {len(two)} tensors (tolerance {min(tolerance.values()):.3g} to {max(tolerance.values()):.3g})"
    )
    assert all(worst[k] <= tolerance[k] for k in two), {k: (worst[k], tolerance[k]) for k in two if worst[k]}


# -- the second run: one job stopped by SIGTERM and requeued, one losing a node ----------------------------------


@pytest.fixture(scope="module")
def second_run(first_run, site, multinode_cluster: LocalCluster):
    """STOPPED and KILLED at once. When both have their first checkpoint: every process of KILLED on its second
    node (not the one running its batch script) is killed; STOPPED's first node is drained and the job requeued
    (SIGTERM to all its processes on every node). Returns what was seen, with times (time.time())."""
    root, workdir, data = site
    config = _write_yaml(root / "second.yaml", _pretrain_config(STOPPED, KILLED))
    out_path = root / "second.out"
    seen: dict = {"start": time.time()}
    drained = None
    with out_path.open("w") as out:
        snakemake = subprocess.Popen(
            snakemake_command(_snakemake_args(workdir, [data, config], _weights(STOPPED), _weights(KILLED)),
                              RUN_TIMEOUT_S),
            cwd=REPO, stdout=out, stderr=subprocess.STDOUT, text=True, env=snakemake_env(),
        )  # fmt: skip
        try:
            runs = {p: workdir / _run_dir(p) for p in (STOPPED, KILLED)}
            _wait_for(lambda: all(_checkpoints(d) for d in runs.values()), "first checkpoints", process=snakemake)
            jobs = {p: _wait_for(lambda p=p: _squeue_job(f"rule_pretrain_wildcards_demo_pmlm_{p}"), f"{p}'s job")
                    for p in runs}  # fmt: skip
            seen["jobs"] = jobs
            seen["nodes"] = {p: expand_hostlist(scontrol_job(j)["NodeList"]) for p, j in jobs.items()}

            # one node's processes killed: every process of the job on the node that does not run its batch script
            victim = seen["victim"] = seen["nodes"][KILLED][1]
            seen["checkpoints_at_kill"] = _checkpoints(runs[KILLED])
            pids = node_job_pids(victim, jobs[KILLED])
            assert pids, f"no process of job {jobs[KILLED]} on {victim}"
            seen["kill"] = time.time()
            for pid in pids:
                os.kill(pid, signal.SIGKILL)

            # SIGTERM to every process of the other job on every node, as SLURM's preemption with requeue sends it;
            # its first node drained, so that it resumes on another set of nodes
            drained = seen["drained"] = seen["nodes"][STOPPED][0]
            subprocess.run(["scontrol", "update", f"nodename={drained}", "state=drain", "reason=pmlm-test"],
                           check=True, capture_output=True)  # fmt: skip
            seen["checkpoints_at_term"] = _checkpoints(runs[STOPPED])
            seen["term"] = time.time()
            subprocess.run(["scontrol", "requeue", jobs[STOPPED]], check=True, capture_output=True, text=True)

            # the killed job: over, with one line saying why (read now: its resubmission starts the rule log anew)
            failed = re.compile(r"^pmlm launch: error: .*$", re.M)
            seen["kill_reason"] = _wait_for(lambda: failed.search(_rule_log_so_far(workdir, KILLED)),
                                            "failure line", process=snakemake).group(0)  # fmt: skip
            seen["kill_reason_seen"] = time.time()
            seen["kill_log"] = _rule_log(workdir, KILLED).read_text()
            _wait_for(lambda: _job_state(jobs[KILLED]) not in ("RUNNING", "COMPLETING"), "end of the killed job")
            seen["kill_ended"] = time.time()
            seen["left_behind"] = {node: node_job_pids(node, jobs[KILLED]) for node in MULTINODE_NODES}

            # the requeued job: pending again once its trainers saved and left
            _wait_for(lambda: _job_state(jobs[STOPPED]) == "PENDING", "requeued job pending", process=snakemake)
            seen["term_pending"] = time.time()
            seen["term_log"] = _rule_log(workdir, STOPPED).read_text()
            seen["term_checkpoints"] = _checkpoints(runs[STOPPED])
            # SLURM holds a requeued job back for two minutes (its BeginTime); let it start in seconds instead
            release(jobs[STOPPED])
            seen["term_released"] = time.time()
            _wait_for(lambda: RESUMED.search(_rule_log_so_far(workdir, STOPPED)), "resume", process=snakemake)
            seen["term_resumed"] = time.time()
        finally:
            returncode = snakemake.wait()
            seen["end"] = time.time()
            if drained:
                subprocess.run(["scontrol", "update", f"nodename={drained}", "state=resume"], capture_output=True)
    log = out_path.read_text()
    assert returncode == 0, (
        f"snakemake exited {returncode} (124: timed out)\n{tail(log)}\n{multinode_cluster.log_tails()}"
    )
    seen["submissions"] = [job for job in submissions(log) if job.rule == "pretrain"]
    return workdir, seen


def test_sigterm_on_every_node_requeues_and_resumes_elsewhere(second_run, first_run, multinode_cluster: LocalCluster):
    workdir, seen = second_run
    job = seen["jobs"][STOPPED]
    first_nodes = seen["nodes"][STOPPED]
    # SLURM requeued the job itself: Snakemake submitted it once and kept waiting for it
    assert [j.job_id for j in seen["submissions"] if STOPPED in str(j.log) or j.job_id == job].count(job) == 1
    record = scontrol_job(job)
    assert record["JobState"] == "COMPLETED" and record["Restarts"] == "1", record
    # on another set of nodes: the drained first node was not among them
    second_nodes = expand_hostlist(record["NodeList"])
    assert seen["drained"] not in second_nodes and second_nodes != first_nodes, (first_nodes, second_nodes)

    # before the restart: SIGTERM reached the trainers on every node, which saved a checkpoint and asked for a requeue
    before = seen["term_log"]
    # (the trainer names the signal it saw last: slurmd's SIGTERM, or the SIGUSR1 the launcher, SIGTERMed in the
    # batch step, passes to srun so that srun relays it instead of killing the step)
    saved = re.search(
        r"^pmlm pretrain: SIG(?:TERM|USR1) received; saved checkpoint at step (\d+); exiting with 99", before, re.M
    )
    assert saved, before[-3000:]
    for node in first_nodes:
        assert re.search(rf"^pmlm launch: node {node}: torchrun stopped by SIGTERM", before, re.M), before[-3000:]
    assert int(saved.group(1)) in seen["term_checkpoints"] and max(seen["term_checkpoints"]) == int(saved.group(1))

    # after: the job's second run met on its new first node and resumed from that checkpoint
    after = _rule_log(workdir, STOPPED).read_text()
    launch = _launch(after)
    assert launch["job"] == job and launch["nodes"] == second_nodes and launch["host"] == second_nodes[0]
    resumed = RESUMED.search(after)
    assert resumed.group(1) == _run_dir(STOPPED) and resumed.group(2) == resumed.group(3) == saved.group(1)
    # and ended where the uninterrupted run ended
    assert _max_difference(workdir / _weights(STOPPED), workdir / _weights(PLAIN)) == 0.0
    end = _epoch(record["EndTime"])
    print(
        f"SIGTERM timeline (job {job}, {','.join(first_nodes)} -> {','.join(second_nodes)}): requeue sent at 0 s; "
        f"checkpoint at step {saved.group(1)} and job pending again at {seen['term_pending'] - seen['term']:.1f} s; "
        f"released (StartTime=now) at {seen['term_released'] - seen['term']:.1f} s; resumed at "
        f"{seen['term_resumed'] - seen['term']:.1f} s; finished at {end - seen['term']:.0f} s; snakemake done at "
        f"{seen['end'] - seen['term']:.0f} s"
    )


def test_a_killed_node_fails_the_job_in_bounded_time_and_the_retry_resumes(
    second_run, first_run, multinode_cluster: LocalCluster
):
    workdir, seen = second_run
    job, victim = seen["jobs"][KILLED], seen["victim"]
    record = multinode_cluster.jobcomp_record(job)
    assert record["JobState"] == "FAILED", record
    ended = _epoch(record["EndTime"])
    assert ended - seen["kill"] <= NODE_FAILURE_BOUND_S, (record["EndTime"], seen["kill"])
    # nothing of it was left running on any node
    assert seen["left_behind"] == {node: [] for node in MULTINODE_NODES}, seen["left_behind"]
    # one line says which node failed
    reason = seen["kill_reason"]
    assert re.search(rf"{victim}: no report \(its processes were killed, or the node was lost", reason), reason
    assert re.search(rf"srun: .*{victim}: task \d+: Killed", reason), reason

    # Snakemake resubmitted it; the new job resumed from the checkpoint that was the last one at the kill
    retries = [j for j in seen["submissions"] if j.job_id != job and j.job_id != seen["jobs"][STOPPED]]
    assert len(retries) == 1, seen["submissions"]
    after = _rule_log(workdir, KILLED).read_text()
    resumed = RESUMED.search(after)
    assert resumed and resumed.group(1) == _run_dir(KILLED), after[-3000:]
    assert int(resumed.group(3)) == max(seen["checkpoints_at_kill"]), (resumed.group(0), seen["checkpoints_at_kill"])
    assert _launch(after)["job"] == retries[0].job_id
    assert multinode_cluster.jobcomp_record(retries[0].job_id)["JobState"] == "COMPLETED"
    assert _max_difference(workdir / _weights(KILLED), workdir / _weights(PLAIN)) == 0.0
    retry = multinode_cluster.jobcomp_record(retries[0].job_id)
    print(
        f"node failure timeline (job {job}, processes on {victim} killed at 0 s): one-line reason in the rule log at "
        f"{seen['kill_reason_seen'] - seen['kill']:.1f} s; job ended (FAILED, by SLURM's record) at "
        f"{ended - seen['kill']:.0f} s; resubmitted job {retries[0].job_id} started at "
        f"{_epoch(retry['StartTime']) - seen['kill']:.0f} s on {retry['NodeList']}, resumed from step "
        f"{resumed.group(3)}, finished at {_epoch(retry['EndTime']) - seen['kill']:.0f} s; reason: {reason}"
    )
