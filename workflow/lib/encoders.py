"""The encoders of config ``pretrain.models``: those the workflow pre-trains and the released checkpoints it
imports, their labels and files, and the inputs and params of the pre-training, import, score-table and KL rules."""

from __future__ import annotations

import os
import shlex

from flags import as_flags, as_sets, canonical, workflow_path
from paths import Paths, encoder_path
from sources import Sources
from workflow_config import is_transformers_release, release_source

from pmlm.vocabulary import MLM, PMLM, PMLM_PAIR_ONLY, TABLE_PRETRAIN_SCORES, TMLM

OBJECTIVE_LABEL = {MLM: "MLM", PMLM: "PMLM", PMLM_PAIR_ONLY: "PMLM-pair", TMLM: "TMLM"}
PAIR_OBJECTIVES = [o for o in OBJECTIVE_LABEL if o != MLM]  # the objectives with a pair head


def encoder_parts(m: dict) -> tuple[str, str, str]:
    """(dataset, objective, preset) of a pretrain.models entry, the arguments of the path helpers."""
    return m["dataset"], m["objective"], m["preset"]


def encoder_id(m: dict) -> str:
    return encoder_path(*encoder_parts(m))


def encoder_label(m: dict) -> str:
    return f"{OBJECTIVE_LABEL[m['objective']]}-{m['preset']}@{m['dataset']}"


class Encoders:
    """The configured encoders, trained or released."""

    def __init__(self, config: dict, paths: Paths, sources: Sources, basedir: str):
        self.paths, self.sources, self.basedir = paths, sources, basedir
        self.datasets = config["datasets"]
        self.pretrain = config["pretrain"]
        self.models = self.pretrain["models"]
        # encoders given by a released checkpoint (entries with release:) instead of a pre-training run
        self.released = [m for m in self.models if m.get("release")]

    # --- the encoders and their files

    def folder_datasets(self) -> list[str]:
        """The datasets encoders' folders are named by: the configured ones, and those the releases name."""
        return list(dict.fromkeys([*self.datasets, *(m["dataset"] for m in self.released)]))

    def model_of(self, wildcards) -> dict:
        for m in self.models:
            if encoder_parts(m) == (wildcards.dataset, wildcards.objective, wildcards.preset):
                return m
        raise ValueError(f"no pre-trained model {wildcards.dataset}/{wildcards.objective}-{wildcards.preset}")

    def model_label(self, wildcards) -> str:
        """The label of the table rows: OBJECTIVE-preset@dataset."""
        return encoder_label(self.model_of(wildcards))

    def pretrained_weights(self, m: dict) -> str:
        return f"{self.paths.model_dir(*encoder_parts(m))}/model.safetensors"

    def pretrained_targets(self) -> list[str]:
        return [self.pretrained_weights(m) for m in self.models]

    def trained_models(self) -> list[dict]:
        """The encoders this workflow pre-trains (not released checkpoints)."""
        return [m for m in self.models if not m.get("release")]

    def pretrain_metrics(self, m: dict) -> str:
        """The metrics log of encoder ``m``'s pre-training run (an output of rule pretrain)."""
        return self.paths.pretrain_metrics_path(*encoder_parts(m))

    # --- pre-training

    def recipe_file(self, wildcards) -> str:
        return workflow_path(self.pretrain["recipes"][wildcards.preset], self.basedir)

    def pretrain_overrides(self, wildcards) -> str:
        return f"--set objective.name={wildcards.objective} {as_sets(self.pretrain['set'])}".rstrip()

    def pretrain_table_args(self, wildcards, input) -> str:
        models = []
        for m, weights in zip(self.models, input.weights):
            spec = f"{OBJECTIVE_LABEL[m['objective']]}-{m['preset']}:{m['dataset']}:{weights}"
            models.append(f"--model {shlex.quote(spec)}")
        return " ".join(models)

    def kl_models(self) -> list[dict]:
        return [m for m in self.models if m["objective"] in PAIR_OBJECTIVES]

    def kl_datasets(self) -> list[str]:
        """The validation sets of the KL figure: the configured ones, else those the PMLM encoders were trained
        on (a release's dataset names no validation set of this config)."""
        trained_on = dict.fromkeys(m["dataset"] for m in self.kl_models() if m["dataset"] in self.datasets)
        return self.pretrain["kl"]["datasets"] or list(trained_on)

    def kl_args(self, wildcards, input) -> str:
        """Every PMLM encoder on every validation set (one panel per set), and the sampling settings."""
        args = [f"--model {shlex.quote(f'{encoder_label(m)}={self.pretrained_weights(m)}')}" for m in self.kl_models()]
        args += [f"--valid {shlex.quote(f'{d}={self.paths.shards_dir(d)}')}" for d in self.kl_datasets()]
        args.append(as_flags(canonical({k: v for k, v in self.pretrain["kl"].items() if k != "datasets"})))
        return " ".join(args)

    def targets(self) -> list[str]:
        if not self.models:
            return []
        targets = [*self.pretrained_targets(), f"{self.paths.table_prefix(TABLE_PRETRAIN_SCORES)}.html"]
        if self.kl_models() and self.kl_datasets():
            targets.append(f"{self.paths.results}/figures/kl_histogram.svg")
        return targets

    # --- released encoders

    def release_of(self, wildcards) -> dict:
        """The released encoder ``wildcards.release`` (DATASET/OBJECTIVE-PRESET) names."""
        return next(m for m in self.released if encoder_id(m) == wildcards.release)

    def released_checkpoint(self, wildcards) -> str:
        return self.sources.downloaded(release_source(self.release_of(wildcards)))

    def checkpoint_releases(self) -> list[dict]:
        """The releases given as a checkpoint of the released code (downloaded, then imported by import_release)."""
        return [m for m in self.released if not is_transformers_release(m)]

    def transformers_releases(self) -> list[dict]:
        """The releases given as a transformers model, a folder or a hub id (imported by import_huggingface)."""
        return [m for m in self.released if is_transformers_release(m)]

    def transformers_model(self, wildcards) -> str:
        """The folder (made absolute: the rule runs pmlm from the working directory) or hub id of a transformers
        release."""
        name = self.release_of(wildcards)["release"]["huggingface"]
        return os.path.abspath(name) if os.path.isdir(name) else name

    def transformers_inputs(self, wildcards) -> list[str]:
        """A local folder's config.json, so a missing folder stops the DAG at once (a hub id has no input file)."""
        model = self.transformers_model(wildcards)
        return [os.path.join(model, "config.json")] if os.path.isdir(model) else []

    def transformers_revision(self, wildcards) -> str:
        revision = self.release_of(wildcards)["release"].get("revision")
        return f"--revision {shlex.quote(revision)}" if revision else ""

    def release_objective(self, wildcards) -> str:
        """The objective the entry says its release was trained with; `pmlm import` checks the file agrees."""
        return self.release_of(wildcards)["objective"]
