"""A rerun reruns: a checkpoint is resumed only by the run it belongs to (its settings and data, pmlm.train.run_folder);
a run with other settings or data starts afresh and moves the old checkpoints aside; ``--extend`` continues a run
on purpose. A stop that makes no progress twice in a row fails instead of asking for another requeue, and a
diverged run never asks for one. Last, the same through Snakemake: a changed setting retrains, a killed run resumes.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from conftest import make_sequences, write_shards
from safetensors.torch import load_file
from tiny_models import make_encoder, recipe, write_structures

import pmlm.train.pretrain as pretrain_module
from pmlm.cli import main
from pmlm.config.finetuning import FinetuneConfig
from pmlm.config.pretraining import NOT_IN_FINGERPRINT, TrainConfig
from pmlm.config.tree import apply_override
from pmlm.errors import ConfigError, PmlmError
from pmlm.files import run_record
from pmlm.finetune.finetune import FinetuneHooks, finetune
from pmlm.train import REQUEUE_EXIT_CODE
from pmlm.train.checkpoint import list_checkpoints
from pmlm.train.pretrain import TrainHooks, train
from pmlm.train.run_folder import NO_PROGRESS_LIMIT, STOPS_FILE, NoProgress, changed_settings
from pmlm.train.runtime import StopSignals, TrainingDiverged

REPO = Path(__file__).resolve().parents[1]

# every in-process test of this module runs torch on one thread (conftest.single_thread)
single_thread = pytest.mark.usefixtures("single_thread")


def _config(*sets: str) -> TrainConfig:
    """Four steps of a model small enough for CPU steps of milliseconds, changed by ``a.b=value`` items."""
    values = {
        "model": {"preset": "tiny", "overrides": {"num_layers": 1, "hidden": 16, "ffn": 32, "heads": 2, "max_len": 64}},
        "optim": {"lr": 3e-3, "warmup_steps": 1, "total_steps": 4},
        "tokens_per_step": 256,
        "data": {"buffer_rows": 32, "num_workers": 0},
        "log_every": 1,
        "eval_every": 0,
        "eval_batches": 1,
        "save_every": 2,
        "keep_last_checkpoints": 10,
        "tensorboard": False,
        "device": "cpu",
    }
    for item in sets:
        apply_override(values, item)
    return TrainConfig.from_dict(values)


def _stop_at(step: int) -> TrainHooks:
    """SIGTERM to this process after optimizer step ``step``: the run saves and exits for a requeue."""

    def after_step(done, model):
        if done == step:
            os.kill(os.getpid(), signal.SIGTERM)

    return TrainHooks(after_step=after_step)


def _steps(out: Path) -> list[int]:
    return [s for s, _ in list_checkpoints(out)]


def _logged_steps(out: Path) -> list[int]:
    with open(out / "metrics.csv", newline="") as fh:
        return [int(r["step"]) for r in csv.DictReader(fh) if r["split"] == "train"]


def _same(a: Path, b: Path) -> bool:
    wa, wb = load_file(a), load_file(b)
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def test_the_fingerprint_leaves_out_bookkeeping_only():
    base = run_record(_config().to_dict(), NOT_IN_FINGERPRINT, shards="a", precision="fp32")
    kept = _config(
        "log_every=3", "eval_every=2", "save_every=1", "keep_last_checkpoints=1", "tensorboard=true",
        "data.num_workers=2", "device=auto", "compile=true", "attention=padded", "fsdp=true",
        "data.tokens_per_batch=128",  # the micro-batch: how the step's batch is split, not what it holds
    )  # fmt: skip
    assert run_record(kept.to_dict(), NOT_IN_FINGERPRINT, shards="a", precision="fp32") == base
    for item in (
        "optim.lr=0.001", "optim.total_steps=5", "seed=2", "eval_batches=2", "model.overrides.norm=pre",
        "tokens_per_step=512",
    ):  # fmt: skip
        changed = run_record(_config(item).to_dict(), NOT_IN_FINGERPRINT, shards="a", precision="fp32")
        assert changed_settings(base, changed) == [item.split("=")[0]]
    for inputs in ({"shards": "b", "precision": "fp32"}, {"shards": "a", "precision": "bf16"}):
        changed = run_record(_config().to_dict(), NOT_IN_FINGERPRINT, **inputs)
        assert changed["fingerprint"] != base["fingerprint"]


@single_thread
def test_bookkeeping_changes_and_the_same_shards_elsewhere_resume(tmp_path, shard_dir, capsys):
    reference = tmp_path / "reference" / "model.safetensors"
    assert train(_config(), shard_dir, tmp_path / "reference", final_path=reference) == 0

    out, final = tmp_path / "run", tmp_path / "run" / "model.safetensors"
    assert train(_config(), shard_dir, out, hooks=_stop_at(2)) == REQUEUE_EXIT_CODE
    moved = shutil.copytree(shard_dir, tmp_path / "elsewhere")  # the same data under another path
    capsys.readouterr()
    bookkeeping = ("log_every=2", "save_every=3", "keep_last_checkpoints=1", "tensorboard=true", "data.num_workers=1")
    assert train(_config(*bookkeeping), moved, out, final_path=final) == 0
    assert f"resuming from {out / 'checkpoints' / 'step-2'} (step 2)" in capsys.readouterr().err
    assert not list(out.glob("checkpoints.superseded-*"))
    assert _same(reference, final)


@single_thread
@pytest.mark.parametrize("change", ["optim.lr=0.001", "optim.total_steps=6", "seed=2", "shards"])
def test_a_changed_setting_or_data_starts_afresh_and_keeps_the_old_run_aside(tmp_path, shard_dir, capsys, change):
    out = tmp_path / "run"
    assert train(_config(), shard_dir, out, final_path=tmp_path / "old.safetensors") == 0
    shards, sets = shard_dir, [change]
    if change == "shards":
        other = {"train": make_sequences(256, seed=11), "valid": make_sequences(64, seed=12)}
        shards, sets = write_shards(tmp_path / "other-shards", other), []
    capsys.readouterr()
    assert train(_config(*sets), shards, out, final_path=tmp_path / "new.safetensors") == 0
    err = capsys.readouterr().err
    key = change.split("=")[0]
    line = next(line for line in err.splitlines() if "starting afresh" in line)
    assert line == (
        f"pmlm pretrain: starting afresh: {out / 'checkpoints' / 'step-4'} belongs to another run ({key} "
        + line.split(f"({key} ", 1)[1].split(")", 1)[0]
        + f"); its checkpoints and metrics.csv moved to {out / 'checkpoints.superseded-1'}"
    )
    aside = out / "checkpoints.superseded-1"
    assert sorted(p.name for p in aside.iterdir()) == ["metrics.csv", "step-2", "step-4"]
    assert _logged_steps(out)[0] == 1 and "resuming" not in err
    # trained with the new setting from scratch: what a clean folder gives, not the old model
    clean = tmp_path / "clean.safetensors"
    assert train(_config(*sets), shards, tmp_path / "clean", final_path=clean) == 0
    assert _same(clean, tmp_path / "new.safetensors")
    assert not _same(tmp_path / "old.safetensors", tmp_path / "new.safetensors")


@single_thread
def test_extend_continues_a_finished_run_under_more_steps_only(tmp_path, shard_dir, capsys):
    out = tmp_path / "run"
    assert train(_config(), shard_dir, out) == 0
    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text(json.dumps(_config().to_dict()))  # JSON is YAML
    command = ["pretrain", "--config", str(cfg_path), "--shards", str(shard_dir), "--out", str(out)]
    capsys.readouterr()
    final = tmp_path / "model.safetensors"
    assert main([*command, "--final", str(final), "--extend", "--set", "optim.total_steps=6"]) == 0
    err = capsys.readouterr().err
    assert f"pmlm pretrain: extending {out / 'checkpoints' / 'step-4'}: optim.total_steps 4 -> 6" in err
    assert _logged_steps(out) == [1, 2, 3, 4, 5, 6] and _steps(out) == [2, 4, 6]
    assert json.loads(final.with_suffix(".json").read_text())["step"] == 6

    with pytest.raises(ConfigError, match=r"--extend continues a run under a changed optim.total_steps only; "
                                          r".*step-6 differs in optim.lr 0.003 -> 0.001: restore"):  # fmt: skip
        train(_config("optim.total_steps=8", "optim.lr=0.001"), shard_dir, out, extend=True)
    with pytest.raises(ConfigError, match=r"--extend: .*empty.*checkpoints holds no checkpoint to continue"):
        train(_config(), shard_dir, tmp_path / "empty", extend=True)


@single_thread
def test_finetuning_resumes_only_its_own_run(tmp_path, capsys):
    encoder = make_encoder(tmp_path / "enc" / "model.safetensors", dropout=0.1)
    data = write_structures(tmp_path / "train.jsonl", 24, seed=1)
    cfg = FinetuneConfig.from_dict(recipe(optim__total_steps=4, save_every=2))
    reference = tmp_path / "reference.safetensors"
    assert finetune(cfg, encoder, data, tmp_path / "reference", reference) == 0

    def stop_at_2(step, model):
        if step == 2:
            os.kill(os.getpid(), signal.SIGTERM)

    out, final = tmp_path / "run", tmp_path / "head.safetensors"
    assert finetune(cfg, encoder, data, out, final, hooks=FinetuneHooks(after_step=stop_at_2)) == REQUEUE_EXIT_CODE
    capsys.readouterr()
    assert finetune(FinetuneConfig.from_dict(recipe(optim__total_steps=4, log_every=2)), encoder, data, out, final) == 0
    assert "resuming from" in capsys.readouterr().err and _same(reference, final)

    other_encoder = make_encoder(tmp_path / "enc2" / "model.safetensors", dropout=0.1, seed=5)
    other_data = write_structures(tmp_path / "train2.jsonl", 24, seed=2)
    changes = [
        ("optim.head_lr", FinetuneConfig.from_dict(recipe(optim__total_steps=4, optim__head_lr=0.05)), encoder, data),
        ("encoder", cfg, other_encoder, data),
        ("train", cfg, other_encoder, other_data),
    ]
    for n, (key, changed, enc, train_file) in enumerate(changes, start=1):
        assert finetune(changed, enc, train_file, out, final) == 0
        err = capsys.readouterr().err
        assert f"belongs to another run ({key} " in err and f"checkpoints.superseded-{n}" in err


class SignalledAtStartUp(StopSignals):
    """The stop signal of a job that meets its time limit during start-up: a real SIGUSR1, delivered as soon as
    the trainer listens for it, before its first step."""

    def install(self) -> StopSignals:
        super().install()
        os.kill(os.getpid(), signal.SIGUSR1)
        return self


@single_thread
def test_stops_without_progress_end_the_requeues(tmp_path, shard_dir, monkeypatch, capsys):
    out = tmp_path / "run"
    command = ["pretrain", "--config", str(tmp_path / "cfg.yaml"), "--shards", str(shard_dir), "--out", str(out)]
    command += ["--final", str(tmp_path / "model.safetensors")]
    (tmp_path / "cfg.yaml").write_text(json.dumps(_config().to_dict()))

    def stops() -> list[bool]:
        return [s["progress"] for s in json.loads((out / STOPS_FILE).read_text())["stops"]]

    with monkeypatch.context() as patch:
        patch.setattr(pretrain_module, "StopSignals", SignalledAtStartUp)
        assert main(command) == REQUEUE_EXIT_CODE  # stopped during start-up: nothing to save, requeue once more
        assert _steps(out) == [] and stops() == [False]
        assert "SIGUSR1 received; nothing saved since step 0; exiting with 99" in capsys.readouterr().err
        assert main(command) == 2
        err = capsys.readouterr().err  # the progress line of where the run stands, then the one-line error
        assert err.splitlines(keepends=True)[-1] == (
            f"pmlm pretrain: error: SIGUSR1 received; stopped {NO_PROGRESS_LIMIT} times in a row without saving a "
            "checkpoint newer than none (step 0); not asking for a requeue, which would end the same way: give the "
            "job more time before its stop signal, then rerun to resume\n"
        )
    # a stop after a step makes progress, and the count starts again
    assert train(_config(), shard_dir, out, hooks=_stop_at(2)) == REQUEUE_EXIT_CODE
    assert stops() == [False, False, True] and _steps(out) == [2]
    with monkeypatch.context() as patch:
        patch.setattr(pretrain_module, "StopSignals", SignalledAtStartUp)
        assert train(_config(), shard_dir, out) == REQUEUE_EXIT_CODE
        with pytest.raises(NoProgress, match=rf"newer than {out / 'checkpoints' / 'step-2'} \(step 2\)"):
            train(_config(), shard_dir, out)
    # the run itself is intact: rerun, it resumes and finishes, and its chain of stops is over
    assert train(_config(), shard_dir, out) == 0
    assert _steps(out) == [2, 4] and not (out / STOPS_FILE).exists()


@single_thread
def test_a_diverged_run_never_asks_for_a_requeue(tmp_path, shard_dir):
    """Weights gone non-finite at the step a stop signal arrives: the stop's save is refused and the run fails."""

    def poison_and_stop(step, model):
        if step == 3:
            with torch.no_grad():
                next(model.parameters()).fill_(float("nan"))
            os.kill(os.getpid(), signal.SIGTERM)

    with pytest.raises(TrainingDiverged, match=r"non-finite weights after step 3; .*step-2") as failed:
        train(_config(), shard_dir, tmp_path / "run", hooks=TrainHooks(after_step=poison_and_stop))
    assert isinstance(failed.value, PmlmError)  # the CLI's one line and exit 2, never 99
    assert _steps(tmp_path / "run") == [2] and not (tmp_path / "run" / STOPS_FILE).exists()


