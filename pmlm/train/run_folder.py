"""A run folder's own records: which run its checkpoints belong to, and what each stop achieved.

**A checkpoint is resumed only by the run it belongs to.** Every checkpoint holds ``run.json``: the settings and
inputs that determine the run's result, flattened to dotted keys (``optim.lr``, ``seed``, ``shards``, ...), and
their sha256, the run's fingerprint. A run resumes from the newest checkpoint only if that checkpoint's settings
are its own; otherwise it starts afresh, and the other run's checkpoints, ``metrics.csv``, TensorBoard events and
stop record are moved, not deleted, to ``checkpoints.superseded-<n>/`` beside them. ``--extend`` continues a run
on purpose under a changed ``optim.total_steps``, and nothing else. The number of ranks is not a setting of the run:
a pre-training step's batch is the recipe's whatever the hardware (``train.step_layout``), so a checkpoint resumes
on another number of GPUs by itself.

**A requeue only when it can help.** ``stops.json`` records each stop (SIGTERM / SIGUSR1 -> save -> exit 99): the
step it started from and the step it saved. A stop that saved no newer checkpoint than the stop before it (or,
the first, than the checkpoint it started from) made no progress; after ``NO_PROGRESS_LIMIT`` such stops in a row
the trainer fails with one line instead of asking for another requeue that would end the same way. A stop during
start-up, before the first step, saves nothing and so counts as no progress. A finished run removes the record.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import signal
import sys
from pathlib import Path

import torch.distributed as dist

from pmlm.artefacts import write_encoder
from pmlm.errors import ConfigError, PmlmError
from pmlm.files import atomic_output, file_digest
from pmlm.train import METRICS_CSV, REQUEUE_EXIT_CODE
from pmlm.train.checkpoint import CHECKPOINTS, RUN_FILE, checkpoint_root, latest_checkpoint
from pmlm.version import versions

NO_PROGRESS_LIMIT = 2  # stops in a row without a newer checkpoint before the trainer gives up on requeues
STOPS_FILE = "stops.json"
SUPERSEDED = CHECKPOINTS + ".superseded-{n}"
# what `--extend` may change: the run's length
EXTENDABLE = ("optim.total_steps",)
SCORES_JSON = "final_scores.json"  # a pre-training run's final validation scores (when --scores names no file)
INDUCTOR_CACHE = "inductor-cache"  # the run folder's cache of compiled kernels (compile: true)
TENSORBOARD_DIR = "tb"  # the run folder's TensorBoard events (tensorboard: true)
WORKFLOW_LOG = "train.log"  # every run of the workflow's rule, teed there (workflow/rules/pretrain.smk, finetune.smk)
# besides the checkpoints, what a run folder holds of its run, moved aside with them
_RUN_RECORDS = (METRICS_CSV, TENSORBOARD_DIR, STOPS_FILE)
# everything a run keeps in its folder (glob patterns): a folder holding only these is the run's own, and resumed
# (pmlm.outputs.run_folder_target)
RUN_FOLDER_NAMES = (CHECKPOINTS, SUPERSEDED.format(n="*"), *_RUN_RECORDS, SCORES_JSON, INDUCTOR_CACHE, WORKFLOW_LOG)
_KEPT_STOPS = 20


class NoProgress(PmlmError):
    """Stopped NO_PROGRESS_LIMIT times in a row without saving a newer checkpoint: a requeue would not help."""


def content_digest(path: str | Path) -> str:
    """sha256 of a file, or of a folder's files (each one's relative name and sha256; LMDB's ``lock.mdb``, which
    readers write to, left out): the identity of an input whatever its path."""
    path = Path(path)
    if path.is_file():
        return file_digest(path)
    digest = hashlib.sha256()
    for child in sorted(p for p in path.rglob("*") if p.is_file() and p.name != "lock.mdb"):
        digest.update(f"{child.relative_to(path).as_posix()}\0{file_digest(child)}\n".encode())
    return digest.hexdigest()


def read_run_record(checkpoint: Path) -> dict | None:
    """The record a checkpoint was saved with; None if it has none (or an unreadable one)."""
    try:
        record = json.loads((checkpoint / RUN_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return record if isinstance(record, dict) and isinstance(record.get("settings"), dict) else None


def changed_settings(saved: dict | None, now: dict) -> list[str]:
    """The dotted keys whose values differ between two records (every key when ``saved`` is None)."""
    if saved is None:
        return sorted(now["settings"])
    old, new = saved["settings"], now["settings"]
    return sorted(k for k in old.keys() | new.keys() if old.get(k, _ABSENT) != new.get(k, _ABSENT))


_ABSENT = object()


def _describe(saved: dict | None, now: dict, keys: list[str]) -> str:
    """``optim.lr 0.002 -> 0.0001, seed 1 -> 2`` (three at most), or why there is nothing to compare."""
    if saved is None:
        return "it records no run settings"

    def short(value) -> str:
        text = "unset" if value is _ABSENT else json.dumps(value, default=str)
        return text if len(text) <= 24 else text[:12] + "..."

    old, new = saved["settings"], now["settings"]
    parts = [f"{k} {short(old.get(k, _ABSENT))} -> {short(new.get(k, _ABSENT))}" for k in keys[:3]]
    return ", ".join(parts) + (f" and {len(keys) - 3} more" if len(keys) > 3 else "")


def own_checkpoint(
    out_dir: Path, record: dict, command: str, *, extend: bool = False, rank: int = 0, world: int = 1
) -> Path | None:
    """The checkpoint this run resumes from: the newest in ``out_dir`` if it belongs to this run (or, with
    ``extend``, differs from it only in EXTENDABLE settings). Another run's checkpoints are moved aside (rank 0,
    with every rank waiting) and None is returned: the run starts afresh. Each outcome is announced in one line."""
    latest = latest_checkpoint(out_dir)
    if latest is None:
        if extend:
            raise ConfigError(f"--extend: {checkpoint_root(out_dir)} holds no checkpoint to continue")
        return None
    saved = read_run_record(latest)
    changed = changed_settings(saved, record)
    announce = rank == 0
    if not changed:
        return latest
    if extend:
        others = [k for k in changed if k not in EXTENDABLE]
        if saved is None or others:
            raise ConfigError(
                f"--extend continues a run under a changed {' or '.join(EXTENDABLE)} only; {latest} differs in "
                f"{_describe(saved, record, others or changed)}: restore those settings, or drop --extend to start "
                "afresh"
            )
        if announce:
            print(f"pmlm {command}: extending {latest}: {_describe(saved, record, changed)}", file=sys.stderr)
        return latest
    if world > 1:
        dist.barrier()  # every rank has read the checkpoints before rank 0 moves them
    if announce:
        aside = set_aside(out_dir)
        print(
            f"pmlm {command}: starting afresh: {latest} belongs to another run ({_describe(saved, record, changed)}); "
            f"its checkpoints and metrics.csv moved to {aside}",
            file=sys.stderr,
        )
    if world > 1:
        dist.barrier()
    return None


def set_aside(out_dir: Path) -> Path:
    """Move ``checkpoints/`` and the run's records beside it to the first free ``checkpoints.superseded-<n>/``."""
    n = 1
    while (out_dir / SUPERSEDED.format(n=n)).exists():
        n += 1
    aside = out_dir / SUPERSEDED.format(n=n)
    checkpoint_root(out_dir).rename(aside)
    for name in _RUN_RECORDS:
        if (out_dir / name).exists():
            shutil.move(out_dir / name, aside / name)
    return aside


