"""The Snakemake workflow itself: lint, the paper's data DAG, config errors, and the demo's data stage."""

import json
import re

import pandas as pd
import pytest
from conftest import REPO, job_counts, snakemake

from pmlm.reports.results import TABLES


def test_lint_is_clean():
    proc = snakemake("--lint")
    assert proc.returncode == 0, proc.stderr
    assert "Lints for" not in proc.stdout + proc.stderr


def test_pretrain_resources_become_the_launcher_options():
    """GPUs per node from `gres` over two nodes, and the site's `launch_env` as one --env per variable."""
    # --forcerun: the job is planned also in a checkout where the demo has already run
    proc = snakemake("-n", "-p", "--cores", "2", "--forcerun", "pretrain", "--set-resources", "pretrain:nodes=2",
                     "pretrain:gres=gpu:2",
                     "pretrain:launch_env='NCCL_SOCKET_IFNAME=ib0 PMLM_COLLECTIVE_TIMEOUT=900'", "--",
                     "results/demo/pretrain/demo/pmlm-tiny/model.safetensors")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    launch = re.search(r"python -m pmlm launch (.*?) -- -m pmlm pretrain", proc.stdout)
    assert launch, proc.stdout[-3000:]
    assert launch.group(1) == "--gpus-per-node 2 --env NCCL_SOCKET_IFNAME=ib0 --env PMLM_COLLECTIVE_TIMEOUT=900"


def test_paper_config_shows_every_job_of_the_reproduction():
    proc = snakemake("-n", "-p", "--configfile", "config/paper.yaml")
    assert proc.returncode == 0, proc.stderr
    counts = job_counts(proc.stdout)
    # UniRef50 2018_03, Pfam-A 31.0, TAPE proteinnet / secondary_structure / remote_homology / fluorescence /
    # stability, the released PMLM
    assert counts["fetch_source"] == 8
    assert counts["extract_member"] == 20  # uniref50.fasta.gz + 3 + 5 + 5 + 3 + 3 TAPE split files
    assert counts["expect_local_file"] == 3  # the RaptorX set has no public archive: the user places it
    for rule in ("ingest_sequences", "split_clusters", "tokenize_shards"):
        assert counts[rule] == 2, (rule, counts)
    assert counts["pretrain"] == 6  # MLM/PMLM-base on Pfam and UR50, PMLM-large and PMLM-xl on UR50
    assert counts["tabulate_pretrain_scores"] == 1 and counts["plot_kl_histogram"] == 1
    assert "results/paper/pretrain/uniref50/pmlm_pair_only-xl/model.safetensors" in proc.stdout
    # TAPE-Contact for all 7 encoders, RaptorX ResNet for 4 and linear for the 4 ablation encoders, SS and RH for
    # PMLM-base Pfam and the released PMLM; fluorescence and stability for MLM / PMLM-base UR50 and the released PMLM
    assert counts["finetune"] == 25 and counts["evaluate"] == 25
    assert counts["task_table"] == 2  # tables/fluorescence and tables/stability
    assert counts["evaluate_unsupervised"] == 5  # the PMLM encoders' pair-head contacts
    assert counts["aggregate_tables"] == 1
    for dataset in ("uniref50", "pfam"):
        assert f"results/paper/data/{dataset}/shards" in proc.stdout
    assert "results/demo" not in proc.stdout  # the demo config is replaced, not merged
    # the KL figure: every PMLM encoder on Pfam valid and on UR50 valid
    kl = next(line for line in proc.stdout.splitlines() if "-m pmlm kl " in line)
    assert re.findall(r"--valid (\w+)=results/paper/data/\1/shards", kl) == ["pfam", "uniref50"]
    assert re.findall(r"--model (\S+)=", kl) == [
        "PMLM-base@pfam",
        "PMLM-base@uniref50",
        "PMLM-large@uniref50",
        "PMLM-pair-xl@uniref50",
        "PMLM-650m@ur50-release",
    ]
    # the features of each contact run reach `pmlm finetune`, per encoder as config/paper.yaml sets them
    features = {}
    for line in proc.stdout.splitlines():
        if "-m pmlm finetune" in line:
            run = re.search(r"--final results/paper/finetune/(\S+)/head\.safetensors", line).group(1)
            chosen = re.search(r"--set '?head\.features=(M\+?)'?", line)
            features[run] = chosen.group(1) if chosen else "auto"
    assert len(features) == 25
    assert features["pfam/pmlm-base/tape_contact_linear"] == "M+"
    assert features["uniref50/pmlm-base/tape_contact_linear"] == "M"
    assert features["uniref50/pmlm-large/tape_contact_linear"] == "M+"
    assert features["uniref50/pmlm-base/raptorx_contact_resnet"] == "M+"
    assert features["pfam/pmlm-base/raptorx_contact_linear"] == "M"
    assert features["uniref50/pmlm-base/raptorx_contact_linear"] == "M+"
    assert features["pfam/mlm-base/tape_contact_linear"] == "M"
    assert features["uniref50/pmlm_pair_only-xl/tape_contact_linear"] == "auto"  # the paper does not say
    assert features["pfam/pmlm-base/secondary_structure"] == "auto"


