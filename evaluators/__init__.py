"""Built-in evaluators (registered in ``dpgen_bench/registry.py``)."""