# -- the same through Snakemake: the demo workflow's pre-training of the PMLM ------------------------------------

SNAKEMAKE = shutil.which("snakemake", path=os.path.dirname(sys.executable)) or shutil.which("snakemake")
SHORT = {
    "optim.total_steps": 16,
    "optim.warmup_steps": 2,
    "eval_every": 0,
    "eval_batches": 2,
    "save_every": 4,
    "log_every": 4,
}
MODEL = "results/demo/pretrain/demo/pmlm-tiny/model.safetensors"
RUN_DIR = "results/demo/pretrain_runs/demo/pmlm-tiny"
LOG = "logs/demo/pretrain/demo/pmlm-tiny.log"


def _snakemake(workdir: Path, *settings: str, target: str = MODEL, **popen) -> subprocess.CompletedProcess:
    """``snakemake --cores 2 TARGET`` on the repository's Snakefile and demo config in ``workdir``, with
    ``pretrain.set`` items (``key: value``) added to SHORT or replacing its own. The data stage leaves out the
    decontamination search (most of its time; tests/test_workflow.py's demo test runs it): what these tests need is the
    pre-training's shards."""
    overrides = dict(SHORT)
    for setting in settings:
        key, value = setting.split(": ", 1)
        overrides[key] = yaml.safe_load(value)
    short = workdir / "short.yaml"
    short.write_text(yaml.safe_dump({"pretrain": {"set": overrides}, "datasets": {"demo": {"decontaminate": []}}}))
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    args = [SNAKEMAKE, "--cores", "2", "-s", str(REPO / "Snakefile"), "--directory", str(workdir)]
    args += ["--configfile", str(REPO / "config" / "config.yaml"), str(short), "--", target]
    if popen:  # in a process group of its own, as a terminal (or `timeout`) starts it
        return subprocess.Popen(
            args,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
            preexec_fn=_interruptible,
        )
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=600)


