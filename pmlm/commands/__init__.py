"""Command-line definitions of the ``pmlm`` subcommands: argparse only, standard library and light contracts."""
