"""The co-evolution study's paths, units and command settings for its rules (workflow/rules/coevolution.smk).

Workflow code, not package code: workflow/rules/common_coevolution.smk builds one ``CoevolutionStudy`` from the
validated ``coevolution:`` section. The section is a ``CurvesConfig`` (pmlm/coevolution/curves_config.py), read once
here, so that a broken one stops the workflow with one line; every rule hands it to ``pmlm coevolution curves`` as
one JSON object, and the jobs are the command's own steps: ``--prepare`` per seed, ``--unit`` per unit
(``CurvesConfig.units``: one arm of one seed, a seed's baselines), ``--collect`` once.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from flags import workflow_path

from pmlm.coevolution.curves_config import RESULTS_TSV, SEQUENCES_TSV, CurvesConfig
from pmlm.commands.coevolution import FIGURE
from pmlm.errors import ConfigError

# what `pmlm coevolution curves --collect` writes into the study's folder: the two tables, then the report and the
# figure beside curves.tsv (curves.md, curves.png, curves.svg)
REPORT = Path(RESULTS_TSV).stem


class CoevolutionStudy:
    """The ``coevolution:`` section (None: the config has none, so the study has no jobs) under ``results``: its
    folder is ``results/coevolution``, the ``--out`` of every step."""

    def __init__(self, section: dict | None, results: str, basedir: str):
        self.dir = f"{results}/coevolution"
        self.config = None if section is None else study_config(section, basedir)
        units = self.config.units() if self.config else []
        self.unit_seeds = {unit.name: unit.seed for unit in units}

    def seeds(self) -> list[str]:
        """The study's seeds as the ``seed`` wildcard spells them."""
        return [str(seed) for seed in self.config.seeds] if self.config else []

    def units(self) -> list[str]:
        """Every unit's name (``seed1-all-pmlm``, ``seed1-baseline``), in the order the command reports them."""
        return list(self.unit_seeds)

    @property
    def threads(self) -> int:
        """Torch threads of one unit (the section's ``threads``)."""
        return self.config.threads if self.config else 1

    @property
    def json(self) -> str:
        """The whole study with every default filled and the recipe resolved, for ``--config-json``."""
        return json.dumps(self.config.to_dict()) if self.config else ""

    def data(self, seed) -> str:
        """A seed's sampled, split and tokenized families (``--prepare SEED``)."""
        return f"{self.dir}/data/seed{seed}"

    def unit_data(self, wildcards) -> str:
        """The input of unit ``wildcards.unit``: its seed's families, prepared by their own job (two units of one seed
        must not prepare them at once)."""
        return self.data(self.unit_seeds[wildcards.unit])

    def recipe(self, wildcards) -> str:
        """The arms' recipe file, an input of every unit so that editing it reruns them."""
        return self.config.recipe

    def seed_data(self) -> list[str]:
        """Every seed's families (``--collect`` lists the held-out sequences each family's read-outs used)."""
        return [self.data(seed) for seed in self.seeds()]

    def unit_result(self, name) -> str:
        """A unit's rows (``--unit NAME``), written when it ends."""
        return f"{self.dir}/units/{name}.tsv"

    def unit_results(self) -> list[str]:
        return [self.unit_result(name) for name in self.units()]

    def results(self, suffix: str = "") -> str:
        """A file of ``--collect``: ``results()`` the table of every row, ``results(".md")`` the report, ..."""
        return f"{self.dir}/{REPORT}{suffix}" if suffix else f"{self.dir}/{RESULTS_TSV}"

    def sequences(self) -> str:
        """The held-out sequence ids every read-out of a family used."""
        return f"{self.dir}/{SEQUENCES_TSV}"

    def targets(self) -> list[str]:
        """The tables and the figure (empty without a study)."""
        if not self.config:
            return []
        return [self.results(), self.sequences(), self.results(".md"), *(self.results(s) for s in FIGURE)]


def study_folder(wildcards, output) -> str:
    """The ``--out`` of a prepare or unit job, from its output (``DIR/data/seedN``, ``DIR/units/NAME.tsv``)."""
    return os.path.dirname(os.path.dirname(output[0]))


def study_config(section: dict, basedir: str) -> CurvesConfig:
    """The section as a ``CurvesConfig``, its recipe resolved against the workflow directory (as pre-training's);
    a broken section is one ConfigError naming it."""
    try:
        config = CurvesConfig.from_dict(section)
    except ConfigError as exc:
        raise ConfigError(f"config.coevolution: {exc}") from None
    config.recipe = workflow_path(config.recipe, basedir)
    return config
