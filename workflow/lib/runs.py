"""The fine-tuning runs (config ``finetune.runs``) on every encoder they apply to, the unsupervised read-outs of the
pair head, their task data and evaluations, and the downstream tables built from them."""

from __future__ import annotations

from encoders import PAIR_OBJECTIVES, Encoders, encoder_id, encoder_parts
from flags import TEST_INPUT_PREFIX, as_flags, as_sets, canonical, kind_result_args, workflow_path
from paths import Paths
from sources import Sources
from workflow_config import readout_run

from pmlm.vocabulary import RESULT_TABLES, TABLE_TASK, TABLE_UNSUPERVISED_CONTACT

TABLE_FORMATS = ("md", "csv", "tex")  # what `pmlm tables` writes of each table besides its .html
AUTO_FEATURES = "auto"  # a run's features: the recipe's own head.features


class TaskData:
    """The task datasets (config ``task_data``): derived by split-structures or split-table, or files of the
    config."""

    def __init__(self, config: dict, paths: Paths, sources: Sources):
        self.paths, self.sources = paths, sources
        self.specs = config["task_data"]
        # task data that split-structures derives (the others are files named in the config)
        self.derived = [name for name, spec in self.specs.items() if spec.get("split") and not spec.get("table")]
        # labelled tables of one's own task, split by split-table (by their split column or by identity)
        self.tables = [name for name, spec in self.specs.items() if spec.get("table")]

    def task_file(self, data: str, split: str) -> str:
        """A split of a task dataset: derived by split-structures, or a file (archive member / local path) from
        config."""
        spec = self.specs[data]
        if spec.get("table"):
            return f"{self.paths.results}/tasks/{data}/{split}.parquet"
        if spec.get("split"):
            return f"{self.paths.results}/tasks/{data}/{split}.jsonl"
        entry = spec["files"][split]
        if entry.get("path"):
            return entry["path"]
        return f"resources/sources/{entry['source']}/members/{entry['member']}"

    def test_inputs(self, data: str, tests: dict) -> dict[str, str]:
        return {label: self.task_file(data, split) for label, split in tests.items()}

    def first_test(self, data: str, tests: dict) -> str:
        """The first test set of a run or of the read-outs: the chains a contact map draws."""
        return next(iter(self.test_inputs(data, tests).values()))

    def structure_source(self, wildcards) -> str:
        return self.sources.source_file(self.specs[wildcards.taskdata]["source"])

    def table_source(self, wildcards) -> str:
        return self.sources.source_file(self.specs[wildcards.tabledata]["source"])

    def table_split_args(self, wildcards) -> str:
        """`pmlm split-table` flags: the table's sequence and split columns, else its split: settings."""
        spec = canonical(self.specs[wildcards.tabledata])
        flags = {"sequence_column": spec["table"]["sequence_column"]}
        if spec["table"]["split_column"]:
            flags["split_column"] = spec["table"]["split_column"]
        else:
            flags.update(spec.get("split") or {})
        return as_flags(flags)

    def structure_split_args(self, wildcards) -> str:
        """`pmlm split-structures` flags from the task data's split: settings (their keys are its flags)."""
        return as_flags(canonical(self.specs[wildcards.taskdata]["split"]))