def _coevolution_dry_run(configfile: str) -> tuple[dict[str, int], str]:
    proc = snakemake("-n", "-p", "coevolution", "--configfile", configfile)
    assert proc.returncode == 0, proc.stderr
    return job_counts(proc.stdout), proc.stdout


def test_coevolution_study_dag():
    """One prepare job per seed, one job per unit (an arm of a seed, a seed's baselines), one report; every job runs
    `pmlm coevolution curves` on the study's folder with the whole study as JSON."""
    counts, out = _coevolution_dry_run("config/coevolution.yaml")
    assert counts["prepare_coevolution"] == 3  # seeds 1, 2, 3
    assert counts["run_coevolution_unit"] == 3 * 2 + 3  # MLM and PMLM per seed, and each seed's baselines
    assert counts["report_coevolution"] == 1
    folder = "results/synthetic/coevolution"
    assert f"--out {folder} --prepare 2" in out
    for unit in ("seed1-all-mlm", "seed3-all-pmlm", "seed2-baseline"):
        assert f"--out {folder} --unit {unit}" in out and f"{folder}/units/{unit}.tsv" in out
    assert f"--out {folder} --collect" in out
    for name in ("curves.tsv", "sequences.tsv", "curves.md", "curves.svg"):
        assert f"{folder}/{name}" in out
    study = json.loads(re.search(r"--config-json '(\{.*?\})' ", out).group(1))
    assert study["steps"] == [1500] and study["groups"]["L32"]["families"] == 4
    assert study["recipe"] == str(REPO / "config" / "train" / "coevolution_tiny.yaml")  # the workflow's own
    # logs and benchmarks stay outside the study's folder, which the command keeps for itself
    assert "logs/synthetic/coevolution/units/seed1-all-mlm.log" in out
    assert "benchmarks/synthetic/coevolution/units/seed1-all-mlm.tsv" in out


def test_coevolution_large_study_dag():
    """The GPU-sized study validates against the schema and hands its read-out settings to every unit."""
    counts, out = _coevolution_dry_run("config/coevolution_large.yaml")
    assert counts["prepare_coevolution"] == 3 and counts["run_coevolution_unit"] == 9
    study = json.loads(re.search(r"--config-json '(\{.*?\})' ", out).group(1))
    assert study["evaluate"]["token_contacts"] == "masked" and study["evaluate"]["sequences"] == 16
    group = study["groups"]["L64"]
    assert (group["length"], group["families"], group["coupling_strength"]) == (64, 16, 1.0)
    assert study["steps"] == [8000] and study["sequences"] == 5000
    assert "results/coevolution_large/coevolution/curves.md" in out


