"""`pmlm throughput`: a GPU check's result as the throughput file, and `pmlm plan` pricing each job with its own
measured rate, a rate derived at the same model-FLOP rate, or the paper's assumed one, naming the card."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from tiny_models import CARD, DAY, result_file

from pmlm.cli import main
from pmlm.train.budget import flops_per_token
from pmlm.train.jobs import recipe_job


def fpt(recipe: str, objective: str) -> int:
    return flops_per_token(recipe_job(f"config/train/{recipe}.yaml", objective).config)


def test_a_result_becomes_the_file_plan_prices_with(tmp_path, capsys):
    out = tmp_path / "throughput.yaml"
    out.write_text("tokens_per_gpu_second: {}\n\n# kept\ninference_flops_per_gpu_second: {bf16: 3.0e+14}\n")
    h100 = result_file(tmp_path / "r.json")
    a100 = result_file(
        tmp_path / "a100.json",
        device="NVIDIA A100-SXM4-80GB",
        rows=[{"dims": "xl", "model": "ours", "objective": "mlm", "layout": "padded", "non_pad_tokens_per_s": 90000}],
    )
    assert main(["throughput", str(h100), str(a100), "-o", str(out)]) == 0
    assert "base pmlm: 600,000 tokens/s per GPU on NVIDIA H100" in capsys.readouterr().out
    data = yaml.safe_load(out.read_text())
    # the best of our rows per preset and objective (not HF's, not an out-of-memory row); the inference rate kept
    entry = data["tokens_per_gpu_second"]["base"]["pmlm"]
    assert entry == {
        "tokens_per_second": 600000, "card": CARD, "torch": "2.11.0+cu130", "layout": "packed", "compiled": False,
        "micro_tokens": 131072, "mfu": 0.41, "measured": DAY, "source": str(h100),
    }  # fmt: skip
    assert set(data["tokens_per_gpu_second"]["base"]) == {"pmlm"} and set(data["tokens_per_gpu_second"]) == {
        "base",
        "xl",
    }
    assert data["inference_flops_per_gpu_second"] == {"bf16": 3.0e14} and "# kept\n" in out.read_text()

    assert main(["plan", "--configfile", "config/paper.yaml", "--throughput", str(out), "--json"]) == 0
    jobs = {row["job"]: row for row in json.loads(capsys.readouterr().out)["jobs"]}
    h100_day = f"{CARD} (torch 2.11.0+cu130, {DAY})"
    own = jobs["uniref50/pmlm-base"]
    assert own["tokens_per_gpu_second"] == 600000 and own["throughput_source"] == f"measured on {h100_day}"
    assert own["throughput_kind"] == "measured" and own["throughput_card"] == CARD
    # MLM-base: PMLM-base's measured model-FLOP rate over MLM-base's FLOPs per token
    mlm = jobs["uniref50/mlm-base"]
    assert mlm["tokens_per_gpu_second"] == round(600000 * fpt("base", "pmlm") / fpt("base", "mlm"))
    assert mlm["throughput_source"] == f"derived from base pmlm measured on {h100_day}"
    # PMLM-large: the same objective (base's) before the closest size (xl's MLM)
    large = jobs["uniref50/pmlm-large"]
    assert large["tokens_per_gpu_second"] == round(600000 * fpt("base", "pmlm") / fpt("large", "pmlm"))
    assert large["throughput_source"] == mlm["throughput_source"]
    # pair-only xl: its own preset's other objective first, on the card that measured it
    xl = jobs["uniref50/pmlm_pair_only-xl"]
    assert xl["tokens_per_gpu_second"] == round(90000 * fpt("xl", "mlm") / fpt("xl", "pmlm_pair_only"))
    assert xl["throughput_source"].startswith("derived from xl mlm measured on NVIDIA A100-SXM4-80GB (torch")
    assert xl["throughput_kind"] == "derived" and xl["throughput_card"] == "NVIDIA A100-SXM4-80GB"

    assert main(["plan", "--configfile", "config/paper.yaml", "--throughput", str(out)]) == 0
    table = capsys.readouterr().out
    assert "| uniref50/pmlm-base | 4 |" in table and "| 600,000 |" in table and "600,000*" not in table
    assert f"| {mlm['tokens_per_gpu_second']:,}~ |" in table and "* assumed" not in table
    # the notes name the rows each source prices, and the cards
    assert f"tok/s/GPU of pfam/pmlm-base, uniref50/pmlm-base: measured on {h100_day}.\n" in table
    assert (
        f"~ pfam/mlm-base, uniref50/mlm-base, uniref50/pmlm-large: derived from base pmlm measured on {h100_day}."
        in table
    )
    assert "~ uniref50/pmlm_pair_only-xl: derived from xl mlm measured on NVIDIA A100-SXM4-80GB" in table
    assert "The rates come from 2 cards (NVIDIA A100-SXM4-80GB; NVIDIA H100 80GB HBM3)" in table


def test_the_shipped_file_keeps_every_byte_but_its_section(tmp_path, capsys):
    shipped = Path("config/throughput.yaml").read_text()
    out = tmp_path / "throughput.yaml"
    out.write_text(shipped)
    assert main(["throughput", str(result_file(tmp_path / "r.json")), "-o", str(out)]) == 0
    written = out.read_text()
    body = written[written.index("\ntokens_per_gpu_second:\n") + 1 : written.index("\n\n# Inference") + 1]
    assert written == shipped.replace("tokens_per_gpu_second: {}\n", body) and "600000" in body
    # a throughput file holding only the inference section: kept whole, the section added above it
    inference = "# measured on one H100\ninference_flops_per_gpu_second: {bf16: 2.5e+14}\n"
    out.write_text(inference)
    assert main(["throughput", str(result_file(tmp_path / "r.json")), "-o", str(out)]) == 0
    assert out.read_text().endswith("\n" + inference) and "tokens_per_second: 600000" in out.read_text()
    capsys.readouterr()


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
        ('{"device": "NVIDIA H100", "rows": []}', "no rows"),
        ('{"rows": [{"dims": "base"}]}', "names no device"),
        ('{"device": "cpu", "rows": [{"dims": "base"}]}', "measured on a CPU"),
        ('{"device": "NVIDIA H100", "rows": [3]}', "row 0: not an object"),
        ('{"device": "NVIDIA H100", "rows": [{"model": "ours", "out_of_memory": true}]}', "no row of ours"),
        (
            '{"device": "NVIDIA H100", "rows": [{"dims": "base", "model": "ours", "objective": "bert", '
            '"non_pad_tokens_per_s": 5}]}',
            "row 0: objective 'bert'",
        ),
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
    # what exists and is not a throughput file (binary, not YAML, another config) is refused and left as it was
    foreign = tmp_path / "binary.yaml"
    foreign.write_bytes(b"\0\1\2")
    assert main(["throughput", str(cpu), "-o", str(foreign), "--allow-cpu"]) == 2
    assert "was not written by this command" in capsys.readouterr().err and foreign.read_bytes() == b"\0\1\2"
    for text in ("a: [\n", Path("config/paper.yaml").read_text()):
        foreign.write_text(text)
        assert main(["throughput", str(cpu), "-o", str(foreign), "--allow-cpu"]) == 2
        err = capsys.readouterr().err
        assert "exists and is not a throughput file" in err and len(err.splitlines()) == 1
        assert foreign.read_text() == text
    assert main(["throughput", str(cpu), "-o", str(foreign), "--allow-cpu", "--overwrite"]) == 0
    assert set(yaml.safe_load(foreign.read_text())) == {"tokens_per_gpu_second", "inference_flops_per_gpu_second"}
    assert main(["throughput", str(cpu), "-o", str(tmp_path), "--allow-cpu"]) == 2
    assert "is a folder" in capsys.readouterr().err


def test_a_rate_names_a_real_objective(tmp_path, capsys):
    table = tmp_path / "throughput.yaml"
    table.write_text("tokens_per_gpu_second: {base: {tokens_per_second: 5}}\n")
    assert main(["plan", "--recipe", "config/train/base.yaml", "--gpus", "4", "--throughput", str(table)]) == 2
    err = capsys.readouterr().err
    assert "tokens_per_gpu_second.base.tokens_per_second: not an objective" in err and len(err.splitlines()) == 1
