"""Planted-coupling study: how well MLM and PMLM encoders trained on synthetic Potts families recover
the families' couplings (``pmlm coevolution``; read-outs in ``readouts``, aggregation in ``report``)."""
