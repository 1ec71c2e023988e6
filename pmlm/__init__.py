"""pmlm: Pairwise Masked Language Model pre-training and evaluation for proteins."""

__version__ = "0.1.0"