def test_coevolution_triplets_study_dag():
    """Three-body families and a Triple MLM per seed: three arms per seed, each its own unit."""
    counts, out = _coevolution_dry_run("config/coevolution_triplets.yaml")
    assert counts["prepare_coevolution"] == 3
    assert counts["run_coevolution_unit"] == 3 * 3 + 3  # MLM, PMLM and TMLM for each of 3 seeds, and the baselines
    for seed in (1, 2, 3):
        assert f"--unit seed{seed}-all-tmlm" in out
    study = json.loads(re.search(r"--config-json '(\{.*?\})' ", out).group(1))
    assert study["groups"]["L32"]["triplets"] == 4 and study["groups"]["L32"]["triplet_strength"] == 3.0
    assert "results/coevolution_triplets/coevolution/curves.md" in out


def test_no_coevolution_section_no_study():
    counts, _ = _coevolution_dry_run("config/config.yaml")
    assert "run_coevolution_unit" not in counts and "prepare_coevolution" not in counts


@pytest.mark.parametrize(
    "text, expected",
    [
        (
            "sources:\n  a: {url: 'file:x.fa', sha265: abc}\ndatasets:\n  d: {sources: [a]}\n",
            "config.sources.a: Additional properties",
        ),
        (
            "sources:\n  a: {url: 'file:x.fa'}\ndatasets:\n  d: {sources: [b]}\n",
            "config.datasets.d.sources[0]: unknown source 'b'",
        ),
        ("sources:\n  a: {url: 'gopher://x'}\ndatasets:\n  d: {sources: [a]}\n", "config.sources.a.url"),
        (
            "sources:\n  a: {url: 'file:x.fa'}\ndatasets:\n  d: {sources: [a], cluster: {min_seq_id: 50}}\n",
            "config.datasets.d.cluster.min_seq_id",
        ),
    ],
)
def test_broken_config_names_the_key(tmp_path, text, expected):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(text)
    proc = snakemake("-n", "--configfile", str(cfg))
    assert proc.returncode != 0
    assert expected in proc.stdout + proc.stderr


