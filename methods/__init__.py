"""Built-in methods. Each is one module plus one line in ``dpgen_bench/registry.py``."""
