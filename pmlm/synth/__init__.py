"""Synthetic protein families with known couplings, to test that the pair head learns co-evolution."""
