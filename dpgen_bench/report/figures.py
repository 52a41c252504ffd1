"""Figures from run records (matplotlib, PNG and PDF): metric vs ε per method with error
bars, sample grids side by side, MIA ROC curves, training curves. Files of a run are read
from the directory its record was read from (``run_dir``), whatever its ``run_id``
says; figures use matplotlib's constrained layout, so a figure title never overlaps the
subplots' titles."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from .. import store


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, out: Path, name: str) -> list[Path]:
    paths = []
    for ext in ("png", "pdf"):
        p = out / f"{name}.{ext}"
        with store.atomic_open(p) as f:
            fig.savefig(f, format=ext, dpi=120, bbox_inches="tight")
        paths.append(p)
    _plt().close(fig)
    return paths


def metric_vs_eps(agg: pd.DataFrame, out: Path) -> list[Path]:
    plt = _plt()
    paths = []
    ours = agg[(agg["source"] == "ours") & np.isfinite(agg["eps_target"])]
    for (dataset, metric), g in ours.groupby(["dataset", "metric"]):
        fig, axes = _figure(plt)
        ax = axes[0][0]
        for method, gm in g.groupby("method"):
            gm = gm.sort_values("eps_target")
            ax.errorbar(gm["eps_target"], gm["mean"], yerr=gm["std"].fillna(0), marker="o", capsize=3, label=method)
        ax.set_xscale("log")
        ax.set_xlabel("target ε")
        ax.set_ylabel(metric)
        ax.set_title(dataset)
        ax.legend(fontsize=8)
        paths += _save(fig, out, f"{dataset}-{metric}-vs-eps")
    return paths


def _figure(plt, ncols: int = 1, figsize=(4.5, 3.2)):
    return plt.subplots(1, ncols, figsize=figsize, squeeze=False, layout="constrained")


def sample_grids(long: pd.DataFrame, out: Path, per_class: int = 8) -> list[Path]:
    """One panel per (dataset, ε) with each method's samples side by side (first seed)."""
    plt = _plt()
    from torchvision.utils import make_grid
    import torch

    paths = []
    runs = long.drop_duplicates("run_dir").sort_values(["dataset", "eps_target", "method", "seed"])
    for (dataset, eps), g in runs.groupby(["dataset", "eps_target"]):
        g = g.drop_duplicates("method")
        fig, axes = _figure(plt, len(g), figsize=(2.6 * len(g), 3.0))
        for ax, (_, r) in zip(axes[0], g.iterrows()):
            s = np.load(Path(r["run_dir"]) / "samples.npz")
            imgs, labels = torch.from_numpy(s["images"]), torch.from_numpy(s["labels"])
            rows = [imgs[labels == c][:per_class] for c in labels.unique()[:10]]
            grid = make_grid(torch.cat(rows), nrow=per_class, normalize=True, value_range=(-1, 1), padding=1)
            ax.imshow(grid.permute(1, 2, 0).numpy(), interpolation="nearest")
            ax.set_title(r["method"], fontsize=9)
            ax.axis("off")
        fig.suptitle(f"{dataset}, ε = {'∞' if not math.isfinite(eps) else f'{eps:g}'}", fontsize=10)
        paths += _save(fig, out, f"{dataset}-eps{eps:g}-samples")
    return paths


def roc_curves(long: pd.DataFrame, out: Path) -> list[Path]:
    plt = _plt()
    paths = []
    mia = long[long["metric"].fillna("").str.startswith("mia_auc_")]
    for (dataset, metric), g in mia.groupby(["dataset", "metric"]):
        fig, axes = _figure(plt, figsize=(3.6, 3.4))
        ax = axes[0][0]
        for _, r in g.drop_duplicates("run_dir").iterrows():
            proto = store.read_json(Path(r["run_dir"]) / "eval.json")["protocol"].get(metric, {})
            roc = proto.get("roc")
            if roc:
                eps = "∞" if not math.isfinite(r["eps_target"]) else f"{r['eps_target']:g}"
                ax.plot(roc["fpr"], roc["tpr"], label=f"{r['method']} ε={eps} (AUC {r['value']:.2f})")
        ax.plot([0, 1], [0, 1], "k:", lw=0.8)
        ax.set_xlabel("false positive rate")
        ax.set_ylabel("true positive rate")
        ax.set_title(f"{dataset}: {metric[len('mia_auc_'):]}", fontsize=9)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=6)
        paths += _save(fig, out, f"{dataset}-{metric}-roc")
    return paths


def training_curves(long: pd.DataFrame, out: Path) -> list[Path]:
    plt = _plt()
    paths = []
    for run_id, run_dir in long[["run_id", "run_dir"]].drop_duplicates("run_dir").itertuples(index=False):
        f = Path(run_dir) / "train.jsonl"
        if not f.is_file():
            continue
        lines = [json.loads(x) for x in f.read_text().splitlines() if x.strip()]
        if not lines:
            continue
        df = pd.DataFrame(lines)
        x = "d_step" if "d_step" in df else df.columns[0]
        keys = [k for k in ("d_loss", "g_loss", "n_d", "d_fake_acc_ema", "d_fake_acc") if k in df and df[k].notna().any()]
        if not keys:
            continue
        fig, axes = _figure(plt, len(keys), figsize=(3 * len(keys), 2.8))
        for ax, k in zip(axes[0], keys):
            ax.plot(df[x], df[k])
            ax.set_xlabel(x)
            ax.set_title(k, fontsize=9)
            if k == "n_d":
                ax.set_yscale("log")
        fig.suptitle(run_id, fontsize=8)
        paths += _save(fig, out, f"{run_id}-training")
    return paths


def all_figures(long: pd.DataFrame, agg: pd.DataFrame, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    ours = long[long["source"] == "ours"]
    return metric_vs_eps(agg, out) + sample_grids(ours, out) + roc_curves(ours, out) + training_curves(ours, out)
