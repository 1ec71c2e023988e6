"""The ProteinGym benchmark's inputs and params (workflow/rules/proteingym.smk): the assays to score, the encoders
that score them and the files of each step."""

from __future__ import annotations

import shlex

from encoders import Encoders, encoder_id, encoder_label
from flags import as_flags
from paths import Paths
from sources import Sources

from pmlm.proteingym.reference import read_selection

ALL_ASSAYS = "all"  # proteingym.assays: every assay of the reference file
SCORE_FLAGS = ("double", "mismatch", "permutations", "device")  # the config keys that are `pmlm proteingym score` flags
FIGURE_SUFFIX = "_categories.png"  # the first figure `pmlm proteingym tables` writes beside its prefix


class ProteinGym:
    """Config ``proteingym``. ``checkpoints`` is the workflow's: the assays, when they depend on the data, are read
    from the output of checkpoint select_proteingym_assays."""

    def __init__(self, config: dict, paths: Paths, sources: Sources, encoders: Encoders, checkpoints):
        self.paths, self.sources, self.encoders, self.checkpoints = paths, sources, encoders, checkpoints
        self.settings = config["proteingym"]
        self.dir = f"{paths.results}/proteingym"
        self.selection = f"{self.dir}/assays.tsv"

    def enabled(self) -> bool:
        """The benchmark runs when proteingym.archive names a source."""
        return bool(self.settings.get("archive"))

    def scoring_encoders(self) -> list[dict]:
        """The encoders ProteinGym scores: the pre-trained encoders proteingym.encoders lists, else all of them."""
        wanted = self.settings["encoders"]
        return [m for m in self.encoders.models if not wanted or encoder_id(m) in wanted]

    def archive(self, wildcards=None) -> str:
        return self.sources.downloaded(self.settings["archive"])

    def reference(self, wildcards=None) -> str:
        return self.sources.source_file(self.settings["reference"])

    def fixed_assays(self) -> list[str] | None:
        """The assays when the config names them (and no length limit drops any): known before anything runs."""
        assays = self.settings["assays"]
        if assays == ALL_ASSAYS or self.settings["max_length"] is not None:
            return None
        return list(dict.fromkeys(assays))

    def assay_ids(self) -> list[str]:
        """DMS ids to score: the configured list, or the selection written by the checkpoint (all, or by length)."""
        fixed = self.fixed_assays()
        if fixed is not None:
            return fixed
        selection = self.checkpoints.select_proteingym_assays.get().output[0]
        return [a.dms_id for a in read_selection(selection)]

    def select_args(self, wildcards) -> str:
        assays = self.settings["assays"]
        args = ["--assays", assays if assays == ALL_ASSAYS else ",".join(assays)]
        if self.settings["max_length"] is not None:
            args += ["--max-length", str(self.settings["max_length"])]
        return " ".join(shlex.quote(a) for a in args)

    def scores_dir(self, m: dict) -> str:
        return f"{self.dir}/scores/{encoder_id(m)}"

    def score_inputs(self, wildcards) -> dict[str, str]:
        weights = self.encoders.pretrained_weights(self.encoders.model_of(wildcards))
        return {"weights": weights, "assays": self.selection, "archive": self.archive()}

    def score_args(self, wildcards) -> str:
        """`pmlm proteingym score` flags from the config, and the encoder's row label."""
        flags = as_flags({k: self.settings[k] for k in SCORE_FLAGS})
        return f"{flags} --label {shlex.quote(encoder_label(self.encoders.model_of(wildcards)))}"

    def score_files(self, wildcards) -> list[str]:
        """Every encoder's summary of every selected assay (after the selection when it depends on the data)."""
        ids = self.assay_ids()
        return [f"{self.scores_dir(m)}/{assay}.json" for m in self.scoring_encoders() for assay in ids]

    def aggregate_args(self, wildcards) -> str:
        return " ".join(
            f"--encoder {shlex.quote(f'{encoder_label(m)}={self.scores_dir(m)}')}" for m in self.scoring_encoders()
        )

    @staticmethod
    def figure_prefix(wildcards, output) -> str:
        """The prefix `pmlm proteingym tables` extends with _categories and _doubles (from the first figure)."""
        return output.png[: -len(FIGURE_SUFFIX)]

    def targets(self) -> list[str]:
        if not self.enabled():
            return []
        results = self.paths.results
        return [
            f"{results}/tables/proteingym.html",
            f"{results}/figures/proteingym_categories.svg",
            f"{results}/figures/proteingym_doubles.svg",
        ]
