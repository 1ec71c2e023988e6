"""Using a trained encoder: per-residue embeddings, contact maps and mutation scores, the engines behind
``pmlm embed``, ``pmlm contacts``, ``pmlm score`` and the Python API ``pmlm.load``."""
