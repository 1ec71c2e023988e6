"""`pmlm throughput`: a GPU check's result as the throughput file, and `pmlm plan` pricing each job with its own
measured rate, a rate derived at the same model-FLOP rate, or the paper's assumed one, naming the card."""

from __future__ import annotations

import json

import pytest
import yaml

from pmlm.cli import main
from pmlm.train.budget import flops_per_token
from pmlm.train.planning import recipe_job

CARD = "NVIDIA H100 80GB HBM3"


def result_file(path, device=CARD, rows=None):
    rows = rows or [
        {"dims": "base", "model": "ours", "objective": "pmlm", "layout": "packed", "compiled": False,
         "micro_tokens": 131072, "non_pad_tokens_per_s": 600000, "mfu": 0.41},
        {"dims": "base", "model": "ours", "objective": "pmlm", "layout": "padded", "compiled": False,
         "micro_tokens": 65536, "non_pad_tokens_per_s": 500000, "mfu": 0.35},
        {"dims": "base", "model": "ours", "objective": "mlm", "layout": "packed", "micro_tokens": 131072,
         "out_of_memory": True},
        {"dims": "base", "model": "hf_esm", "objective": "mlm", "layout": "hf-default", "non_pad_tokens_per_s": 1e6},
    ]  # fmt: skip
    path.write_text(json.dumps({"bench": "gpu_throughput", "device": device, "torch": "2.11.0+cu130", "rows": rows}))
    return path


def test_a_result_becomes_the_file_plan_prices_with(tmp_path, capsys):
    out = tmp_path / "throughput.yaml"
    out.write_text("tokens_per_gpu_second: {}\n\n# kept\ninference_flops_per_gpu_second: {bf16: 3.0e+14}\n")
    assert main(["throughput", str(result_file(tmp_path / "r.json")), "-o", str(out)]) == 0
    assert "base pmlm: 600,000 tokens/s per GPU on NVIDIA H100" in capsys.readouterr().out
    data = yaml.safe_load(out.read_text())
    # the best of our rows per preset and objective (not HF's, not an out-of-memory row); the inference rate kept
    entry = data["tokens_per_gpu_second"]["base"]["pmlm"]
    assert entry["tokens_per_second"] == 600000 and entry["card"] == CARD and entry["layout"] == "packed"
    assert set(data["tokens_per_gpu_second"]["base"]) == {"pmlm"}
    assert data["inference_flops_per_gpu_second"] == {"bf16": 3.0e14} and "# kept\n" in out.read_text()

    assert main(["plan", "--configfile", "config/paper.yaml", "--throughput", str(out), "--json"]) == 0
    jobs = {row["job"]: row for row in json.loads(capsys.readouterr().out)["jobs"]}
    own = jobs["uniref50/pmlm-base"]
    assert own["tokens_per_gpu_second"] == 600000 and own["throughput_source"].startswith(f"measured on {CARD}")
    # MLM-base: PMLM-base's measured model-FLOP rate over MLM-base's FLOPs per token
    base = "config/train/base.yaml"
    ratio = flops_per_token(recipe_job(base, "pmlm").config) / flops_per_token(recipe_job(base, "mlm").config)
    mlm = jobs["uniref50/mlm-base"]
    assert mlm["tokens_per_gpu_second"] == round(600000 * ratio)
    assert (
        mlm["throughput_source"]
        == f"derived from base pmlm measured on {CARD} (torch 2.11.0+cu130, "
        + (mlm["throughput_source"].split(", ")[-1])
    )
    # another preset: the same objective measured on the base dims, at its model-FLOP rate
    large = jobs["uniref50/pmlm-large"]
    expected = 600000 * flops_per_token(recipe_job(base, "pmlm").config)
    expected /= flops_per_token(recipe_job("config/train/large.yaml", "pmlm").config)
    assert large["tokens_per_gpu_second"] == round(expected) and "derived from base pmlm" in large["throughput_source"]
    assert main(["plan", "--configfile", "config/paper.yaml", "--throughput", str(out)]) == 0
    table = capsys.readouterr().out
    assert "| uniref50/pmlm-base | 4 |" in table and "| 600,000 |" in table and "600,000*" not in table
    assert "~ derived" in table and "* assumed" not in table and f"measured on {CARD}" in table


def test_the_flat_form_is_read_and_nothing_measured_is_assumed(tmp_path, capsys):
    flat = tmp_path / "flat.yaml"
    flat.write_text("tokens_per_gpu_second: {base: 250000}\n")
    assert main(["plan", "--configfile", "config/paper.yaml", "--throughput", str(flat), "--json"]) == 0
    jobs = {row["job"]: row for row in json.loads(capsys.readouterr().out)["jobs"]}
    assert jobs["pfam/mlm-base"]["tokens_per_gpu_second"] == 250000 == jobs["pfam/pmlm-base"]["tokens_per_gpu_second"]
    assert "card not recorded" in jobs["pfam/mlm-base"]["throughput_source"]
    assert main(["plan", "--configfile", "config/paper.yaml", "--throughput", "config/throughput.yaml"]) == 0
    assert "* assumed" in capsys.readouterr().out  # the shipped file holds no measured rate


@pytest.mark.parametrize(
    "content, message",
    [
        ("not json", "not JSON"),
        ('{"device": "x"}', "not a bench_gpu_throughput.py result"),
        ('{"device": "NVIDIA H100", "rows": [{"dims": "base", "model": "ours", "objective": "pmlm"}]}', "row 0"),
        ('{"device": "cpu", "rows": []}', "measured on a CPU"),
        ('{"device": "NVIDIA H100", "rows": []}', "no row of ours"),
    ],
)
def test_bad_results_are_one_line_and_write_nothing(tmp_path, capsys, content, message):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    out = tmp_path / "throughput.yaml"
    assert main(["throughput", str(bad), "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and str(bad) in err and len(err.splitlines()) == 1
    assert not out.exists()


def test_the_output_rule_and_a_cpu_run_for_rehearsals(tmp_path, capsys):
    cpu = result_file(tmp_path / "cpu.json", device="cpu")
    assert main(["throughput", str(cpu), "-o", str(tmp_path / "t.yaml"), "--allow-cpu"]) == 0
    foreign = tmp_path / "binary.yaml"
    foreign.write_bytes(b"\0\1\2")
    assert main(["throughput", str(cpu), "-o", str(foreign), "--allow-cpu"]) == 2
    assert "was not written by this command" in capsys.readouterr().err and foreign.read_bytes() == b"\0\1\2"
    assert main(["throughput", str(cpu), "-o", str(tmp_path), "--allow-cpu"]) == 2
    assert "is a folder" in capsys.readouterr().err
