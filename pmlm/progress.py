"""Progress of a long command, for people and for logs: a bar redrawn on a terminal, plain lines otherwise.

Off a terminal (a rule's ``> {log} 2>&1``, a SLURM job), a line goes to stderr at least every ``every_s``
seconds (``PMLM_PROGRESS_SECONDS``, default 60) and, for training runs, at every tenth of the total, so a
job's log always says how far it is:
``pmlm pretrain: 120/600 steps (20%) loss 2.913 lr 0.0003 tokens/s 8,120 elapsed 0:01:02 eta 0:04:08``. Field values may be zero-argument callables: they are evaluated only when a line is written
(a loss read back from the GPU then costs a device sync only every so often).
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable
from typing import TextIO

DEFAULT_EVERY_S = 60.0
EVERY_ENV = "PMLM_PROGRESS_SECONDS"
# lines at each tenth of the run: a log never goes more than 10 % of a job without one
STEPS_OF_TOTAL = 10
# a terminal bar is redrawn at most this often
REDRAW_S = 0.2
BAR_WIDTH = 24
# counting calls (one per record) look at the clock only every so often: at most every MAX_STRIDE calls
MAX_STRIDE = 1024
_CHEAP_S = 0.01  # a stride whose calls took less than this doubles


def default_every_s() -> float:
    value = os.environ.get(EVERY_ENV, "").strip()
    try:
        every = float(value) if value else DEFAULT_EVERY_S
    except ValueError:
        every = DEFAULT_EVERY_S
    return every if every > 0 else DEFAULT_EVERY_S


def duration(seconds: float) -> str:
    """H:MM:SS (hours grow past 99 for multi-day jobs)."""
    seconds = max(0, round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def _number(value) -> str:
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if not math.isfinite(value) or value == 0:
            return f"{value:g}"
        if abs(value) >= 999.5:  # rounds to four digits or more: thousands separated
            return f"{value:,.0f}"
        if abs(value) < 1e-2:
            return f"{value:.2e}"
        return f"{value:.4g}"
    return str(value)


class Progress:
    """Reports ``done`` out of ``total`` (None when unknown) ``unit``s for the command named ``label``.

    ``update(done, total, **fields)`` sets the count, ``advance(n)`` adds to it; ``rates`` names fields that
    are running counts, shown per second over the interval since the previous line (``tokens`` -> tokens/s).
    ``start`` is where a resumed run begins (the ETA counts only what this run did). ``each_tenth`` adds a
    line at every tenth of the total (training runs; a pass over records that takes a second would fill a
    log with them). ``close()`` writes the final line.
    """

    def __init__(
        self,
        label: str,
        total: int | None = None,
        *,
        unit: str = "records",
        start: int = 0,
        rates: tuple[str, ...] = (),
        each_tenth: bool = False,
        every_s: float | None = None,
        stream: TextIO | None = None,
        tty: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.label, self.total, self.unit, self.rates, self.each_tenth = label, total, unit, rates, each_tenth
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.every_s = default_every_s() if every_s is None else every_s
        self.clock = clock
        self.start = self.done = start
        self.started = self.last_time = clock()
        self.last_done, self.last_counts = start, {}
        self.fields: dict = {}
        self._tenth = self._tenth_of(start)
        self._calls, self._stride, self._checked = 0, 1, self.started
        self._lines = 0
        self._line_open = False  # a bar on the terminal waits for its newline
        self._closed = False

    def _tenth_of(self, done: int) -> int:
        return int(STEPS_OF_TOTAL * done // self.total) if self.total and self.each_tenth else 0

    def update(self, done: int, total: int | None = None, **fields) -> None:
        self.done = done
        if total is not None:
            self.total = total
        self.fields.update(fields)
        if self.tty:
            if self.clock() - self.last_time >= REDRAW_S or (self.total and done >= self.total):
                self._write()
            return
        tenth = self._tenth_of(done)
        if tenth > self._tenth or self.clock() - self.last_time >= self.every_s:
            self._tenth = tenth
            self._write()

    def advance(self, n: int = 1, **fields) -> None:
        """Add ``n`` to the count; cheap enough to call once per record."""
        self.done += n
        self._calls += 1
        if self._calls < self._stride and self._tenth_of(self.done) <= self._tenth:
            return
        # look at the clock less often while calls are cheap, more often when they are not
        now = self.clock()
        cheap = now - self._checked < _CHEAP_S
        self._stride = min(self._stride * 2, MAX_STRIDE) if cheap else max(1, self._stride // 2)
        self._checked, self._calls = now, 0
        self.update(self.done, **fields)

    def close(self, **fields) -> None:
        """The final line (also after an error or a stop signal: it says where the run ended)."""
        if self._closed:
            return
        self._closed = True
        self.fields.update(fields)
        if self.done != self.last_done or self._lines == 0 or self._line_open:
            self._write(final=True)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def line(self) -> str:
        """The current state as one line (no bar): count, fields, rates, elapsed and ETA."""
        now = self.clock()
        elapsed = now - self.started
        parts = [f"{self.label}: {self._count(elapsed)}"]
        for key, value in self.fields.items():
            value = value() if callable(value) else value
            if value is None:
                continue
            if key in self.rates:  # a running count: its rate since the previous line
                interval, since = now - self.last_time, value - self.last_counts.get(key, 0)
                self.last_counts[key] = value
                if interval > 0:
                    parts.append(f"{key}/s {_number(since / interval)}")
                continue
            parts.append(f"{key} {_number(value)}")
        parts.append(f"elapsed {duration(elapsed)}")
        left = self.eta(elapsed)
        if left is not None:
            parts.append(f"eta {duration(left)}")
        return " ".join(parts)

    def eta(self, elapsed: float) -> float | None:
        if not self.total or self.done <= self.start or self.done >= self.total:
            return None
        return elapsed / (self.done - self.start) * (self.total - self.done)

    def _count(self, elapsed: float) -> str:
        """``120/600 steps (20%)``, ``12.0/45.0 MiB (27%, 3.1 MiB/s)``, ``60,000 records (1,000/s)``."""
        rate = (self.done - self.start) / elapsed if elapsed > 0 and self.done > self.start else None
        if self.unit == "bytes":
            notes = [self._percent()] if self.total else []
            notes += [f"{rate / 2**20:.1f} MiB/s"] if rate is not None else []
            count = f"{self.done / 2**20:.1f}" + (f"/{self.total / 2**20:.1f}" if self.total else "") + " MiB"
            return count + (f" ({', '.join(notes)})" if notes else "")
        if self.total:
            return f"{self.done:,}/{self.total:,} {self.unit} ({self._percent()})"
        return f"{self.done:,} {self.unit}" + (f" ({_number(rate)}/s)" if rate is not None else "")

    def _percent(self) -> str:
        return f"{100 * self.done / self.total:.0f}%"

    def _write(self, final: bool = False) -> None:
        text = self.line()
        if self.tty:
            filled = int(BAR_WIDTH * min(self.done / self.total, 1.0)) if self.total else 0
            bar = f"[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] " if self.total else ""
            label, _, rest = text.partition(": ")
            end = "\n" if final or (self.total and self.done >= self.total) else ""
            self.stream.write(f"\r\033[K{label}: {bar}{rest}{end}")
            self._line_open = not end
        else:
            self.stream.write(text + "\n")
        self.stream.flush()
        self.last_time, self.last_done = self.clock(), self.done
        self._lines += 1
