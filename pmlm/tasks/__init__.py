"""Downstream task data: structures and contact maps (``structures``), TAPE's task files
(``tape``) and RaptorX/ESM-style contact sets (``raptorx``)."""
