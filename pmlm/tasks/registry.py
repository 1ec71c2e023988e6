"""The downstream tasks by name, and reading any task's labelled file.

``task_named(name)`` is how every layer gets a task: fine-tuning, evaluation, the heads' loading, the recipes'
checks. The built-in tasks are registered below; a task of one's own is one module defining a
``pmlm.tasks.task.Task`` and its registration: ``register(MyTask())`` in code that runs before the task is named,
or, for the command line and the workflow, an entry point of an installed package in the group ``pmlm.tasks``
whose object is the task (``[project.entry-points."pmlm.tasks"] my_task = "my_package.my_module:MY_TASK"``),
loaded the first time a name is not found among the registered ones.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from pmlm.errors import ConfigError, InputError
from pmlm.plugins import add_once, load_entry_points
from pmlm.tasks.contact_task import CONTACT
from pmlm.tasks.labelled import is_table
from pmlm.tasks.residue_tasks import RESIDUE_CLASSIFICATION, SS3
from pmlm.tasks.sequence_tasks import (
    FLUORESCENCE_TASK,
    REMOTE_HOMOLOGY_TASK,
    SEQUENCE_CLASSIFICATION,
    SEQUENCE_REGRESSION,
    STABILITY_TASK,
)
from pmlm.tasks.structures import ReadCounts
from pmlm.tasks.task import RAPTORX, STRUCTURE_JSONL, TABLE, TAPE, Example, ReadOptions, Task, TaskData

ENTRY_POINT_GROUP = "pmlm.tasks"
_TASKS: dict[str, Task] = {}


def register(task: Task) -> Task:
    """Make ``task`` known by its name; a second task of the same name is an error."""
    if not isinstance(task, Task):
        raise TypeError(f"a task must be a pmlm.tasks.task.Task, got {type(task).__name__}")
    return add_once(_TASKS, task.name, task, "a task")


def _load_entry_points() -> None:
    load_entry_points(ENTRY_POINT_GROUP, register, "task")


def task_names() -> tuple[str, ...]:
    _load_entry_points()
    return tuple(_TASKS)


def task_named(name: str, key: str = "task") -> Task:
    """The task called ``name``; an unknown name is a ConfigError naming ``key`` and the known tasks."""
    if name not in _TASKS:
        _load_entry_points()
    if name not in _TASKS:
        raise ConfigError(f"{key} must be one of {', '.join(_TASKS)}, got {name!r}")
    return _TASKS[name]


for _task in (
    CONTACT,
    SS3,
    REMOTE_HOMOLOGY_TASK,
    FLUORESCENCE_TASK,
    STABILITY_TASK,
    RESIDUE_CLASSIFICATION,
    SEQUENCE_CLASSIFICATION,
    SEQUENCE_REGRESSION,
):
    register(_task)


@dataclass(frozen=True)
class TaskFormat:
    """A format of labelled files (``data.format``). A built-in one is read by the tasks that list it in their
    ``formats`` (``Task.read``); a plug-in's reads its files itself for the ``tasks`` it names."""

    name: str
    claims: Callable[[Path], bool]  # whether ``auto`` takes this file (by its name, a JSONL file's first record)
    expected: tuple[str, ...]  # the names it takes, for the message when no format claims a file
    read: Callable[..., Iterable[Example]] | None = None  # (path, task, options, counts) -> examples
    tasks: tuple[str, ...] = ()

    def labels(self, task: Task) -> bool:
        return self.name in task.formats or task.name in self.tasks

    def examples(self, path: Path, task: Task, options: ReadOptions, counts: ReadCounts) -> Iterable[Example]:
        if self.read is None:
            return task.read(path, options, counts)
        return self.read(path, task, options, counts)


_FORMATS: dict[str, TaskFormat] = {}


