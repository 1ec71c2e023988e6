"""Fine-tuning and evaluation engine: task heads, task data, the fine-tuning loop (``pmlm finetune``) and
scoring (``pmlm evaluate``)."""
