"""The symmetrisation of pair maps, shared by the contact heads and the contact read-outs."""

from __future__ import annotations


def symmetrize(matrix):
    """(..., L, L) -> (M + M^T) / 2 over the last two axes (NumPy arrays or torch tensors)."""
    return (matrix + matrix.swapaxes(-1, -2)) / 2