def _interruptible() -> None:
    """Ctrl-C's default action in the child, as a terminal gives it: a shell without job control starts background
    commands (a CI runner's, say) with SIGINT ignored, and that would be inherited by Snakemake and its jobs."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory) -> tuple[Path, str]:
    """The demo's data stage and an uninterrupted pre-training of its PMLM (SHORT): (folder, weights' sha256)."""
    workdir = tmp_path_factory.mktemp("workflow")
    done = _snakemake(workdir)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return workdir, _sha256(workdir / MODEL)


@pytest.mark.slow
def test_a_changed_setting_retrains_through_snakemake(demo_run, tmp_path):
    workdir = Path(shutil.copytree(demo_run[0], tmp_path / "w", symlinks=True))
    hashes = [demo_run[1]]
    for n, setting in enumerate(("optim.lr: 1.0e-3", "seed: 2"), start=1):
        done = _snakemake(workdir, setting)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        log = (workdir / LOG).read_text()
        assert "starting afresh" in log and f"checkpoints.superseded-{n}" in log and "resuming" not in log
        hashes.append(_sha256(workdir / MODEL))
    assert len(set(hashes)) == 3
    assert sorted(p.name for p in (workdir / RUN_DIR).glob("checkpoints.superseded-*")) == [
        "checkpoints.superseded-1",
        "checkpoints.superseded-2",
    ]


@pytest.mark.slow
def test_snakemake_stopped_mid_training_resumes_to_the_same_weights(demo_run, tmp_path):
    workdir = tmp_path / "w"
    # the data stage only: the pre-training's outputs, run folder and log are left behind
    shutil.copytree(demo_run[0], workdir, symlinks=True, ignore=shutil.ignore_patterns("pretrain", "pretrain_runs"))
    proc = _snakemake(workdir, popen=True)
    checkpoint = workdir / RUN_DIR / "checkpoints" / "step-4"
    deadline = time.monotonic() + 300
    while not checkpoint.is_dir():
        assert proc.poll() is None, proc.stdout.read()[-3000:]
        assert time.monotonic() < deadline, "no checkpoint within 300 s"
        time.sleep(0.05)
    # Ctrl-C: SIGINT to Snakemake and its jobs (design.md: Snakemake waits for its jobs on SIGTERM)
    os.killpg(proc.pid, signal.SIGINT)
    proc.communicate(timeout=120)
    assert not (workdir / MODEL).exists()

    done = _snakemake(workdir)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "pmlm pretrain: resuming from" in (workdir / LOG).read_text()
    assert _sha256(workdir / MODEL) == demo_run[1]