class Runs:
    """Every fine-tuning run on every encoder it applies to, and the read-outs of every encoder with a pair head."""

    def __init__(self, config: dict, paths: Paths, encoders: Encoders, task_data: TaskData, basedir: str):
        self.paths, self.encoders, self.task_data, self.basedir = paths, encoders, task_data, basedir
        self.finetune = config["finetune"]
        self.runs = self.finetune["runs"]
        self.unsupervised = self.finetune["unsupervised"]

    def runs_for(self, m: dict) -> list[str]:
        """Fine-tuning runs that apply to encoder ``m`` (all, unless a run lists its encoders)."""
        runs = canonical(self.runs).items()
        return [name for name, run in runs if not run["encoders"] or encoder_id(m) in run["encoders"]]

    def finetuned_runs(self) -> list[tuple[dict, str]]:
        """(encoder, run) for every fine-tuning the config asks for."""
        return [(m, ft) for m in self.encoders.models for ft in self.runs_for(m)]

    def finetuned_head(self, m: dict, ft: str) -> str:
        return f"{self.paths.finetune_dir(*encoder_parts(m), ft)}/head.safetensors"

    def finetune_metrics(self, m: dict, ft: str) -> str:
        """The metrics log of fine-tuning run ``ft`` on encoder ``m`` (an output of rule finetune)."""
        return self.paths.finetune_metrics_path(*encoder_parts(m), ft)

    def evaluation_tsv(self, m: dict, name: str) -> str:
        return self.paths.evaluation_path(*encoder_parts(m), name)

    def run_features(self, m: dict, ft: str) -> str:
        """M, M+ or auto: the features run ``ft`` gives encoder ``m`` (config finetune.runs.<ft>.features)."""
        spec = self.runs[ft]["features"]
        return spec.get(encoder_id(m), AUTO_FEATURES) if isinstance(spec, dict) else spec

    # --- inputs and params of the fine-tuning and evaluation rules

    def finetune_recipe(self, wildcards) -> str:
        return workflow_path(self.finetune["recipes"][self.runs[wildcards.ft]["recipe"]], self.basedir)

    def finetune_inputs(self, wildcards) -> dict[str, str]:
        run = self.runs[wildcards.ft]
        return {
            "encoder": self.encoders.pretrained_weights(self.encoders.model_of(wildcards)),
            "train": self.task_data.task_file(run["data"], "train"),
            "valid": self.task_data.task_file(run["data"], "valid"),
            "recipe": self.finetune_recipe(wildcards),
        }

    def finetune_overrides(self, wildcards) -> str:
        sets = dict(self.finetune["set"])
        features = self.run_features(self.encoders.model_of(wildcards), wildcards.ft)
        if features != AUTO_FEATURES:
            sets["head.features"] = features
        table = self.task_data.specs[self.runs[wildcards.ft]["data"]].get("table")
        if table:  # a labelled table: the columns the recipe reads
            sets.update({f"data.{k}": v for k, v in table.items() if k != "split_column"})
        return as_sets(sets)

    def _tests(self, data: str, tests: dict) -> dict[str, str]:
        return {f"{TEST_INPUT_PREFIX}{k}": v for k, v in self.task_data.test_inputs(data, tests).items()}

    def evaluate_inputs(self, wildcards) -> dict[str, str]:
        run = self.runs[wildcards.ft]
        head = self.finetuned_head(self.encoders.model_of(wildcards), wildcards.ft)
        return {"head": head, **self._tests(run["data"], run["tests"])}

    def unsupervised_inputs(self, wildcards) -> dict[str, str]:
        encoder = self.encoders.pretrained_weights(self.encoders.model_of(wildcards))
        return {"encoder": encoder, **self._tests(self.unsupervised["data"], self.unsupervised["tests"])}

    # --- the downstream tables

    def evaluation_results(self) -> list[tuple[str, str]]:
        """(table kind, TSV) for every evaluation the config asks for."""
        out = []
        for m in self.encoders.models:
            for ft in self.runs_for(m):
                if self.runs[ft]["table"] != TABLE_TASK:  # a table of its own: task_table_runs
                    out.append((self.runs[ft]["table"], self.evaluation_tsv(m, ft)))
            if m["objective"] in PAIR_OBJECTIVES:
                for readout in self.unsupervised["readouts"]:
                    out.append((TABLE_UNSUPERVISED_CONTACT, self.evaluation_tsv(m, readout_run(readout))))
        return out

    def evaluation_tsvs(self) -> list[str]:
        return [tsv for _, tsv in self.evaluation_results()]

    def table_args(self, wildcards, input) -> str:
        return kind_result_args(self.evaluation_results(), input)

    def downstream_tables(self) -> list[str]:
        """Every file `pmlm tables results` writes: each of its tables as Markdown, CSV and LaTeX."""
        return [f"{self.paths.table_prefix(t)}.{ext}" for t in RESULT_TABLES for ext in TABLE_FORMATS]

    def task_table_tsvs(self, ft: str) -> list[str]:
        return [self.evaluation_tsv(m, ft) for m in self.encoders.models if ft in self.runs_for(m)]

    def task_table_runs(self) -> list[str]:
        """The runs with a table of their own (table: task), fine-tuned on at least one encoder."""
        return [ft for ft in self.runs if self.runs[ft]["table"] == TABLE_TASK and self.task_table_tsvs(ft)]

    def task_table_inputs(self, wildcards) -> list[str]:
        return self.task_table_tsvs(wildcards.taskrun)

    def targets(self) -> list[str]:
        targets = [f"{self.paths.table_prefix(run)}.html" for run in self.task_table_runs()]
        if not self.evaluation_results():
            return targets
        return [f"{self.paths.table_prefix(t)}.html" for t in RESULT_TABLES] + targets
