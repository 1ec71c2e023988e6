"""What the registries of plug-in types share (tasks and task file formats in ``pmlm.tasks.registry``, objectives
in ``pmlm.model.objective_registry``): one name per item, and an installed package's entry points loaded once."""

from __future__ import annotations

import functools
from collections.abc import Callable
from importlib.metadata import entry_points

from pmlm.errors import ConfigError


def add_once(known: dict, name: str, item, what: str):
    """Put ``item`` in ``known`` under ``name``; another item of the same name is an error."""
    if known.setdefault(name, item) is not item:
        raise ValueError(f"{what} named {name!r} is registered already ({type(known[name]).__name__})")
    return item


@functools.cache
def load_entry_points(group: str, register: Callable, what: str) -> None:
    """Register the objects of the entry points in ``group``, once per process; a broken plug-in names itself in
    one line."""
    for point in entry_points(group=group):
        try:
            register(point.load())
        except Exception as exc:
            raise ConfigError(f"{what} plug-in {point.name} ({point.value}): cannot load: {exc}") from None
