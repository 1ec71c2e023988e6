"""pmlm: Pairwise Masked Language Model pre-training and evaluation for proteins."""

from pmlm.version import __version__

__all__ = ["__version__", "load"]


def load(path, device: str = "cpu", *, encoder=None, precision: str = "auto", adapter=None):
    """A trained encoder or contact head as an object with ``embed()``, ``contacts()`` and ``score()``, computing
    at ``precision`` (``auto``: what its run recorded; see ``pmlm.inference.api``); ``adapter``: a fine-tuned run's
    LoRA adapters put into the encoder.

    Imported here rather than at the top: ``import pmlm`` must not load torch, which the data stage's
    environments do not have.
    """
    from pmlm.inference.api import load as load_model

    return load_model(path, device, encoder=encoder, precision=precision, adapter=adapter)
