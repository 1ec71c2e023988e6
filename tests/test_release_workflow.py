"""A released encoder in the workflow: config/released.yaml's plan, and that DAG run for real on the tiny fixture of
tests/data/released served from a loopback HTTP server (fetch -> import -> fine-tune -> evaluate -> tables)."""

from __future__ import annotations

import hashlib
import json
import shutil

import pandas as pd
import pytest
import yaml
from archives import tar_bytes
from conftest import RELEASED_FIXTURE, REPO, job_counts, snakemake
from loopback_servers import static_http_server
from tiny_models import demo_chains

FIXTURE = RELEASED_FIXTURE / "pmlm_tiny.pt"


def test_released_config_plans_fetch_import_finetune_evaluate_tables():
    proc = snakemake("-n", "-p", "--configfile", "config/released.yaml")
    assert proc.returncode == 0, proc.stderr
    counts = job_counts(proc.stdout)
    assert "pretrain" not in counts and "ingest_sequences" not in counts  # no pre-training, no sequence data
    assert counts["import_release"] == 1 and counts["fetch_source"] == 4  # the checkpoint and TAPE's three archives
    assert counts["finetune"] == 4 and counts["evaluate"] == 4 and counts["evaluate_unsupervised"] == 1
    assert counts["aggregate_tables"] == 1
    out = proc.stdout
    checkpoint = "resources/sources/release-ur50-release-pmlm-650m/pmlm_650m.pt"
    assert (
        f"python -m pmlm fetch https://media.githubusercontent.com/media/microsoft/Mu-Protein/"
        f"ff29ce119739ee6378e7589a9ebc244a9110ce1c/pretrained/pmlm_650m.pt -o {checkpoint} --sha256 "
        "41ec3830624151782d20d41c033bd22a4a268a065ccb2dc8276ecf5d7cd62caa"
    ) in out
    assert (
        f"python -m pmlm import {checkpoint} -o results/released/pretrain/ur50-release/pmlm-650m --objective pmlm"
    ) in out
    assert "--encoder results/released/pretrain/ur50-release/pmlm-650m/model.safetensors" in out
    assert "--model PMLM-650m@ur50-release" in out  # the rows' label


def test_paper_config_adds_the_release_beside_the_trained_encoders():
    proc = snakemake("-n", "-p", "--configfile", "config/paper.yaml")
    assert proc.returncode == 0, proc.stderr
    counts = job_counts(proc.stdout)
    assert counts["pretrain"] == 6 and counts["import_release"] == 1  # the release is never pre-trained
    kl = next(line for line in proc.stdout.splitlines() if "-m pmlm kl " in line)
    assert "--model PMLM-650m@ur50-release=results/paper/pretrain/ur50-release/pmlm-650m/model.safetensors" in kl


