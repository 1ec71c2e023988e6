"""The planted-coupling study's paths, command flags and targets for its rules (workflow/rules/coevolution.smk).

Workflow code, not package code: workflow/rules/common_coevolution.smk builds one ``CoevolutionStudy`` from the
validated ``coevolution:`` section, and the rules take its bound methods as input and params functions.
"""

from __future__ import annotations

import shlex

from flags import as_flags, workflow_path

from pmlm.vocabulary import MLM, PMLM, TMLM

# the objectives the study can compare (rule pretrain_coevolution's objective wildcard); ``objectives`` picks
OBJECTIVES = (MLM, PMLM, TMLM)


class CoevolutionStudy:
    """One ``coevolution:`` config section under ``results`` (its folder is ``results/coevolution``)."""

    def __init__(self, section: dict, results: str, basedir: str):
        self.section = section
        self.dir = f"{results}/coevolution"
        self.basedir = basedir

    def seeds(self) -> list[int]:
        return [int(s) for s in self.section["seeds"]]

    def recipe(self, wildcards) -> str:
        """A relative recipe path is resolved against the workflow directory, as for pre-training."""
        return workflow_path(self.section["recipe"], self.basedir)

    def synth_args(self, wildcards) -> str:
        return as_flags(self.section["synth"])

    def split_args(self, wildcards) -> str:
        return as_flags(self.section["split"])

    def shard_args(self, wildcards) -> str:
        return as_flags(self.section["shards"])

    def evaluate_args(self, wildcards) -> str:
        # the evaluation re-draws the same held-out sequences, so it gets the split settings too
        return f"{as_flags(self.section['split'])} {as_flags(self.section['evaluate'])}"

    def pretrain_overrides(self, wildcards) -> str:
        sets = [f"objective.name={wildcards.objective}", f"seed={wildcards.seed}"]
        sets += [f"{k}={v}" for k, v in self.section["set"].items()]
        return " ".join(f"--set {shlex.quote(s)}" for s in sets)

    def objectives(self) -> list[str]:
        """The encoders trained per seed: MLM and PMLM, and the Triple MLM when ``tmlm`` is true."""
        return [MLM, PMLM] + ([TMLM] if self.section["tmlm"] else [])

    def encoders(self, wildcards) -> dict[str, str]:
        return {name: f"{self.dir}/seed{wildcards.seed}/{name}/model.safetensors" for name in self.objectives()}

    def tmlm_flag(self, wildcards) -> str:
        if TMLM not in self.objectives():
            return ""
        return f"--tmlm {shlex.quote(self.encoders(wildcards)[TMLM])}"

    def results(self) -> list[str]:
        return [f"{self.dir}/seed{s}/results.json" for s in self.seeds()]

    def targets(self) -> list[str]:
        if not self.section:
            return []
        return [f"{self.dir}/coevolution.html", f"{self.dir}/coevolution_exact.html", f"{self.dir}/coevolution.svg"]
