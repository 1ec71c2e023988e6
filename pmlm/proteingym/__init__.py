"""Zero-shot mutation effects on ProteinGym's deep mutational scans: the assays as published, every mutant
scored by an encoder (masked marginals, the pair head's joint for doubles), ProteinGym's metrics and
aggregation, and tables beside the published models."""
