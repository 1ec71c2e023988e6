"""Command modules: each subcommand's arguments (``add_arguments``) and the dotted name of the engine module
whose ``run(args)`` does the work (``ENGINE``). Standard library and light contracts only, so ``pmlm.cli``
builds every parser where torch, pyarrow or pandas are not installed."""
