"""dpgen_bench: train differentially private image generators under one shared budget,
evaluate their samples, and render the papers' comparison tables.

From Python (a notebook), what ``bench run`` and ``bench eval`` do::

    import dpgen_bench
    record = dpgen_bench.run("dpgan", "digits", epsilon=10, seed=0)
    record["privacy"]["epsilon"], record["metrics"], record["run_dir"]
    dpgen_bench.evaluate(record["run_dir"], ["real2gen_cnn"])

Log lines go through the ``dpgen_bench`` logger (``dpgen_bench.logs.setup_logging()``
prints them on stderr as the CLI does).
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"


def run(method: str, dataset: str = "digits", *, epsilon: float | None = None, out: str | None = None,
        results: str | None = None, data_root: str | None = None, **settings: Any) -> dict[str, Any]:
    """Train ``method`` on ``dataset`` at ``epsilon`` (None for a non-private method),
    sample, evaluate and record, as ``bench run`` does. ``settings``: the other keywords of
    ``dpgen_bench.config.build_config`` (delta, preset, seed, hparams, evaluators, ...).
    Returns the record: ``run_dir``, ``privacy`` (privacy.json), ``metrics``, ``protocol``."""
    from . import runner
    from .config import build_config

    config = build_config(method, dataset, epsilon=epsilon, **settings)
    return runner.run(config, out=out, results=results, data_root=data_root)


def evaluate(run_dir: str, evaluators: list[str] | tuple[str, ...] | None = None,
             data_root: str | None = None) -> dict[str, Any]:
    """Re-run evaluators on a finished run (its checkpoint and samples; no training) and
    merge them into its eval.json, as ``bench eval`` does. Returns the merged eval.json."""
    from . import runner

    return runner.reevaluate(run_dir, tuple(evaluators) if evaluators else None, data_root)
