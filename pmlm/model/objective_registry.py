"""The pre-training objectives by name (``objective_named``, ``register``), as the task types are
(``pmlm.tasks.registry``): ``ObjectiveConfig`` resolves its ``name`` here once, and every layer asks the type. An
objective of one's own is one module defining a ``pmlm.model.objective.Objective`` and ``register(MyObjective())``
run before its name is read, or an installed package's entry point in the group ``pmlm.objectives`` whose object is
the objective."""

from __future__ import annotations

from pmlm.errors import ConfigError
from pmlm.model.config import RELEASED_LAYERS
from pmlm.model.mlm_objective import MLM_OBJECTIVE
from pmlm.model.objective import Objective
from pmlm.model.pair_only_objective import PAIR_ONLY_OBJECTIVE
from pmlm.model.pmlm_objective import PMLM_OBJECTIVE
from pmlm.model.tmlm_objective import TMLM_OBJECTIVE
from pmlm.plugins import add_once, load_entry_points

ENTRY_POINT_GROUP = "pmlm.objectives"
_OBJECTIVES: dict[str, Objective] = {}


def register(objective: Objective) -> Objective:
    """Make ``objective`` known by its name, its encoder's layer recipe that of ``objective.layers``; a second
    objective of the same name is an error."""
    if not isinstance(objective, Objective):
        raise TypeError(f"an objective must be a pmlm.model.objective.Objective, got {type(objective).__name__}")
    add_once(_OBJECTIVES, objective.name, objective, "an objective")
    RELEASED_LAYERS.setdefault(objective.name, dict(RELEASED_LAYERS[objective.layers]))
    return objective


def _load_entry_points() -> None:
    load_entry_points(ENTRY_POINT_GROUP, register, "objective")


def objective_names() -> tuple[str, ...]:
    _load_entry_points()
    return tuple(_OBJECTIVES)


def objective_named(name: str, key: str = "objective.name") -> Objective:
    """The objective called ``name``; an unknown name is a ConfigError naming ``key`` and the known objectives."""
    known = _OBJECTIVES.get(name) if isinstance(name, str) else None
    if known is None:
        _load_entry_points()
        known = _OBJECTIVES.get(name) if isinstance(name, str) else None
    if known is None:
        raise ConfigError(f"{key} must be one of {', '.join(_OBJECTIVES)}, got {name!r}")
    return known


for _objective in (MLM_OBJECTIVE, PMLM_OBJECTIVE, PAIR_ONLY_OBJECTIVE, TMLM_OBJECTIVE):
    register(_objective)
