"""The seams between the workflow and the package, read from the demo's dry run: a file one rule writes and another
reads is an output of the first and an input of the second (the training runs' metrics logs, which the curve rules
read), and the unsupervised read-outs' contact maps have a rule and a wildcard of their own, under the same paths as
before."""

from __future__ import annotations

import re

from conftest import snakemake

from pmlm.train import METRICS_CSV


def dry_run_jobs(*args: str) -> list[dict[str, str]]:
    """Every job of ``snakemake -n --forceall`` as {"rule": name, "input": ..., "output": ..., "wildcards": ...,
    "shell": ...} (the values as the dry run prints them)."""
    proc = snakemake("-n", "-p", "--forceall", "--cores", "2", *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    jobs, job = [], None
    for line in proc.stdout.splitlines():
        start = re.match(r"^(?:local)?rule (\w+):$", line)
        if start:
            job = {"rule": start.group(1)}
            jobs.append(job)
        elif job is not None and (item := re.match(r"^    (input|output|wildcards): (.*)$", line)):
            job[item.group(1)] = item.group(2)
        elif job is not None and line.startswith("Shell command: "):
            job["shell"] = line.removeprefix("Shell command: ")
        elif not line.strip():
            job = None
    return jobs


def _paths(listed: str) -> list[str]:
    return [p.removesuffix(" (update)") for p in listed.split(", ")]


def test_training_rules_declare_the_metrics_logs_the_curves_read():
    jobs = dry_run_jobs()
    for rule, curves in (("pretrain", "plot_pretrain_curves"), ("finetune", "plot_finetune_curves")):
        logs = []
        for job in (j for j in jobs if j["rule"] == rule):
            # the finished run's log, beside the weights or head: what the trainer copies there (--metrics); the run
            # folder's own log, appended to across resumes and requeues, is no output (a failed job keeps its rows)
            log = re.search(r"--metrics (\S+)", job["shell"]).group(1)
            final = re.search(r"--final (\S+)", job["shell"]).group(1)
            run_dir = re.search(r"--out (\S+)", job["shell"]).group(1)
            assert log == final.rsplit("/", 1)[0] + f"/{METRICS_CSV}" and log in _paths(job["output"]), job
            assert not any(p.startswith(run_dir) for p in _paths(job["output"])), job
            logs.append(log)
        (curve,) = [j for j in jobs if j["rule"] == curves]
        assert sorted(_paths(curve["input"])) == sorted(logs)
        assert sorted(re.findall(r"=(\S+?)'? ", curve["shell"] + " ")) == sorted(logs), curve["shell"]


def test_readout_contact_maps_have_their_own_rule_and_the_same_paths():
    jobs = dry_run_jobs()
    readouts = [j for j in jobs if j["rule"] == "plot_readout_contact_maps"]
    runs = [j for j in jobs if j["rule"] == "plot_contact_maps"]
    assert [j["wildcards"] for j in readouts] == ["dataset=demo, objective=pmlm, preset=tiny, readout=pair-kl"]
    assert _paths(readouts[0]["output"]) == [
        "results/demo/figures/contact_maps/demo/pmlm-tiny/unsupervised-pair-kl.png",
        "results/demo/figures/contact_maps/demo/pmlm-tiny/unsupervised-pair-kl.svg",
    ]
    assert "--head pair-kl --encoder results/demo/pretrain/demo/pmlm-tiny/model.safetensors " in readouts[0]["shell"]
    assert sorted(re.search(r"ft=(\w+)", j["wildcards"]).group(1) for j in runs) == ["contact_resnet", "contact_resnet"]
    (unsupervised,) = [j for j in jobs if j["rule"] == "evaluate_unsupervised"]
    assert unsupervised["output"] == "results/demo/evaluation/demo/pmlm-tiny/unsupervised-pair-kl.tsv"