def stops_without_progress(out_dir: Path) -> tuple[int, int | None]:
    """(stops in a row at the end of ``stops.json`` that made no progress, the step the last stop saved)."""
    stops = _read_stops(out_dir)
    count = 0
    for stop in reversed(stops):
        if stop["progress"]:
            break
        count += 1
    return count, (stops[-1]["saved"] if stops else None)


def _read_stops(out_dir: Path) -> list[dict]:
    try:
        stops = json.loads((out_dir / STOPS_FILE).read_text())["stops"]
    except (OSError, json.JSONDecodeError, KeyError, TypeError):
        return []
    ok = isinstance(stops, list) and all(isinstance(s, dict) and {"progress", "saved"} <= s.keys() for s in stops)
    return stops if ok else []


def stop_exit(
    out_dir: Path,
    command: str,
    signum: int | None,
    started_from: int,
    saved: int,
    before: tuple[int, int | None],
    announce: bool = True,
) -> int:
    """After a stop signal: record the stop (rank 0: ``announce``) and return REQUEUE_EXIT_CODE, or raise
    NoProgress when this is the NO_PROGRESS_LIMIT-th stop in a row without a newer checkpoint. ``before``: what
    ``stops_without_progress`` said when the run started (every rank decides alike from it)."""
    count, last_saved = before
    progress = saved > (last_saved if last_saved is not None else started_from)
    count = 0 if progress else count + 1
    name = signal.Signals(signum).name if signum else "a stop signal on another rank"
    if announce:
        entry = {"signal": name, "started_from": started_from, "saved": saved, "progress": progress}
        stops = [*_read_stops(out_dir), entry]
        with atomic_output(out_dir / STOPS_FILE) as tmp:
            Path(tmp).write_text(json.dumps({"stops": stops[-_KEPT_STOPS:]}, indent=1) + "\n")
    if count >= NO_PROGRESS_LIMIT:
        last = latest_checkpoint(out_dir)
        raise NoProgress(
            f"{name} received; stopped {count} times in a row without saving a checkpoint newer than "
            f"{last or 'none'} (step {saved}); not asking for a requeue, which would end the same way: give the "
            "job more time before its stop signal, then rerun to resume"
        )
    if announce:
        what = f"saved checkpoint at step {saved}" if progress else f"nothing saved since step {saved}"
        print(
            f"pmlm {command}: {name} received; {what}; exiting with {REQUEUE_EXIT_CODE} so the job can be requeued",
            file=sys.stderr,
        )
    return REQUEUE_EXIT_CODE


