"""The package's version, in one place: pyproject.toml reads it from here, and every record of provenance
(sidecars, embeddings, run information) and ``pmlm --version`` quote it."""

__version__ = "0.1.0"
