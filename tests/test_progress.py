"""Progress reporting: lines at each tenth and at a fixed interval off a terminal, one redrawn bar on a
terminal, and a short pre-training run whose log (stderr to a file, as a rule's ``> {log} 2>&1``) shows them."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys

import yaml
from conftest import make_sequences, write_shards

from pmlm.progress import Progress, duration

LINE = re.compile(r"^pmlm pretrain: (\d+)/(\d+) steps \((\d+)%\) loss (\S+) lr \S+ tokens/s \S+ elapsed \d+:\d\d:\d\d")


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _lines(stream: io.StringIO) -> list[str]:
    return stream.getvalue().splitlines()


def test_a_line_at_every_tenth_with_rate_elapsed_and_eta():
    clock, out = Clock(), io.StringIO()
    progress = Progress(
        "pmlm pretrain",
        200,
        unit="steps",
        rates=("tokens",),
        each_tenth=True,
        stream=out,
        tty=False,
        every_s=3600,
        clock=clock,
    )
    for step in range(1, 201):
        clock.now += 0.5
        progress.update(step, loss=2.0, tokens=100 * step)
    progress.close()
    lines = _lines(out)
    assert [line.split()[2] for line in lines] == [f"{20 * k}/200" for k in range(1, 11)]
    assert lines[0] == "pmlm pretrain: 20/200 steps (10%) loss 2 tokens/s 200 elapsed 0:00:10 eta 0:01:30"
    assert lines[-1].endswith("(100%) loss 2 tokens/s 200 elapsed 0:01:40")  # no ETA once done


def test_time_based_lines_without_a_total_and_a_final_line():
    clock, out = Clock(), io.StringIO()
    progress = Progress("pmlm ingest", stream=out, tty=False, every_s=60, clock=clock)
    for _ in range(250_000):
        clock.now += 0.001  # 1,000 records a second
        progress.advance()
    progress.close()
    lines = _lines(out)
    # lines after each minute (the clock is read every few hundred records), then the final count
    assert len(lines) == 5, lines
    assert all(re.fullmatch(r"pmlm ingest: [\d,]+ records \(1,000/s\) elapsed 0:0\d:\d\d", x) for x in lines), lines
    assert lines[-1] == "pmlm ingest: 250,000 records (1,000/s) elapsed 0:04:10"


def test_a_quick_record_count_writes_only_its_final_line():
    """Without each_tenth (data steps, evaluation): lines by time only, so a fast pass adds one line."""
    clock, out = Clock(), io.StringIO()
    progress = Progress("pmlm split: writing", 1000, stream=out, tty=False, every_s=60, clock=clock)
    for _ in range(1000):
        clock.now += 0.01
        progress.advance()
    progress.close()
    assert _lines(out) == ["pmlm split: writing: 1,000/1,000 records (100%) elapsed 0:00:10"]


def test_lazy_fields_are_read_only_when_a_line_is_written():
    clock, out, reads = Clock(), io.StringIO(), []

    def loss():
        reads.append(1)
        return 1.5

    progress = Progress(
        "pmlm finetune", 1000, unit="steps", each_tenth=True, stream=out, tty=False, every_s=3600, clock=clock
    )
    for step in range(1, 1001):
        progress.update(step, loss=loss)
    assert len(reads) == len(_lines(out)) == 10


def test_resumed_run_counts_eta_from_its_own_start():
    clock, out = Clock(), io.StringIO()
    progress = Progress(
        "pmlm pretrain", 100, unit="steps", start=50, each_tenth=True, stream=out, tty=False, every_s=3600, clock=clock
    )
    clock.now = 10.0
    progress.update(60)
    assert _lines(out) == ["pmlm pretrain: 60/100 steps (60%) elapsed 0:00:10 eta 0:00:40"]


def test_bytes_and_a_terminal_bar():
    clock, out = Clock(), io.StringIO()
    progress = Progress("pmlm fetch x", unit="bytes", stream=out, tty=True, clock=clock)
    for k in range(1, 5):
        clock.now += 1
        progress.update(k * 2**20, 4 * 2**20)
    progress.close()
    text = out.getvalue()
    assert text.count("\n") == 1 and text.endswith("\n")  # one bar, redrawn in place, ended once
    frames = text.split("\r\033[K")[1:]
    assert len(frames) == 4
    assert frames[-1] == "pmlm fetch x: [########################] 4.0/4.0 MiB (100%, 1.0 MiB/s) elapsed 0:00:04\n"
    assert frames[1].startswith("pmlm fetch x: [############............] 2.0/4.0 MiB (50%")


def test_duration():
    assert duration(0) == "0:00:00" and duration(3599.6) == "1:00:00" and duration(50 * 3600 + 61) == "50:01:01"


def test_pretraining_log_has_a_progress_line_per_tenth(tmp_path):
    """What a rule's `> {log} 2>&1` captures from a short pre-training run: a line at each tenth of the run."""
    shards = write_shards(
        tmp_path / "shards", {"train": make_sequences(128, seed=1), "valid": make_sequences(32, seed=2)}
    )
    cfg = {
        "model": {"preset": "tiny", "overrides": {"num_layers": 1, "hidden": 32, "ffn": 64, "heads": 2, "max_len": 64}},
        "optim": {"lr": 3e-3, "warmup_steps": 2, "total_steps": 30},
        "tokens_per_step": 512,
        "log_every": 7,
        "eval_every": 30,
        "eval_batches": 2,
        "save_every": 30,
        "tensorboard": False,
        "device": "cpu",
    }
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    log_path = tmp_path / "pretrain.log"
    with open(log_path, "w") as log:
        code = subprocess.run(
            [
                sys.executable,
                "-m",
                "pmlm",
                "pretrain",
                "--config",
                str(tmp_path / "cfg.yaml"),
                "--shards",
                str(shards),
                "--out",
                str(tmp_path / "run"),
                "--final",
                str(tmp_path / "model.safetensors"),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            timeout=300,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        ).returncode
    text = log_path.read_text()
    assert code == 0, text
    steps = [int(m.group(1)) for m in map(LINE.match, text.splitlines()) if m]
    assert steps == [3 * k for k in range(1, 11)], text
    assert "\r" not in text  # plain lines in a file, no bar
