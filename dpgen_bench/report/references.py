"""Published reference numbers shipped as data (``references.csv``), as rows marked
"(paper)" on the same axes as ours. Each row carries its paper, table and page."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

PATH = Path(__file__).with_name("references.csv")


def load_references(path: Path = PATH) -> pd.DataFrame:
    """References as a long frame with the columns of ``collect`` (source = "paper")."""
    ref = pd.read_csv(path, dtype={"members": "Int64"})
    return pd.DataFrame({
        "run_id": ref["paper"] + ":" + ref["table"].astype(str),
        "method": ref["method"],
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
    })
