"""The command layer: one module per ``pmlm`` subcommand, argparse only.

Each module defines ``add_arguments(parser)`` and ``ENGINE``, the dotted module whose ``run(args) -> int``
does the work. Command modules import the standard library and light contracts only (never torch,
pyarrow, pandas or safetensors, not even transitively; tests/test_envs.py checks it), so that
``pmlm.cli`` can build every parser cheaply and ``pmlm fetch`` runs where torch is not installed.
"""