@pytest.mark.slow
def test_released_dag_runs_on_the_tiny_fixture(tmp_path):
    served = tmp_path / "served"
    served.mkdir()
    shutil.copy(FIXTURE, served / FIXTURE.name)
    data = FIXTURE.read_bytes()
    chains = demo_chains(24, 120)
    local = tmp_path / "resources" / "local"  # where the workflow takes task files the user provides
    local.mkdir(parents=True)
    for split, rows in (("train", chains[:14]), ("valid", chains[14:18]), ("test", chains[18:])):
        (local / f"chains_{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    # TAPE's regression archives in TAPE's layout (<task>/<task>_<split>.json, the value a 1-element list)
    tape = {}
    for task, key in (("fluorescence", "log_fluorescence"), ("stability", "stability_score")):
        members = {
            f"{task}/{task}_{split}.json": json.dumps(
                [{"primary": c["seq"], "protein_length": len(c["seq"]), key: [len(c["seq"]) / 50.0], "id": c["id"]}
                 for c in rows]
            ).encode()
            for split, rows in (("train", chains[:14]), ("valid", chains[14:18]), ("test", chains[18:]))
        }  # fmt: skip
        archive = served / f"{task}.tar.gz"
        archive.write_bytes(tar_bytes(members, "w:gz"))
        tape[task] = hashlib.sha256(archive.read_bytes()).hexdigest()
    with static_http_server(served) as url:
        release = {"url": f"{url}/{FIXTURE.name}", "sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
        config = {
            "run": "rel",
            "pretrain": {
                "models": [{"dataset": "ur50-release", "objective": "pmlm", "preset": "tiny", "release": release}]
            },
            "sources": {f"tape_{t}": {"url": f"{url}/{t}.tar.gz", "sha256": sha} for t, sha in tape.items()},
            "task_data": {
                "chains": {
                    "files": {s: {"path": f"resources/local/chains_{s}.jsonl"} for s in ("train", "valid", "test")}
                },
                **{
                    f"tape_{t}": {
                        "files": {
                            s: {"source": f"tape_{t}", "member": f"{t}/{t}_{s}.json"}
                            for s in ("train", "valid", "test")
                        }
                    }
                    for t in tape
                },
            },
            "finetune": {
                "recipes": {
                    "contact": "config/finetune/contact_linear_tiny.yaml",
                    "ss3": "config/finetune/ss3_tiny.yaml",
                    "fluorescence": "config/finetune/fluorescence.yaml",
                    "stability": "config/finetune/stability.yaml",
                },
                "runs": {
                    "contact": {"recipe": "contact", "data": "chains", "table": "tape_contact", "tests": {"t": "test"}},
                    "ss3": {"recipe": "ss3", "data": "chains", "table": "secondary_structure", "tests": {"t": "test"}},
                    **{t: {"recipe": t, "data": f"tape_{t}", "table": "task", "tests": {"t": "test"}} for t in tape},
                },
                # the fixture reads 126 residues at a time
                "set": {
                    "optim.total_steps": 4,
                    "optim.warmup_steps": 1,
                    "save_every": 2,
                    "data.batch_size": 4,
                    "data.crop": 96,
                },
                "unsupervised": {"readouts": ["pair-kl"], "data": "chains", "tests": {"t": "test"}},
                "test_label": "six demo chains",
            },
            "report": {"contact_maps": {"runs": ["unsupervised-pair-kl"], "chains": 1}},
        }
        args = ("--cores", "2", "-s", str(REPO / "Snakefile"), "--directory", str(tmp_path))
        # a wrong checksum: the download fails, and neither a checkpoint nor an encoder is left
        bad = tmp_path / "bad.yaml"
        bad.write_text(
            yaml.safe_dump(
                {
                    **config,
                    "pretrain": {
                        "models": [{**config["pretrain"]["models"][0], "release": {**release, "sha256": "0" * 64}}]
                    },
                }
            )
        )
        proc = snakemake(*args, "--configfile", str(bad))
        assert proc.returncode != 0, proc.stdout[-2000:]
        fetched = tmp_path / "resources" / "sources" / "release-ur50-release-pmlm-tiny" / FIXTURE.name
        log = (tmp_path / "logs" / "fetch" / "release-ur50-release-pmlm-tiny" / f"{FIXTURE.name}.log").read_text()
        assert "sha256 expected 0000" in log, log
        assert not fetched.exists() and not (tmp_path / "results" / "rel" / "pretrain").exists()
        good = tmp_path / "good.yaml"
        good.write_text(yaml.safe_dump(config))
        proc = snakemake(*args, "--configfile", str(good))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert fetched.read_bytes() == data
    results = tmp_path / "results" / "rel"
    encoder = results / "pretrain" / "ur50-release" / "pmlm-tiny"
    info = json.loads((encoder / "model.json").read_text())
    assert info["source"]["sha256"] == release["sha256"] and info["source"]["arch"] == "prot_pmlm_1b"
    assert (encoder / "model.safetensors").stat().st_mode & 0o222 == 0  # protected(), as a trained encoder
    for name in ("contact", "ss3", "unsupervised-pair-kl"):
        tsv = pd.read_csv(results / "evaluation" / "ur50-release" / "pmlm-tiny" / f"{name}.tsv", sep="\t")
        assert (tsv["model"] == "PMLM-tiny@ur50-release").all() and (tsv["test_set"] == "t").all()
    tables = {
        t: (results / "tables" / f"{t}.md").read_text()
        for t in ("tape_contact", "secondary_structure", "unsupervised_contact", "pretrain_scores")
    }
    assert "| ours | PMLM-tiny | ur50-release | linear | M+ | t |" in tables["tape_contact"]
    assert "| ours | PMLM-tiny | ur50-release | mlp | M |" in tables["secondary_structure"]
    assert "| ours | PMLM-tiny | ur50-release | pair-kl | t |" in tables["unsupervised_contact"]
    assert "| ours | PMLM-tiny | ur50-release |" in tables["pretrain_scores"]  # its params and steps; no valid scores
    assert (results / "figures" / "contact_maps" / "ur50-release" / "pmlm-tiny" / "unsupervised-pair-kl.svg").is_file()
    # TAPE's fluorescence and stability, read from their archives as published, in tables of their own with TAPE's
    # rows beside ours
    for task in ("fluorescence", "stability"):
        tsv = pd.read_csv(results / "evaluation" / "ur50-release" / "pmlm-tiny" / f"{task}.tsv", sep="\t")
        assert set(tsv["metric"]) == {"spearman", "pearson", "mse", "n_too_long"} and (tsv["task"] == task).all()
        table = (results / "tables" / f"{task}.md").read_text()
        assert "| paper | TAPE Transformer |" in table and "| ours | PMLM-tiny | ur50-release | mlp | M | t |" in table
    assert not (results / "figures" / "pretrain_curves.svg").exists()  # no training run to draw
