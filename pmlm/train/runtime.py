"""The pieces of a training run around the engine's loop (``train.engine``): the precision a trained model is
evaluated at, the stop signals, the divergence stop, the ``metrics.csv`` (+ TensorBoard) log and the
per-rank random streams' seeds."""

from __future__ import annotations

import csv
import signal
import sys
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

import numpy as np
import torch

from pmlm.choices import Device, Precision
from pmlm.errors import ConfigError, PmlmError
from pmlm.files import atomic_output
from pmlm.train import METRICS_CSV as METRICS_CSV  # the log's name, re-exported for train.engine
from pmlm.train.checkpoint import latest_checkpoint

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class TrainingDiverged(PmlmError):
    """The loss or gradient became NaN / inf; the run stops without saving."""


DTYPES = {Precision.FP32: torch.float32, Precision.BF16: torch.bfloat16}  # what a precision's forward passes compute in


def autocast(precision: Precision, device: torch.device) -> Callable[[], AbstractContextManager]:
    """A fresh context per forward pass: bf16 autocast under ``precision`` on ``device`` (``Precision.on``), else
    none."""
    if precision.on(device.type) is Precision.FP32:
        return nullcontext
    return lambda: torch.autocast(device.type, dtype=torch.bfloat16)


def evaluation_precision(
    device: torch.device, recorded: Precision, asked: Precision = Precision.AUTO, *, trained: str, command: str
) -> Precision:
    """The precision a trained model's forward passes use when it is evaluated, scored or embedded: ``asked``
    (``--precision``), or with ``auto`` the one the run ``recorded`` (``pmlm.artefacts.recorded_precision``), so a
    model is read in the arithmetic it was trained in. bf16 runs on CUDA only: asked for on another device it is an
    error; merely recorded, ``command`` says once on stderr that ``trained`` (``the head``, ``the encoder``) is read
    in fp32 there."""
    asked = Precision.parse(asked, "--precision")  # the Python API's name
    chosen = recorded if asked is Precision.AUTO else asked
    if chosen is Precision.BF16 and device.type != Device.CUDA:
        if asked is Precision.BF16:
            raise ConfigError(f"--precision bf16 needs a CUDA device, and this runs on {device.type}; use fp32 or auto")
        print(
            f"{command}: {trained} was trained in bf16, which runs on CUDA only: computing in fp32 on {device.type}",
            file=sys.stderr,
        )
        chosen = Precision.FP32
    return chosen


class StopSignals:
    """SIGTERM / SIGUSR1 only record the signal; the loop acts on it at the next step boundary.

    ``install()`` in the main thread (elsewhere signals cannot be caught and nothing is installed);
    ``restore()`` puts the previous handlers back.
    """

    def __init__(self) -> None:
        self.received: int | None = None
        self._previous: dict = {}

    def install(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.signal(sig, self._handle) for sig in STOP_SIGNALS}
        return self

    def _handle(self, signum, frame) -> None:
        self.received = signum

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}


def stop_if_diverged(finite: bool, step: int, loss, out_dir: Path) -> None:
    """Raise TrainingDiverged for step ``step`` (0-based) unless ``finite``; ``loss`` (or None) is read only then."""
    if not finite:
        said = f" (loss {float(loss):.4g})" if loss is not None else ""
        raise TrainingDiverged(
            f"non-finite loss or gradient at step {step + 1}{said}; "
            f"stopped without saving; last good checkpoint: {latest_checkpoint(out_dir) or 'none'}"
        )


def weights_diverged(step: int, out_dir: Path) -> TrainingDiverged:
    """The error of weights found non-finite after step ``step`` (1-based), before they are saved."""
    return TrainingDiverged(
        f"non-finite weights after step {step}; stopped without saving; "
        f"last good checkpoint: {latest_checkpoint(out_dir) or 'none'}"
    )


class MetricsLog:
    """``metrics.csv`` (+ TensorBoard under ``tensorboard_dir``); a resumed run first drops the rows past
    its checkpoint, so the log reads as one run."""

    def __init__(self, path: Path, fields: tuple[str, ...], start_step: int, tensorboard_dir: Path | None = None):
        self.started = time.perf_counter()
        kept = []
        if path.exists():
            with open(path, newline="") as fh:
                kept = [r for r in csv.DictReader(fh) if r.get("step", "").isdigit() and int(r["step"]) <= start_step]
        with atomic_output(path) as tmp, open(tmp, "w", newline="") as fh:
            writer = csv.DictWriter(fh, fields, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(kept)
        self.fh = open(path, "a", newline="")
        self.csv = csv.DictWriter(self.fh, fields, extrasaction="ignore")
        self.tb = None
        if tensorboard_dir is not None:
            # imported only when asked for: TensorBoard's import is slow and fine-tuning never uses it
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(tensorboard_dir), purge_step=start_step + 1 if start_step else None)

    def write(self, row: dict, scalars: dict[str, float] | None = None) -> None:
        """One CSV row (floats to 6 significant digits, None empty); ``scalars`` go to TensorBoard at the row's step."""
        row = {k: "" if v is None else (f"{v:.6g}" if isinstance(v, float) else v) for k, v in row.items()}
        row["elapsed_s"] = f"{time.perf_counter() - self.started:.1f}"
        self.csv.writerow(row)
        self.fh.flush()  # readable while the run goes on (and by the tests that interrupt it)
        if self.tb is not None and scalars:
            for key, value in scalars.items():
                self.tb.add_scalar(key, value, row["step"])
            self.tb.flush()

    def close(self) -> None:
        self.fh.close()
        if self.tb is not None:
            self.tb.close()


def derived_seed(seed: int, rank: int, stream: int) -> int:
    """Seed of an independent random stream per (seed, rank, stream)."""
    return int(np.random.SeedSequence([seed, rank, stream]).generate_state(1)[0])
