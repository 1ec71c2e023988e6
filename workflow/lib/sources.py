"""The files the workflow downloads (config ``sources`` and the released checkpoints) and the pre-training datasets
built from them: where each lands, and the flags of the data stage's commands."""

from __future__ import annotations

import os
import shlex
from urllib.parse import urlparse

from flags import as_flags, as_sets, canonical
from paths import Paths
from workflow_config import is_transformers_release, release_source

CHECKSUMS = ("md5", "sha256")


class Sources:
    """The configured sources, and a release's checkpoint as one more (fetch_source: resumable, checksummed)."""

    def __init__(self, config: dict, basedir: str):
        self.basedir = basedir
        released = [m for m in config["pretrain"]["models"] if m.get("release")]
        self.sources = {
            **config["sources"],
            **{
                release_source(m): {"url": m["release"]["url"], "sha256": m["release"]["sha256"]}
                for m in released
                if not is_transformers_release(m)
            },
        }

    def url(self, name: str) -> str:
        """A relative file: URL names a file of this repository (the demo data)."""
        url = self.sources[name]["url"]
        parsed = urlparse(url)
        if parsed.scheme == "file" and not url.startswith("file://"):
            return "file://" + os.path.abspath(os.path.join(self.basedir, parsed.path))
        return url

    def filename(self, name: str) -> str:
        return os.path.basename(urlparse(self.sources[name]["url"]).path) or f"{name}.download"

    def downloaded(self, name: str) -> str:
        return f"resources/sources/{name}/{self.filename(name)}"

    def source_file(self, name: str) -> str:
        """The file a dataset reads: the download itself, or the configured member of a tar archive."""
        member = self.sources[name].get("member")
        if member:
            return f"resources/sources/{name}/members/{member}"
        return self.downloaded(name)

    def fetch_url(self, wildcards) -> str:
        return self.url(wildcards.source)

    def downloaded_archive(self, wildcards) -> str:
        return self.downloaded(wildcards.source)

    def checksum_args(self, wildcards) -> str:
        src = self.sources[wildcards.source]
        args = []
        for algo in CHECKSUMS:
            if src.get(algo):
                args += [f"--{algo}", src[algo]]
        if src.get("checksums_from"):
            args += ["--checksums-from", shlex.quote(src["checksums_from"])]
        return " ".join(args)


class Datasets:
    """The pre-training datasets (config ``datasets``): their inputs and the flags of ingest, split and tokenize."""

    def __init__(self, config: dict, sources: Sources, paths: Paths):
        self.config, self.sources, self.paths = config, sources, paths
        self.datasets = config["datasets"]

    def setting(self, dataset: str, section: str) -> dict:
        """Global section (e.g. cluster:) overlaid with the dataset's own keys."""
        merged = dict(self.config.get(section) or {})
        merged.update(self.datasets[dataset].get(section) or {})
        return merged

    def shard_setting(self, dataset: str, key: str):
        return self.setting(dataset, "shards")[key]

    def dataset_sources(self, wildcards) -> list[str]:
        return [self.sources.source_file(s) for s in self.datasets[wildcards.dataset]["sources"]]

    def decontamination_sources(self, wildcards) -> list[str]:
        return [self.sources.source_file(s) for s in self.datasets[wildcards.dataset]["decontaminate"]]

    @staticmethod
    def decontamination_args(wildcards, input) -> str:
        return ("--decontaminate " + " ".join(map(shlex.quote, input.references))) if input.references else ""

    def ingest_formats(self, wildcards) -> str:
        """One --format per input, in the order of dataset_sources (auto: detected by content)."""
        sources = self.sources.sources
        return ",".join(sources[s].get("format") or "auto" for s in self.datasets[wildcards.dataset]["sources"])

    def ingest_args(self, wildcards) -> str:
        return as_sets(self.setting(wildcards.dataset, "ingest"))

    def split_args(self, wildcards) -> str:
        """`pmlm split` flags from the cluster settings (their keys are its flags)."""
        return as_flags(canonical(self.setting(wildcards.dataset, "cluster")))

    def tokenize_args(self, wildcards) -> str:
        """`pmlm tokenize` flags from the shard layout (its keys are the flags)."""
        return as_flags(canonical(self.setting(wildcards.dataset, "shards")))

    def dataset_shards(self, wildcards) -> str:
        return self.paths.shards_dir(wildcards.dataset)

    def targets(self) -> list[str]:
        return [self.paths.shards_dir(d) for d in self.datasets]
