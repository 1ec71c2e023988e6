"""Fine-tuning and evaluation engine: task data, the fine-tuning loop (``pmlm finetune``) and the scoring of a
fine-tuned head or the pair head's read-out on test sets (``pmlm evaluate``). The task heads are model code
(``pmlm.model.task_heads``); a head is loaded back through ``pmlm.pretrained``."""
