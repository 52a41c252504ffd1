"""Published reference numbers shipped as data (``references.csv``), as rows marked
"(paper)" on the same axes as ours. Each row carries its paper, table and page."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

PATH = Path(__file__).with_name("references.csv")
# Published metrics that no evaluator here computes are left out of the tables (kept in the
# CSV as the papers give them): Inception Score needs Inception's logits, and the converted
# Inception behind fid / kid has none (evaluators.inception: pool3 features only).
NOT_COMPUTED = {"is": "Inception Score"}
# The papers' names of methods this harness implements, as our registry names them, so that
# "dpmerf (paper)" stands beside "dpmerf" (the CSV keeps the papers' spelling).
ALIASES = {"dp-merf": "dpmerf", "dp-sinkhorn": "dpsinkhorn", "dp-ntk": "dpntk", "dp-kernel": "dpkernel"}


def load_references(path: Path = PATH) -> pd.DataFrame:
    """References as a long frame with the columns of ``collect`` (source = "paper"), without
    the metrics in ``NOT_COMPUTED``."""
    ref = pd.read_csv(path, dtype={"members": "Int64"})
    ref = ref[~ref["metric"].isin(NOT_COMPUTED)].reset_index(drop=True)
    return pd.DataFrame({
        "run_id": ref["paper"] + ":" + ref["table"].astype(str),
        "method": ref["method"].replace(ALIASES),
        "dataset": ref["dataset"],
        "preset": "paper",
        "seed": 0,
        "members": ref["members"].fillna(0).astype(int),
        "eps_target": ref["epsilon"].astype(float),
        "delta": ref["delta"].astype(float),
        "eps_rdp": float("nan"),
        "eps_prv": float("nan"),
        "metric": ref["metric"],
        "value": ref["value"].astype(float),
        "source": "paper",
        "ref_std": ref["std"].astype(float),
        "reported_in": ref["reported_in"],  # empty / "This work": the paper reports its own method
    })
