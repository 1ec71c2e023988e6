"""How the rules turn config settings into command-line options and name their outputs: the helpers that read
no config.

Params are canonical: a rule's params are built from the config with every mapping in sorted key order, so that the
same settings written in another order give the same params and rerun nothing (YAML mappings have no order; lists
keep theirs). tests/test_workflow_config.py plans the demo with every mapping's keys reversed.
"""

from __future__ import annotations

import os
import re
import shlex

TEST_INPUT_PREFIX = "test_"  # a rule's named inputs test_<LABEL>: the test sets its command reads (test_args)


def one_of(names) -> str:
    """A wildcard pattern matching exactly these names (never matching when there are none)."""
    return "|".join(map(re.escape, names)) if names else "NONE"


def canonical(value):
    """``value`` with the keys of its mappings, at any depth, in sorted order."""
    if isinstance(value, dict):
        return {key: canonical(value[key]) for key in sorted(value)}
    if isinstance(value, list):
        return [canonical(v) for v in value]
    return value


def as_flags(settings: dict) -> str:
    """``key: value`` pairs as ``--key value`` flags, in the order given (underscores become dashes; lists give
    several values); a config section goes through ``canonical`` first."""
    flags = []
    for key, value in settings.items():
        values = value if isinstance(value, list) else [value]
        flags.append(f"--{key.replace('_', '-')} " + " ".join(shlex.quote(str(v)) for v in values))
    return " ".join(flags)


def as_sets(settings: dict) -> str:
    """``key: value`` pairs as ``--set key=value`` options in sorted key order (booleans as YAML's true / false)."""
    pairs = canonical(settings).items()
    return " ".join(f"--set {shlex.quote(f'{k}={str(v).lower() if isinstance(v, bool) else v}')}" for k, v in pairs)


def workflow_path(path: str, basedir: str) -> str:
    """A file that ships with the workflow (a recipe): a relative path is resolved against the workflow directory."""
    return path if os.path.isabs(path) else os.path.join(basedir, path)


def output_dir(wildcards, output) -> str:
    """The directory of a rule's first output (commands that write several files into one place)."""
    return os.path.dirname(output[0])


def output_prefix(wildcards, output) -> str:
    """The first output without its extension (commands that write PREFIX.md, PREFIX.csv, ...)."""
    return os.path.splitext(output[0])[0]


def named_output_prefix(name: str):
    """A params function: the first file of the rule's output ``name`` without its extension."""

    def prefix(wildcards, output) -> str:
        return os.path.splitext(getattr(output, name)[0])[0]

    return prefix


def test_args(wildcards, input) -> str:
    """--test LABEL=PATH for every named input test_<LABEL>."""
    args = []
    for key, path in input.items():
        if key.startswith(TEST_INPUT_PREFIX):
            spec = f"{key[len(TEST_INPUT_PREFIX) :]}={path}"
            args.append(f"--test {shlex.quote(spec)}")
    return " ".join(args)


def result_args(wildcards, input) -> str:
    """--result PATH for every input (a task's table reads each encoder's evaluation)."""
    return " ".join(f"--result {shlex.quote(path)}" for path in input)


def kind_result_args(results: list[tuple[str, str]], paths) -> str:
    """--result KIND=PATH for each (table kind, TSV) of ``results``, with the path as the rule's input gives it."""
    return " ".join(f"--result {shlex.quote(f'{kind}={path}')}" for (kind, _), path in zip(results, paths))