def test_demo_workflow(tmp_path):
    """The demo DAG end to end as `snakemake --cores 2` runs it, with pre-training shortened."""
    short = tmp_path / "short.yaml"
    short.write_text(
        "pretrain:\n  set: {optim.total_steps: 30, optim.warmup_steps: 5, eval_every: 15, "
        "save_every: 15, eval_batches: 4}\n  kl: {sequences: 8, pairs: 4}\n"
        "finetune:\n  set: {optim.total_steps: 6, optim.warmup_steps: 2, save_every: 3}\n"
    )
    args = (
        "--cores",
        "2",
        "-s",
        str(REPO / "Snakefile"),
        "--directory",
        str(tmp_path),
        "--configfile",
        str(REPO / "config" / "config.yaml"),
        str(short),
    )
    proc = snakemake(*args)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # the last screen: wall time, both pre-training runs, every table with ours beside the paper's, the report command
    screen = proc.stderr[proc.stderr.index("pmlm: the run finished in") :]
    for objective in ("mlm", "pmlm"):
        assert re.search(rf"^  demo/{objective}-tiny +\d+\.\d\d -> \d+\.\d\d \(step 10 -> 30\)", screen, re.M), screen
    assert "Tables in results/demo/tables (.csv/.html/.md/.tex):" in screen
    assert sorted(re.findall(r"^  ([a-z_]+) ", screen, re.M)) == sorted(
        ["pretrain_scores", "precision_by_separation", "net_charge", "net_charge_lora", *TABLES]
    ), screen
    assert re.search(
        r"^  raptorx_contact +P@L, s >= 24 \(%\)  ours: MLM-tiny \d+\.\d, PMLM-tiny \d+\.\d$", screen, re.M
    )
    # the demo's task of one's own: its table's headline, the task's first metric on its test set
    assert re.search(
        r"^  net_charge +spearman demo_test  ours: MLM-tiny -?\d\.\d{3}, PMLM-tiny -?\d\.\d{3}$", screen, re.M
    )
    # the same task through LoRA adapters: a table of its own
    assert re.search(
        r"^  net_charge_lora +spearman demo_test  ours: MLM-tiny -?\d\.\d{3}, PMLM-tiny -?\d\.\d{3}$", screen, re.M
    )
    configs = f"--configfile {REPO / 'config' / 'config.yaml'} short.yaml"
    assert f"cd {tmp_path} && snakemake --report report.html -s {REPO / 'Snakefile'} {configs}" in screen
    data = tmp_path / "results" / "demo" / "data" / "demo"
    manifest = json.loads((data / "shards" / "manifest.json").read_text())
    ingest = json.loads((data / "ingest_stats.json").read_text())
    split = json.loads((data / "split" / "split_stats.json").read_text())
    assert ingest["read"] == 6000 and ingest["kept"] + ingest["dropped_total"] == 6000
    assert split["sequences_in"] == ingest["kept"]
    assert split["decontamination"]["removed_sequences"] > 0  # demo UniProt overlaps the demo PDB chains
    for side in ("train", "valid"):
        assert manifest["splits"][side]["rows"] == split[side]["sequences"]
        assert len(manifest["splits"][side]["files"]) == 4
    train = pd.read_parquet(data / "shards" / "train")
    valid = pd.read_parquet(data / "shards" / "valid")
    assert set(train["cluster_id"]).isdisjoint(valid["cluster_id"])
    assert (data / "split" / "train.fasta").is_file()  # kept: re-sharding does not re-cluster (below)

    results = tmp_path / "results" / "demo"
    for objective in ("mlm", "pmlm"):
        weights = results / "pretrain" / "demo" / f"{objective}-tiny" / "model.safetensors"
        assert weights.is_file() and weights.stat().st_mode & 0o222 == 0  # protected(): read-only
        scores = json.loads((weights.parent / "final_scores.json").read_text())
        assert scores["step"] == 30 and scores["objective"] == objective
        run_dir = results / "pretrain_runs" / "demo" / f"{objective}-tiny"
        assert (run_dir / "checkpoints").is_dir() and (run_dir / "metrics.csv").is_file()
        # the declared copy the curves read, beside the weights: the finished run's log, whole
        assert (weights.parent / "metrics.csv").read_bytes() == (run_dir / "metrics.csv").read_bytes()
    table = (results / "tables" / "pretrain_scores.md").read_text()
    assert "| ours | MLM-tiny | demo |" in table and "| ours | PMLM-tiny | demo |" in table
    assert "| paper | PMLM-base | UR50 |" in table
    kl = json.loads((results / "figures" / "kl_histogram.json").read_text())
    assert list(kl) == ["demo"] and list(kl["demo"]) == ["PMLM-tiny@demo"]  # one validation set: one panel
    assert kl["demo"]["PMLM-tiny@demo"]["all"]["pairs"] == 32
    assert (results / "figures" / "kl_histogram.png").stat().st_size > 10_000

    tasks = json.loads((results / "tasks" / "demo_pdb" / "structure_split_stats.json").read_text())
    assert tasks["chains"] == 700 and tasks["test"]["chains"] > 50
    for objective in ("mlm", "pmlm"):
        for run in ("contact_linear", "contact_resnet", "ss3"):
            tsv = pd.read_csv(results / "evaluation" / "demo" / f"{objective}-tiny" / f"{run}.tsv", sep="\t")
            assert {"config_sha256", "encoder_sha256", "git_commit", "torch_version"} <= set(tsv.columns)
            assert (tsv["test_set"] == "demo_test").all()
            assert (tsv["n_proteins"][tsv["metric"] != "n_too_long"] > 0).all()
    # the LoRA run keeps the head and the adapters only: a few % of the encoder's file; the full run the whole encoder
    for objective in ("mlm", "pmlm"):
        encoder = results / "pretrain" / "demo" / f"{objective}-tiny" / "model.safetensors"
        lora = results / "finetune" / "demo" / f"{objective}-tiny" / "net_charge_lora" / "head.safetensors"
        info = json.loads(lora.with_suffix(".json").read_text())
        assert info["adapter"]["targets"] == ["qkv", "proj"] and info["selected"]["step"] == 6
        assert lora.stat().st_size <= 0.05 * encoder.stat().st_size, (lora.stat().st_size, encoder.stat().st_size)
        full = lora.parent.parent / "net_charge" / "head.safetensors"
        assert full.stat().st_size > encoder.stat().st_size * 0.9
    tables = {t: (results / "tables" / f"{t}.md").read_text() for t in TABLES}
    # features `auto`: the MLM reads its encoder outputs (M), the PMLM's contact heads its pair head's block (M+)
    for label, contact_features in (("MLM-tiny", "M"), ("PMLM-tiny", "M+")):
        assert f"| ours | {label} | demo | linear | {contact_features} | demo_test |" in tables["tape_contact"]
        assert f"| ours | {label} | demo | resnet | {contact_features} | demo_test |" in tables["raptorx_contact"]
        assert f"| ours | {label} | demo | mlp | M |" in tables["secondary_structure"]
    assert "| ours | PMLM-tiny | demo | pair-kl | demo_test |" in tables["unsupervised_contact"]
    assert "MLM-tiny" not in tables["unsupervised_contact"].replace("PMLM-tiny", "")
    assert "| paper | PMLM-base | Pfam | - | M | 0.199 | 0.446 | 0.946 |" in tables["remote_homology"]
    # every long job says how far it is in its rule's log: a line per tenth of pre-training and fine-tuning
    logs = tmp_path / "logs" / "demo"
    for objective in ("mlm", "pmlm"):
        text = (logs / "pretrain" / "demo" / f"{objective}-tiny.log").read_text()
        steps = [int(s) for s in re.findall(r"^pmlm pretrain: (\d+)/30 steps \(\d+%\) loss ", text, re.M)]
        assert steps == [3 * k for k in range(1, 11)], text
        text = (logs / "finetune" / "demo" / f"{objective}-tiny" / "ss3.log").read_text()
        assert re.search(r"^pmlm finetune: 6/6 steps \(100%\) loss \S+ lr ", text, re.M), text
    assert "pmlm ingest: 6,000 records" in (logs / "ingest" / "demo.log").read_text()
    # a second run has nothing to do: outputs are complete and up to date
    again = snakemake(*args, "-n")
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr
    # rerunning one rule plans it and what reads its outputs, never what made its inputs: re-sharding does not
    # re-cluster, a fine-tuning rerun does not pre-train, and so on down to the tables
    for forced, upstream in FORCED_RERUNS.items():
        plan = snakemake(*args, "-n", "--forcerun", forced)
        assert plan.returncode == 0, plan.stderr[-3000:]
        counts = job_counts(plan.stdout)
        assert counts.get(forced, 0) >= 1 and not set(upstream) & set(counts), (forced, counts)


# a rule forced to rerun -> the rules that made its inputs, which must not be planned again
FORCED_RERUNS = {
    "tokenize_shards": ("split_clusters", "ingest_sequences"),
    "pretrain": ("tokenize_shards", "split_clusters"),
    "finetune": ("pretrain", "split_structures"),
    "evaluate": ("finetune", "pretrain"),
    "aggregate_tables": ("evaluate", "finetune"),
}


def test_only_cheap_or_inference_outputs_are_temporary():
    """A temp() output is deleted once its consumers ran, so forcing a consumer replans its producer: only the
    inference shard jobs' parts are temporary (each as large as the gathered table they make)."""
    temporary = {
        (path.name, rule)
        for path in (REPO / "workflow" / "rules").glob("*.smk")
        for rule, body in re.findall(r"^rule (\w+):\n(.*?)(?=^rule |\Z)", path.read_text(), re.M | re.S)
        if "temp(" in body
    }
    assert temporary == {("inference.smk", r) for r in ("embed_shard", "score_shard", "contacts_shard")}
