"""Evaluation: exact metric definitions (``metrics``) and contact scores without
fine-tuning (``unsupervised``)."""