def register_format(fmt: TaskFormat) -> TaskFormat:
    """Make ``fmt`` known by its name, for ``data.format`` and (after the formats known before it) ``auto``."""
    return add_once(_FORMATS, fmt.name, fmt, "a task file format")


def format_names() -> tuple[str, ...]:
    return tuple(_FORMATS)


def _named(path: Path, *suffixes: str) -> bool:
    return path.name.lower().endswith(suffixes)


def _jsonl(path: Path) -> bool:
    return not path.is_dir() and _named(path, ".jsonl", ".jsonl.gz")


def _has_dssp(path: Path) -> bool:
    """Whether a JSONL file's first record carries dssp (structure JSONL; a RaptorX-style set has none)."""
    if not path.exists():
        raise InputError(path, "no such file or directory")
    opener = gzip.open if path.name.lower().endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8") as fh:
            first = next((line for line in fh if line.strip()), "")
        record = json.loads(first) if first else {}
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(path, f"cannot tell the format from the first record ({exc})", line=1) from None
    return isinstance(record, dict) and "dssp" in record


for _format in (  # in this order: a folder is RaptorX's unless TAPE's LMDB, a JSONL file RaptorX's without dssp
    TaskFormat(STRUCTURE_JSONL, lambda p: _jsonl(p) and _has_dssp(p), (".jsonl[.gz]",)),
    TaskFormat(
        TAPE,
        lambda p: _named(p, ".lmdb") or (_named(p, ".json", ".json.gz") and not p.is_dir()),
        (".json[.gz]", ".lmdb"),
    ),
    TaskFormat(RAPTORX, lambda p: p.is_dir() or _named(p, ".npz", ".pkl") or _jsonl(p), (".npz", ".pkl", "a folder")),
    TaskFormat(TABLE, is_table, (".csv[.gz]", ".tsv[.gz]", ".parquet")),
):
    register_format(_format)


def detect_task_format(path: str | Path) -> str:
    """The name of the first registered format that claims ``path`` (the built-ins: structure_jsonl | tape |
    raptorx | table, from the name and a JSONL file's first record)."""
    path = Path(path)
    for fmt in _FORMATS.values():
        if fmt.claims(path):
            return fmt.name
    expected = [name for fmt in _FORMATS.values() for name in fmt.expected]
    raise InputError(
        path,
        f"cannot tell the format from the name (expected {', '.join(expected[:-1])} or {expected[-1]}); "
        "set data.format",
    )


def read_task_data(path: str | Path, task: Task | str, options: ReadOptions | None = None, **settings) -> TaskData:
    """Read the labelled examples of ``task`` (a name: the task with its default settings) from ``path``
    (``options`` or ReadOptions' fields as keywords, with ``fmt`` auto by default); bad records raise InputError
    (or are counted with ``on_error="skip"``)."""
    task = task_named(task) if isinstance(task, str) else task
    path = Path(path)
    options = options or ReadOptions(**{"fmt": "auto", **settings})
    name = detect_task_format(path) if options.fmt == "auto" else options.fmt
    if name not in _FORMATS:
        raise ConfigError(f"data.format must be one of auto, {', '.join(_FORMATS)}, got {name!r}")
    fmt = _FORMATS[name]
    if not fmt.labels(task):
        reads = ", ".join(f.name for f in _FORMATS.values() if f.labels(task))
        raise InputError(path, f"a {name} file has no labels for task {task.name} (it reads {reads})")
    atom = task.contact_atom(path, name)
    options = dataclasses.replace(options, fmt=name)
    options = dataclasses.replace(options, classes=options.classes or task.file_classes(path, options))
    counts = ReadCounts()
    examples = []
    for example in fmt.examples(path, task, options, counts):
        examples.append(example)
        if options.limit and len(examples) >= options.limit:
            break
    if not examples:
        raise InputError(path, f"no usable {task.name} examples (read {counts.read}, skipped {counts.n_skipped})")
    return TaskData(str(path), name, task, examples, atom, counts, options.classes)
