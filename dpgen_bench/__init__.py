"""dpgen_bench: train differentially private image generators under one shared budget,
evaluate their samples, and render the papers' comparison tables."""

__version__ = "0.1.0"
