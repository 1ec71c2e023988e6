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
from importlib.metadata import entry_points
from pathlib import Path

from pmlm.errors import ConfigError, InputError
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
from pmlm.tasks.task import FORMATS, RAPTORX, STRUCTURE_JSONL, TABLE, TAPE, ReadOptions, Task, TaskData

ENTRY_POINT_GROUP = "pmlm.tasks"
_TASKS: dict[str, Task] = {}
_entry_points_loaded = False


def register(task: Task) -> Task:
    """Make ``task`` known by its name; a second task of the same name is an error."""
    if not isinstance(task, Task):
        raise TypeError(f"a task must be a pmlm.tasks.task.Task, got {type(task).__name__}")
    known = _TASKS.get(task.name)
    if known is not None and known is not task:
        raise ValueError(f"a task named {task.name!r} is registered already ({type(known).__name__})")
    _TASKS[task.name] = task
    return task


def _load_entry_points() -> None:
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    for point in entry_points(group=ENTRY_POINT_GROUP):
        try:
            register(point.load())
        except Exception as exc:  # a broken plugin names itself in one line
            raise ConfigError(f"task plug-in {point.name} ({point.value}): cannot load: {exc}") from None


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


def detect_task_format(path: str | Path) -> str:
    """structure_jsonl | tape | raptorx | table from the path's name (and a JSONL file's first record)."""
    path = Path(path)
    name = path.name.lower()
    if path.is_dir() and not name.endswith(".lmdb"):
        return RAPTORX
    if name.endswith((".npz", ".pkl")):
        return RAPTORX
    if name.endswith((".json", ".json.gz", ".lmdb")):
        return TAPE
    if is_table(path):
        return TABLE
    if name.endswith((".jsonl", ".jsonl.gz")):
        if not path.exists():
            raise InputError(path, "no such file or directory")
        opener = gzip.open if name.endswith(".gz") else open
        try:
            with opener(path, "rt", encoding="utf-8") as fh:
                first = next((line for line in fh if line.strip()), "")
            record = json.loads(first) if first else {}
        except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise InputError(path, f"cannot tell the format from the first record ({exc})", line=1) from None
        return STRUCTURE_JSONL if isinstance(record, dict) and "dssp" in record else RAPTORX
    raise InputError(
        path,
        "cannot tell the format from the name (expected .jsonl[.gz], .json[.gz], .lmdb, .npz, .pkl, a folder, "
        ".csv[.gz], .tsv[.gz] or .parquet); set data.format",
    )


def read_task_data(path: str | Path, task: Task | str, options: ReadOptions | None = None, **settings) -> TaskData:
    """Read the labelled examples of ``task`` from ``path`` (``options`` or ReadOptions' fields as keywords, with
    ``fmt`` auto by default); bad records raise InputError (or are counted with ``on_error="skip"``)."""
    task = task_named(task) if isinstance(task, str) else task
    path = Path(path)
    options = options or ReadOptions(**{"fmt": "auto", **settings})
    fmt = detect_task_format(path) if options.fmt == "auto" else options.fmt
    if fmt not in FORMATS:
        raise ConfigError(f"data.format must be one of auto, {', '.join(FORMATS)}, got {fmt!r}")
    if fmt not in task.formats:
        raise InputError(path, f"a {fmt} file has no labels for task {task.name} (it reads {', '.join(task.formats)})")
    atom = task.contact_atom(path, fmt, options.contact_atom)
    options = dataclasses.replace(options, fmt=fmt, contact_atom=atom or options.contact_atom)
    classes = options.classes or task.file_classes(path, options)
    options = dataclasses.replace(options, classes=classes)
    counts = ReadCounts()
    examples = []
    for example in task.read(path, options, counts):
        examples.append(example)
        if options.limit and len(examples) >= options.limit:
            break
    if not examples:
        raise InputError(path, f"no usable {task.name} examples (read {counts.read}, skipped {counts.n_skipped})")
    return TaskData(str(path), fmt, task.name, examples, atom, counts, classes)
