"""The workflow report: `pmlm report`'s figures and pages (metrics logs, contact maps, bad input) and the report
`snakemake --report` builds from a small run, opened in a real headless browser. The tables it shows:
tests/test_result_tables.py.

A tiny PMLM encoder is pre-trained, fine-tuned and evaluated in-process (seconds); the workflow then runs only
its table and report rules on those outputs (`--allowed-rules`: the upstream rules' outputs are taken as they
are) and writes report.html. Chromium loads the report, a script added to a copy of it clicks every results
category and every entry's view button as a reader would, and `--dump-dom` returns what was shown.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import yaml
from conftest import make_sequences, write_shards
from tiny_models import make_encoder, recipe, write_structures

from pmlm.cli import main

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = shutil.which("snakemake", path=os.path.dirname(sys.executable)) or shutil.which("snakemake")
CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").is_file() else None)
RUN, DATASET, PRESET = "t", "tiny", "test"
ENCODER = f"pmlm-{PRESET}"
# the rules that run here; everything upstream of them comes from the in-process run below
REPORT_RULES = (
    "all",
    "tabulate_pretrain_scores",
    "aggregate_tables",
    "plot_kl_histogram",
    "plot_pretrain_curves",
    "plot_finetune_curves",
    "plot_contact_maps",
    "plot_readout_contact_maps",
    "plot_precision_by_separation",
    "record_run_info",
)
TABLES = (
    "pretrain_scores",
    "tape_contact",
    "raptorx_contact",
    "ablation",
    "secondary_structure",
    "remote_homology",
    "unsupervised_contact",
    "precision_by_separation",
)
FIGURES = (
    "pretrain_curves",
    "finetune_curves",
    "kl_histogram",
    "precision_by_separation",
    "contact",
    "unsupervised-pair-kl",
)

# Walks the report like a reader: each category of the menu, each entry's view button; records what the
# content area then shows (an <img> with its decoded size, or an <iframe> with the page it holds).
WALKER = """<script>
(async function () {
  const sleep = (ms) => new Promise((done) => setTimeout(done, ms));
  const shown = [];
  await sleep(500);
  for (const category of Object.keys(categories)) {
    const home = document.querySelector("nav ol a");
    home.click();
    await sleep(200);
    const entry = Array.from(document.querySelectorAll("nav a")).find((a) => a.textContent.trim() === category);
    if (!entry) { shown.push({category: category, error: "not in the menu"}); continue; }
    entry.click();
    await sleep(300);
    const rows = document.querySelectorAll("nav table tbody tr").length;
    for (let k = 0; k < rows; k++) {
      document.querySelectorAll("nav table tbody tr")[k].querySelector("td:last-child a").click();
      await sleep(300);
      const img = Array.from(document.querySelectorAll("#app img")).find((i) => !i.classList.contains("h-4"));
      const frame = document.querySelector("#app iframe");
      const item = {category: category};
      if (img) {
        item.kind = "img"; item.src = img.src.slice(0, 200); item.width = img.naturalWidth;
      } else if (frame) {
        item.kind = "iframe"; item.src = frame.src;
      }
      shown.push(item);
    }
  }
  const out = document.createElement("pre");
  out.id = "report-walk";
  out.textContent = JSON.stringify(shown);
  document.body.appendChild(out);
})();
</script>
"""


def _snakemake(*args, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(
        os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""), OMP_NUM_THREADS="1"
    )
    return subprocess.run(
        [SNAKEMAKE, "-s", str(REPO / "Snakefile"), "--directory", str(cwd), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def _small_run(root: Path) -> Path:
    """A pre-trained, fine-tuned and evaluated tiny PMLM encoder laid out as the workflow lays it out."""
    results = root / "results" / RUN
    write_shards(
        results / "data" / DATASET / "shards",
        {"train": make_sequences(64, seed=1), "valid": make_sequences(16, seed=2)},
    )
    tasks = root / "resources" / "local"  # where the config schema wants local task files
    tasks.mkdir(parents=True)
    for split, (n, seed) in {"train": (12, 1), "valid": (4, 2), "test": (4, 3)}.items():
        write_structures(tasks / f"{split}.jsonl", n, seed=seed, lengths=(20, 30))
    train_cfg = root / "train.yaml"
    train_cfg.write_text(
        yaml.safe_dump(
            {
                "model": {
                    "preset": "tiny",
                    "overrides": {"num_layers": 1, "hidden": 32, "ffn": 64, "heads": 2, "max_len": 64},
                },
                "objective": {"name": "pmlm"},
                "optim": {"lr": 3e-3, "warmup_steps": 1, "total_steps": 4},
                "tokens_per_step": 256,
                "data": {"buffer_rows": 32, "num_workers": 0},
                "log_every": 1,
                "eval_every": 2,
                "eval_batches": 1,
                "save_every": 0,
            }
        )
    )
    weights = results / "pretrain" / DATASET / ENCODER / "model.safetensors"
    assert (
        main(
            [
                "pretrain",
                "--config",
                str(train_cfg),
                "--shards",
                str(results / "data" / DATASET / "shards"),
                "--out",
                str(results / "pretrain_runs" / DATASET / ENCODER),
                "--final",
                str(weights),
                "--scores",
                str(weights.parent / "final_scores.json"),
            ]
        )
        == 0
    )
    ft_cfg = root / "contact.yaml"
    ft_cfg.write_text(yaml.safe_dump(recipe(optim__total_steps=4, eval_every=2, save_every=0)))
    head = results / "finetune" / DATASET / ENCODER / "contact" / "head.safetensors"
    assert (
        main(
            [
                "finetune",
                "--config",
                str(ft_cfg),
                "--encoder",
                str(weights),
                "--train",
                str(tasks / "train.jsonl"),
                "--valid",
                str(tasks / "valid.jsonl"),
                "--out",
                str(results / "finetune_runs" / DATASET / ENCODER / "contact"),
                "--final",
                str(head),
            ]
        )
        == 0
    )
    label = f"PMLM-{PRESET}@{DATASET}"
    evaluation = results / "evaluation" / DATASET / ENCODER
    test = f"held_out={tasks / 'test.jsonl'}"
    assert (
        main(
            [
                "evaluate",
                "--head",
                str(head),
                "--test",
                test,
                "--model",
                label,
                "--out",
                str(evaluation / "contact.tsv"),
            ]
        )
        == 0
    )
    assert (
        main(
            [
                "evaluate",
                "--head",
                "pair-kl",
                "--encoder",
                str(weights),
                "--test",
                test,
                "--model",
                label,
                "--out",
                str(evaluation / "unsupervised-pair-kl.tsv"),
            ]
        )
        == 0
    )
    config = {
        "run": RUN,
        "sources": {"seqs": {"url": "file:unused.fasta"}},
        "datasets": {DATASET: {"sources": ["seqs"]}},
        "pretrain": {
            "recipes": {PRESET: str(train_cfg)},
            "models": [{"dataset": DATASET, "objective": "pmlm", "preset": PRESET}],
            "kl": {"sequences": 4, "pairs": 2},
        },
        "task_data": {
            "structures": {"files": {s: {"path": f"resources/local/{s}.jsonl"} for s in ("train", "valid", "test")}}
        },
        "finetune": {
            "recipes": {"contact": str(ft_cfg)},
            "runs": {
                "contact": {
                    "recipe": "contact",
                    "data": "structures",
                    "table": "tape_contact",
                    "tests": {"held_out": "test"},
                }
            },
            "unsupervised": {"readouts": ["pair-kl"], "data": "structures", "tests": {"held_out": "test"}},
        },
        "report": {"contact_maps": {"chains": 2}},
    }
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _walk(report: Path, tmp_path: Path) -> list[dict]:
    page = tmp_path / "walk.html"
    head, body_end, tail = report.read_text().rpartition("</body>")  # the page's own end (scripts quote the tag)
    page.write_text(head + WALKER + body_end + tail)
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
        "--virtual-time-budget=30000",
    ]
    proc = subprocess.run([CHROMIUM, *flags, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    found = re.search(r'<pre id="report-walk">(.*?)</pre>', proc.stdout, re.S)
    assert found, "the walk did not finish in the browser: " + proc.stderr[-2000:]
    return json.loads(
        found.group(1).replace("&quot;", '"').replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">")
    )


def _filename(src: str) -> str:
    return re.search(r";filename=([^;]+);", src).group(1)


@pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (scripts/setup.sh installs it as root on Debian)"
)
def test_report_shows_each_table_once_and_the_figures(tmp_path):
    config = _small_run(tmp_path)
    allowed = ["--allowed-rules", *REPORT_RULES]
    proc = _snakemake("--cores", "2", "--configfile", str(config), *allowed, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # the run's last screen: every table where it is, ours beside the paper's, and the command that builds the report
    screen = proc.stderr[proc.stderr.index("pmlm: the run finished in") :]
    assert f"Tables in results/{RUN}/tables (.csv/.html/.md/.tex):" in screen
    listed = re.findall(r"^  ([a-z_]+) ", screen, re.M)
    assert sorted(listed) == sorted(TABLES), screen
    assert re.search(r"^  tape_contact +P@L/5, s >= 12 \(%\)  ours: PMLM-test \d+\.\d$", screen, re.M), screen
    assert "paper: PMLM-base (Pfam) 47.2" in screen
    command = re.search(r"^The report \(tables, figures, configuration and versions in one page\): (.*)$", screen, re.M)
    assert command.group(1) == (
        f"cd {tmp_path} && snakemake --report report.html -s {REPO / 'Snakefile'} --configfile config.yaml"
    )
    # the report, built by that command as printed
    report = tmp_path / "report.html"
    env = dict(os.environ, PATH=os.path.dirname(SNAKEMAKE) + os.pathsep + os.environ.get("PATH", ""))
    proc = subprocess.run(command.group(1), shell=True, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    shown = _walk(report, tmp_path)
    assert not [s for s in shown if "error" in s or "kind" not in s], shown
    names = Counter(_filename(s["src"]) for s in shown)
    # each table once, as its HTML page; no CSV / Markdown / LaTeX entries beside it
    assert {f"{t}.html": 1 for t in TABLES} == {
        n: c for n, c in names.items() if n.endswith(".html") and n != "run_info.html"
    }
    assert not [n for n in names if n.rsplit(".", 1)[-1] in ("csv", "md", "tex", "png")]
    assert names["run_info.html"] == 1
    for figure in FIGURES:
        assert names[f"{figure}.svg"] == 1, names
    images = [s for s in shown if s["kind"] == "img"]
    assert {_filename(s["src"]) for s in images} == {f"{f}.svg" for f in FIGURES}
    assert all(s["width"] > 100 for s in images), images  # decoded and drawn by the browser
    pages = {
        _filename(s["src"]): base64.b64decode(s["src"].split("base64,", 1)[1]).decode()
        for s in shown
        if s["kind"] == "iframe"
    }
    assert all("<table" in text for text in pages.values())
    assert "| ours | PMLM-test | tiny |" not in pages["pretrain_scores.html"]  # HTML, not the Markdown form
    assert "<td>ours</td><td>PMLM-test</td><td>tiny</td>" in pages["pretrain_scores.html"]
    run_info = pages["run_info.html"]
    for package in ("pmlm", "torch", "snakemake", "python"):
        assert f"<td>{package}</td>" in run_info
    assert "contact_maps:" in run_info and f"run: {RUN}" in run_info
    categories = {s["category"] for s in shown}
    assert categories == {"Pre-training", "Downstream tasks", "Contact maps", "Run"}


def test_metrics_log_keeps_the_last_row_of_a_step_logged_twice(tmp_path):
    from pmlm.reports.training_curves import read_metrics

    log = tmp_path / "metrics.csv"
    # a run resumed from its step-2 checkpoint logs step 2 again
    log.write_text(
        "split,step,loss,l_mlm,l_pmlm,metric,value\ntrain,1,9.0,3.0,6.0,,\ntrain,2,8.0,2.9,5.1,,\n"
        "train,2,7.5,2.8,4.7,,\nvalid,2,,,,P@L/5_medium_long,0.25\n"
    )
    got = read_metrics(log)
    assert got["train"]["loss"] == [(1, 9.0), (2, 7.5)]
    assert got["valid"]["metric:P@L/5_medium_long"] == [(2, 0.25)]


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["curves", "--kind", "pretrain", "--run", "a={tmp}/MISSING"], "MISSING: cannot read metrics log"),
        (["curves", "--kind", "pretrain", "--run", "a"], "--run expects LABEL=PATH"),
        (["curves", "--kind", "finetune", "--run", "a={tmp}/BAD"], "BAD:3: bad number"),
        (["curves", "--kind", "finetune", "--run", "a={tmp}/NOCOLS"], "NOCOLS:1: not a metrics log: no column(s) step"),
        (["separation", "--result", "secondary_structure={tmp}/SS3"], "no contact results among the given TSVs"),
        (["run-info", "--config-json", "{{run: x"], "--config-json is not JSON"),
        (
            ["contact-maps", "--head", "pair-kl", "--test", "T", "--label", "x"],
            "--head pair-kl reads the encoder's pair head",
        ),
        (["contact-maps", "--head", "{tmp}/NOHEAD", "--test", "T", "--label", "x"], "NOHEAD: no such head file"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, capsys, argv, expected):
    (tmp_path / "BAD").write_text("split,step,loss\ntrain,1,0.5\ntrain,2,oops\n")
    (tmp_path / "NOCOLS").write_text("split,loss\ntrain,0.5\n")
    (tmp_path / "SS3").write_text(
        "model\ttask\thead\tfeatures\ttest_set\tmetric\tvalue\tn_proteins\nM@d\tss3\tmlp\tencoder\tt\tQ3\t0.5\t3\n"
    )
    argv = [a.format(tmp=tmp_path) for a in argv]
    prefix = tmp_path / "out" / "x"
    assert main(["report", *argv, "--out-prefix", str(prefix)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("pmlm report: error:") and expected in err, err
    assert not prefix.parent.exists() or not list(prefix.parent.iterdir())


def test_contact_maps_refuse_an_encoder_without_a_pair_head(tmp_path, capsys):
    weights = make_encoder(tmp_path / "mlm" / "model.safetensors", objective="mlm")
    test = write_structures(tmp_path / "test.jsonl", 2, seed=1)
    assert (
        main(
            [
                "report",
                "contact-maps",
                "--head",
                "pair-kl",
                "--encoder",
                str(weights),
                "--test",
                str(test),
                "--label",
                "m",
                "--out-prefix",
                str(tmp_path / "maps"),
            ]
        )
        == 2
    )
    assert "has no pair head" in capsys.readouterr().err
    assert not list(tmp_path.glob("maps*"))


def test_contact_map_runs_must_exist_in_the_config():
    from workflow_rules import workflow_config

    from pmlm.errors import ConfigError

    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    config["report"] = {"contact_maps": {"runs": ["ss3"]}}
    with pytest.raises(ConfigError, match=r"config.report.contact_maps.runs\[0\]: 'ss3' is not a contact run"):
        workflow_config.check_references(config)
