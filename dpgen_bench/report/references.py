"""Published reference numbers shipped as data (``references.csv``), as rows marked
"(paper)" on the same axes as ours. Each row carries its paper, table and page, and what its
ε is (``accounting``, a key of ``ACCOUNTING``): a number whose ε is not a DP guarantee of its
setting carries that as its ``caveat``, which the tables mark ‡ as they mark our own runs'
(``table.CAVEAT_MARK``); ``eps_sound`` is the ε of its published setting accounted soundly,
where benchmarks/gswgan_eps.py computes it."""

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
# What a published ε is (references.csv's ``accounting``): None where it is a DP guarantee of the
# setting by a standard accountant, else what it is and where that is argued: its cells' caveat.
ACCOUNTING = {
    "standard": None,
    "per-row": ("ε by per-row accounting (GS-WGAN's code: T·B compositions at rate 1/K; DPImageBench's: T), each "
                "of a step's B noised rows amplified on its own though all come from one discriminator's draw",
                'docs/privacy.md, "What GS-WGAN\'s published ε costs"'),
    "dpaf-paper": ("ε by DPAF's own accounting of Algorithm 1, which misses C's non-private layers, the "
                   "batch-coupled losses and the reused μ batches (the sound mode closes them)",
                   "methods/dpaf docstring"),
}


def caveat(accounting: str, eps_sound: float | None) -> str | None:
    """The caveat of a reference row: what its accounting is, the sound ε of its published
    setting where one is computed, and where both are argued."""
    if accounting not in ACCOUNTING:
        raise ValueError(f"references.csv: unknown accounting '{accounting}' (known: {', '.join(ACCOUNTING)})")
    if ACCOUNTING[accounting] is None:
        return None
    text, where = ACCOUNTING[accounting]
    if eps_sound is not None and not pd.isna(eps_sound):
        text += f"; its published setting, rows accounted jointly: ε = {eps_sound:,.0f}"
    return f"{text}; not a DP guarantee ({where})"


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
        "caveat": [caveat(a, e) for a, e in zip(ref["accounting"], ref["eps_sound"])],
    })
