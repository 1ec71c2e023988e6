"""Typed configuration: the YAML -> dataclass machinery (``tree``), the pre-training and fine-tuning recipes
(``pretraining``, ``finetuning``, their ``optim`` sections in ``optim``) and the workflow config's checks
(``workflow``). Importing this package loads nothing heavy: the Snakefile reads ``pmlm.config.workflow``."""
