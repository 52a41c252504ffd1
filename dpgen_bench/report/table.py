"""Records → one long pandas frame (one row per run × metric) → tables."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from .. import registry, store


def collect(root: Path) -> tuple[pd.DataFrame, int]:
    """Long frame of all complete runs under ``root`` and the number of incomplete ones."""
    rows, skipped = [], 0
    for run_dir in store.iter_run_dirs(root):
        rec = store.load_record(run_dir)
        if rec is None:
            skipped += 1
            continue
        cfg, priv, ev = rec["config"], rec["privacy"], rec["eval"]
        base = {
            "run_id": cfg.get("run_id", run_dir.name),
            "method": cfg["method"],
            "dataset": cfg["dataset"],
            "preset": cfg.get("preset"),
            "seed": cfg.get("seed"),
            "members": cfg.get("members"),
            "eps_target": float(priv["target"]["epsilon"]),
            "delta": float(priv["target"]["delta"]),
            "eps_rdp": float(priv["epsilon"]["rdp"]),
            "eps_prv": float(priv["epsilon"]["prv"]),
        }
        for metric, value in ev.get("metrics", {}).items():
            rows.append({**base, "metric": metric, "value": float(value)})
        if not ev.get("metrics"):
            rows.append({**base, "metric": None, "value": math.nan})
    return pd.DataFrame(rows), skipped


def _fmt_eps(x: float) -> str:
    return "∞" if not math.isfinite(x) else f"{x:.3g}"


def _arrow(metric: str) -> str:
    try:
        return " ↑" if registry.evaluators.get(metric).higher_is_better else " ↓"
    except Exception:  # noqa: BLE001 - a metric key that is not an evaluator name
        return ""


def runs_table(long: pd.DataFrame) -> pd.DataFrame:
    """One row per run: identification, ε target / spent, one column per metric."""
    if long.empty:
        return long
    keys = ["method", "dataset", "preset", "seed", "eps_target", "eps_rdp", "eps_prv", "delta", "run_id"]
    wide = long.dropna(subset=["metric"]).pivot_table(index=keys, columns="metric", values="value", aggfunc="first")
    runs = long[keys].drop_duplicates().set_index(keys)
    wide = runs.join(wide).reset_index()
    return wide.sort_values(["dataset", "method", "eps_target", "seed"], kind="stable")


def render_markdown(wide: pd.DataFrame) -> str:
    if wide.empty:
        return "_no completed runs_\n"
    metrics = [c for c in wide.columns if c not in
               ("method", "dataset", "preset", "seed", "eps_target", "eps_rdp", "eps_prv", "delta", "run_id")]
    header = ["method", "dataset", "preset", "seed", "ε target", "ε RDP", "ε PRV", "δ"] + [m + _arrow(m) for m in metrics]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for _, r in wide.iterrows():
        cells = [r["method"], r["dataset"], str(r["preset"]), str(r["seed"]), _fmt_eps(r["eps_target"]),
                 _fmt_eps(r["eps_rdp"]), _fmt_eps(r["eps_prv"]), f"{r['delta']:g}"]
        cells += ["—" if pd.isna(r[m]) else f"{r[m]:.4g}" for m in metrics]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