def publish_metrics(out_dir: Path, dest: str | Path) -> None:
    """A finished run's metrics log, copied whole to ``dest`` (atomically): the file the workflow declares and the
    training curves read. The run folder's own log stays undeclared, so a failed or requeued job (which Snakemake
    answers by restoring or removing its outputs) never loses rows of the steps its checkpoints keep."""
    with atomic_output(dest) as tmp:
        shutil.copyfile(out_dir / METRICS_CSV, tmp)


def finished(out_dir: Path) -> None:
    """A run that reached its last step: its chain of stops is over."""
    (out_dir / STOPS_FILE).unlink(missing_ok=True)


def write_outputs(
    cfg,
    model,
    step: int,
    valid_metrics: dict,
    final_state: dict,
    arithmetic: str,
    scores_path: Path,
    final_path: str | Path | None,
) -> None:
    """The declared outputs (rank 0): the final validation scores and the encoder artefact."""
    scores = {
        "step": step,
        "split": "valid",
        "objective": cfg.objective.name,
        "model_preset": cfg.model.preset,
        **{
            k: valid_metrics.get(k)
            for k in ("l_mlm", "l_pmlm", "acc_mlm", "acc_pmlm", "dacc", "mlm_total", "pair_total")
        },
    }
    scores.update({k: valid_metrics.get(k) for k in cfg.objective.kind.extra_scores})
    with atomic_output(scores_path) as tmp:
        Path(tmp).write_text(json.dumps(scores, indent=2) + "\n")
    if final_path is not None:
        info = {
            "model": model.cfg.to_dict(),
            "objective": dataclasses.asdict(cfg.objective),
            "step": step,
            "train_config": cfg.to_dict(),
            "final_scores": scores,
            "precision": arithmetic,  # what the forward passes computed in: evaluation runs at it by default
            "versions": versions(),
        }
        write_encoder(final_path, final_state, info)
