"""The paths of a run's folders, each template written once.

Every folder of an encoder or a run is named by one method below. A rule's paths call the same method with the
wildcards' names (``ENCODER_WILDCARDS``, ``"{ft}"``), which gives the rule's pattern; the input functions call it
with a configured encoder's values.
"""

from __future__ import annotations

from pmlm.train import METRICS_CSV

ENCODER_WILDCARDS = ("{dataset}", "{objective}", "{preset}")


def encoder_path(dataset: str, objective: str, preset: str) -> str:
    """DATASET/OBJECTIVE-PRESET: the encoder's part of its folders' paths (and its id in the config)."""
    return f"{dataset}/{objective}-{preset}"


class Paths:
    """The folders of run ``run`` (config ``run``): results/<run>, logs/<run>, benchmarks/<run>."""

    def __init__(self, run: str):
        self.results = f"results/{run}"
        self.logs = f"logs/{run}"
        self.bench = f"benchmarks/{run}"
        self.report_dir = f"{self.results}/report"

    def table_prefix(self, name: str) -> str:
        """A table's path without its extension: the table writers add .md, .csv, .tex and .html."""
        return f"{self.results}/tables/{name}"

    def shards_dir(self, dataset: str) -> str:
        return f"{self.results}/data/{dataset}/shards"

    def encoder_dir(self, encoder: str) -> str:
        """The folder of encoder ``encoder`` (encoder_path, or a rule's {release}): weights, model.json, scores."""
        return f"{self.results}/pretrain/{encoder}"

    def model_dir(self, dataset: str, objective: str, preset: str) -> str:
        return self.encoder_dir(encoder_path(dataset, objective, preset))

    def pretrain_run_dir(self, dataset: str, objective: str, preset: str) -> str:
        """A pre-training run's folder: checkpoints, metrics.csv, tb/, train.log; a killed or requeued job resumes
        here."""
        return f"{self.results}/pretrain_runs/{encoder_path(dataset, objective, preset)}"

    def finetune_dir(self, dataset: str, objective: str, preset: str, ft: str) -> str:
        """The folder of fine-tuning run ``ft``'s head on an encoder: head.safetensors, head.json."""
        return f"{self.results}/finetune/{encoder_path(dataset, objective, preset)}/{ft}"

    def finetune_run_dir(self, dataset: str, objective: str, preset: str, ft: str) -> str:
        """A fine-tuning run's folder: checkpoints, metrics.csv, train.log."""
        return f"{self.results}/finetune_runs/{encoder_path(dataset, objective, preset)}/{ft}"

    def evaluation_path(self, dataset: str, objective: str, preset: str, name: str) -> str:
        """The evaluation TSV of run or read-out ``name`` (readout_run) on an encoder."""
        return f"{self.results}/evaluation/{encoder_path(dataset, objective, preset)}/{name}.tsv"

    def contact_map_prefix(self, dataset: str, objective: str, preset: str, name: str) -> str:
        """The contact-map figure of run or read-out ``name`` on an encoder, without its extension (.png, .svg)."""
        return f"{self.results}/figures/contact_maps/{encoder_path(dataset, objective, preset)}/{name}"

    def pretrain_metrics_path(self, dataset: str, objective: str, preset: str) -> str:
        """A finished pre-training run's metrics log, beside its weights (the trainer copies it from the run
        folder)."""
        return f"{self.model_dir(dataset, objective, preset)}/{METRICS_CSV}"

    def finetune_metrics_path(self, dataset: str, objective: str, preset: str, ft: str) -> str:
        """A finished fine-tuning run's metrics log, beside its head."""
        return f"{self.finetune_dir(dataset, objective, preset, ft)}/{METRICS_CSV}"
