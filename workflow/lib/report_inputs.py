"""The workflow report's figures and pages: which to draw, and the inputs and params of their rules."""

from __future__ import annotations

import json
import shlex

from encoders import PAIR_OBJECTIVES, Encoders, encoder_label, encoder_parts
from flags import kind_result_args
from paths import Paths
from runs import Runs, TaskData
from workflow_config import readout_run

from pmlm.vocabulary import CONTACT_TABLE_KINDS, TABLE_UNSUPERVISED_CONTACT


class Report:
    def __init__(self, config: dict, paths: Paths, encoders: Encoders, task_data: TaskData, runs: Runs):
        self.config, self.paths, self.encoders, self.task_data, self.runs = config, paths, encoders, task_data, runs
        self.contact_maps = config["report"]["contact_maps"]

    def pretrain_curve_args(self, wildcards, input) -> str:
        """--run LABEL=metrics.csv for every pre-training run, in the order of the rule's input."""
        runs = [f"{encoder_label(m)}={path}" for m, path in zip(self.encoders.trained_models(), input.metrics)]
        return " ".join(f"--run {shlex.quote(r)}" for r in runs)

    def finetune_curve_args(self, wildcards, input) -> str:
        """--run 'LABEL RUN=metrics.csv' for every fine-tuning run, in the order of the rule's input."""
        runs = [f"{encoder_label(m)} {ft}={path}" for (m, ft), path in zip(self.runs.finetuned_runs(), input.metrics)]
        return " ".join(f"--run {shlex.quote(r)}" for r in runs)

    def contact_map_figures(self, m: dict) -> list[str]:
        """The contact maps of encoder ``m`` to draw: its contact runs' (rule plot_contact_maps) and, with a pair
        head, its read-outs' (rule plot_readout_contact_maps); those report.contact_maps.runs names, else all."""
        runs = self.runs
        names = [ft for ft in runs.runs_for(m) if runs.runs[ft]["table"] in CONTACT_TABLE_KINDS]
        if m["objective"] in PAIR_OBJECTIVES:
            names += [readout_run(r) for r in runs.unsupervised["readouts"]]
        wanted = self.contact_maps.get("runs")
        prefix = self.paths.contact_map_prefix
        return [f"{prefix(*encoder_parts(m), n)}.svg" for n in names if wanted is None or n in wanted]

    def contact_map_inputs(self, wildcards) -> dict[str, str]:
        """A contact run's head and its first test set."""
        run = self.runs.runs[wildcards.ft]
        return {
            "head": self.runs.finetuned_head(self.encoders.model_of(wildcards), wildcards.ft),
            "test": self.task_data.first_test(run["data"], run["tests"]),
        }

    def readout_map_inputs(self, wildcards) -> dict[str, str]:
        """The encoder whose pair head is read out and the read-outs' first test set."""
        unsupervised = self.runs.unsupervised
        return {
            "encoder": self.encoders.pretrained_weights(self.encoders.model_of(wildcards)),
            "test": self.task_data.first_test(unsupervised["data"], unsupervised["tests"]),
        }

    def contact_results(self) -> list[tuple[str, str]]:
        """(table kind, TSV) of the evaluations that score contacts."""
        kinds = (*CONTACT_TABLE_KINDS, TABLE_UNSUPERVISED_CONTACT)
        return [(kind, tsv) for kind, tsv in self.runs.evaluation_results() if kind in kinds]

    def contact_tsvs(self) -> list[str]:
        return [tsv for _, tsv in self.contact_results()]

    def separation_args(self, wildcards, input) -> str:
        return kind_result_args(self.contact_results(), input)

    def run_config_json(self, wildcards) -> str:
        """The effective configuration (files, profile and --config merged; schema defaults filled in)."""
        return json.dumps(self.config, sort_keys=True, default=str)

    def targets(self) -> list[str]:
        results = self.paths.results
        targets = [f"{self.paths.report_dir}/run_info.html"]
        if self.encoders.trained_models():
            targets.append(f"{results}/figures/pretrain_curves.svg")
        if self.runs.finetuned_runs():
            targets.append(f"{results}/figures/finetune_curves.svg")
        if self.contact_results():
            targets.append(f"{results}/figures/precision_by_separation.svg")
        targets += [figure for m in self.encoders.models for figure in self.contact_map_figures(m)]
        return targets
