"""Typed configuration: the YAML -> dataclass machinery (``tree``) and the pre-training and fine-tuning recipes
(``pretraining``, ``finetuning``, their ``optim`` sections in ``optim``). Importing this package loads nothing heavy.
(The workflow config's checks are workflow code: workflow/lib/workflow_config.py.)"""
