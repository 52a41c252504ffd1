"""Figures from run records (matplotlib, PNG and PDF): the utility–privacy curve of each
metric against ε (ε = ∞ and the dpmean floor included, ``draw_metric_vs_eps``), sample
grids side by side, MIA ROC curves, training curves. Files of a run are read from the
directory its record was read from (``run_dir``), whatever its ``run_id`` says; figures
use matplotlib's constrained layout, so a figure title never overlaps the subplots'
titles."""

from __future__ import annotations

import json
import math
import re
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd

from .. import registry, store
from ..privacy import fmt_eps


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


CHANCE_PREFIXES = ("gen2real_", "real2gen_")  # classification accuracies: 1 / classes is chance
INF_GAP_DECADES = 1.0  # ε = ∞ sits this many decades right of the largest finite ε
INF_DODGE_DECADES = 0.07  # spread of the points that share the ∞ slot, so none hides another


def _base_method(label: str) -> str:
    return label.split(" [", 1)[0]


def is_floor(method: str) -> bool:
    """Whether a method is a floor (``Method.is_floor``, e.g. dpmean's class means), drawn as
    a band, not a line; False for a method not installed here."""
    try:
        return bool(registry.methods.attribute(method, "is_floor"))
    except Exception:  # noqa: BLE001 - a method that is not installed here (or cannot load): no floor
        return False


def _settings(label: str) -> list[str]:
    _, _, rest = label.partition(" [")
    return [s for s in (rest[:-1] if rest.endswith("]") else rest).split(", ") if s]


def _with_settings(base: str, settings: list[str]) -> str:
    return f"{base} [{', '.join(settings)}]" if settings else base


def _colour_key(label: str) -> str:
    """A configuration's label without its noise setting: ``dpaf [noise=on]`` and
    ``dpaf [noise=off]`` share a colour."""
    return _with_settings(_base_method(label), [s for s in _settings(label) if not s.startswith("noise=")])


def _noise_off_label(label: str) -> str:
    """``dpaf [noise=off]``, as the tables say it; a method whose only configuration is
    the noise-off one has no setting in its table label, so the figure adds it."""
    settings = _settings(label)
    return label if "noise=off" in settings else _with_settings(_base_method(label), settings + ["noise=off"])


def method_colours(labels) -> dict[str, str]:
    """One colour per configuration (its noise setting aside), in the order of the sorted
    labels: computed over all datasets and metrics, a method has one colour in every figure."""
    keys = sorted({_colour_key(x) for x in labels})
    palette = _plt().get_cmap("tab10" if len(keys) <= 10 else "tab20").colors
    return {k: palette[i % len(palette)] for i, k in enumerate(keys)}


def draw_metric_vs_eps(ax, rows: pd.DataFrame, metric: str, num_classes: int | None = None,
                       colours: dict[str, str] | None = None) -> None:
    """The utility–privacy curve of one (dataset, metric) on ``ax``, from the ``aggregate``
    rows of our runs: mean ± std over seeds (error bars; none where n = 1) against the
    target ε on a log axis, one line per configuration (``method`` as the tables label it).

    - ε = ∞ is the last point of the axis, ``INF_GAP_DECADES`` right of the largest finite
      ε, with a tick "∞", a dashed separator and a ``//`` break on both spines, so it never
      reads as a number. Non-private runs (target ε = ∞, such as ``gan``) sit only there,
      filled; a ``--noise-off`` run (a private target, ε spent ∞) sits there as a hollow
      marker in its method's colour, labelled ``<method> [noise=off]``, never joined to its
      method's line. Points sharing the slot are spread a little apart.
    - A floor (a method with ``is_floor``: ``dpmean``) is a shaded band, never a line: with runs at several ε, the
      band follows its mean ± std over seeds per ε (``fill_between`` across the ε it ran at,
      not extrapolated past them); with one ε, the mean ± std over its seeds spans the whole
      finite part of the axis and its label names that ε. A ``dpmean`` noise-off run is a
      hollow marker at ∞ like any other.
    - Chance (1 / ``num_classes``) is a dotted grey line for the accuracies
      ``gen2real_*`` / ``real2gen_*`` when the number of classes is known; an MIA AUC has
      its ideal (no leakage) as the dotted line instead.
    - When the rows mix member counts (MIA metrics: all members, or ``--members N``), a
      configuration keeps its colour and the ``N members`` curve is dashed with square
      markers, its label saying the count."""
    from matplotlib.ticker import FixedLocator, NullLocator
    from matplotlib.transforms import blended_transform_factory

    from .table import MIA_IDEAL, MIA_PREFIX, arrow

    rows = rows[rows["mean"].notna()]
    if colours is None:
        colours = method_colours(rows["method"])
    several_members = rows["members"].nunique() > 1

    def style(method: str, members: int) -> dict:
        sub = several_members and bool(members)
        return {"color": colours.get(_colour_key(method), "k"), "marker": "s" if sub else "o",
                "ls": "--" if sub else "-"}

    def name(method: str, members: int) -> str:
        return method + (f", {members} members" if several_members and members else "")

    finite_target = np.isfinite(rows["eps_target"].astype(float))
    noise_off = finite_target & np.isinf(rows["eps_rdp"].astype(float))
    base = rows["method"].map(_base_method)
    floor = finite_target & ~noise_off & base.map({m: is_floor(m) for m in base.unique()}).astype(bool)
    private = finite_target & ~noise_off & ~floor

    finite = sorted(rows.loc[private | floor, "eps_target"].astype(float).unique())
    if finite:
        x_inf = finite[-1] * 10 ** INF_GAP_DECADES
        x_break = finite[-1] * 10 ** (INF_GAP_DECADES / 2)
        left = finite[0] / 10 ** 0.3
    else:
        x_inf, x_break, left = 1.0, None, 10 ** -0.5
    ax.set_xscale("log")

    legend: dict[str, object] = {}  # label → handle, in the order drawn: lines, ∞, floor, dotted reference

    def keep(draw, label: str, **kw) -> None:
        artist = draw(**kw, label="_nolegend_" if label in legend else label)
        legend.setdefault(label, artist)

    for (method, members), gm in rows[private].groupby(["method", "members"], sort=True):
        gm = gm.sort_values("eps_target")
        keep(ax.errorbar, name(method, members), x=gm["eps_target"].astype(float), y=gm["mean"], yerr=gm["std"],
             ms=4, capsize=3, **style(method, members))

    at_inf = [(r, False) for _, r in rows[~finite_target].sort_values(["method", "members"]).iterrows()]
    at_inf += [(r, True) for _, r in rows[noise_off].sort_values(["method", "members", "eps_target"]).iterrows()]
    targets = rows[noise_off].groupby(["method", "members"])["eps_target"].nunique()
    for k, (r, hollow) in enumerate(at_inf):
        x = x_inf * 10 ** ((k - (len(at_inf) - 1) / 2) * INF_DODGE_DECADES)
        label = name(_noise_off_label(r["method"]) if hollow else r["method"], r["members"])
        if hollow and targets[(r["method"], r["members"])] > 1:  # σ calibrated for several targets: one point each
            label += f", σ of ε={fmt_eps(float(r['eps_target']))}"
        st = style(r["method"], r["members"])
        keep(ax.errorbar, label, x=[x], y=[r["mean"]], yerr=[r["std"]], ms=5, capsize=3, color=st["color"],
             marker=st["marker"], ls="none", mfc="white" if hollow else st["color"])

    for (method, members), gm in rows[floor].groupby(["method", "members"], sort=True):
        gm = gm.sort_values("eps_target")
        eps = gm["eps_target"].astype(float).to_numpy()
        mean, std = gm["mean"].to_numpy(), gm["std"].fillna(0).to_numpy()
        label = f"{name(method, members)} (floor)"
        if len(eps) == 1:
            label = f"{name(method, members)} (floor, ε={fmt_eps(eps[0])})"
            eps = np.array([left, x_break])  # a floor has a finite ε, so the break exists
            mean, std = np.repeat(mean, 2), np.repeat(std, 2)
        keep(ax.fill_between, label, x=eps, y1=mean - std, y2=mean + std, color=style(method, members)["color"],
             alpha=0.25, lw=1)

    if metric.startswith(CHANCE_PREFIXES) and num_classes:
        keep(ax.axhline, f"chance (1/{num_classes})", y=1 / num_classes, color="0.5", ls=":", lw=1)
    elif metric.startswith(MIA_PREFIX):
        keep(ax.axhline, f"no leakage ({MIA_IDEAL:g})", y=MIA_IDEAL, color="0.5", ls=":", lw=1)

    ax.xaxis.set_major_locator(FixedLocator(finite + [x_inf]))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticklabels([fmt_eps(e) for e in finite] + ["∞"])
    ax.set_xlim(left, x_inf * 10 ** 0.3)
    if x_break is not None:
        ax.axvline(x_break, color="0.6", ls="--", lw=0.8, zorder=0)
        spine = blended_transform_factory(ax.transData, ax.transAxes)
        for y in (0, 1):
            ax.text(x_break, y, "//", transform=spine, ha="center", va="center", fontsize=9, clip_on=False,
                    bbox={"facecolor": "white", "edgecolor": "none", "pad": 0.5})
    ax.set_xlabel("target ε")
    ax.set_ylabel(metric + arrow(metric))
    if legend:
        ax.legend(list(legend.values()), list(legend), fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1),
                  borderaxespad=0)


def metric_vs_eps(agg: pd.DataFrame, out: Path, num_classes: dict[str, int] | None = None) -> list[Path]:
    """The utility–privacy curve of each (dataset, metric) of our runs
    (``draw_metric_vs_eps``), written as ``<dataset>-<metric>-vs-eps.png/.pdf``;
    ``num_classes`` (per dataset, ``classes_per_dataset``) gives the chance line."""
    plt = _plt()
    paths = []
    ours = agg[agg["source"] == "ours"]
    colours = method_colours(ours["method"])
    for (dataset, metric), g in ours.groupby(["dataset", "metric"]):
        fig, axes = _figure(plt, figsize=(5.8, 3.2))
        ax = axes[0][0]
        draw_metric_vs_eps(ax, g, metric, (num_classes or {}).get(dataset), colours)
        ax.set_title(dataset)
        paths += _save(fig, out, f"{dataset}-{metric}-vs-eps")
    return paths


def classes_per_dataset(long: pd.DataFrame) -> dict[str, int]:
    """Per dataset, its number of classes as a run recorded it: the distinct labels of the
    run's ``samples.npz`` (the runner samples every class ``samples_per_class`` times). Read
    only from runs with a ``gen2real_*`` / ``real2gen_*`` metric, which exist only for
    conditional generators (an unconditional one's labels say nothing of the classes);
    a dataset none of whose samples can be read is left out (no chance line)."""
    out: dict[str, int] = {}
    acc = long[long["metric"].fillna("").str.startswith(CHANCE_PREFIXES) & long["run_dir"].notna()]
    for dataset, g in acc.groupby("dataset"):
        for run_dir in g["run_dir"].unique():
            try:
                with np.load(Path(run_dir) / "samples.npz") as s:
                    labels = s["labels"]
            except (OSError, KeyError, ValueError, zipfile.BadZipFile):
                continue
            if labels.size:
                out[dataset] = int(len(np.unique(labels)))
                break
    return out


def _figure(plt, ncols: int = 1, figsize=(4.5, 3.2)):
    return plt.subplots(1, ncols, figsize=figsize, squeeze=False, layout="constrained")


def sample_grids(long: pd.DataFrame, out: Path, per_class: int = 8) -> list[Path]:
    """One panel per (dataset, ε) with each method's samples side by side (first seed that
    has them: the records committed under benchmarks/ keep no samples)."""
    plt = _plt()
    from torchvision.utils import make_grid
    import torch

    paths = []
    runs = long.drop_duplicates("run_dir").sort_values(["dataset", "eps_target", "method", "seed"])
    runs = runs[[(Path(d) / "samples.npz").is_file() for d in runs["run_dir"]]]
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
                se = (proto.get("auc_uncertainty") or {}).get("se_delong")  # older runs: none
                auc = f"AUC {r['value']:.2f}" + (f" ± {se:.2f}" if se is not None else "")
                ax.plot(roc["fpr"], roc["tpr"], label=f"{r['method']} ε={eps} ({auc})")
        ax.plot([0, 1], [0, 1], "k:", lw=0.8)
        ax.set_xlabel("false positive rate")
        ax.set_ylabel("true positive rate")
        ax.set_title(f"{dataset}: {metric[len('mia_auc_'):]}", fontsize=9)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=6)
        paths += _save(fig, out, f"{dataset}-{metric}-roc")
    return paths


TRAINING_KEYS = ("d_loss", "g_loss", "n_d", "d_fake_acc_ema", "d_fake_acc")


def _read_training_log(run_dir: str) -> pd.DataFrame | None:
    f = Path(run_dir) / "train.jsonl"
    if not f.is_file():
        return None
    lines = [json.loads(x) for x in f.read_text().splitlines() if x.strip()]
    if not lines:
        return None
    df = pd.DataFrame(lines)
    if "d_step" in df or "step" in df:
        # a run resumed before logs were cut at the checkpoint (context.py) repeats the steps
        # it redid; the later line is the resumed run's
        df = df.drop_duplicates(subset=[c for c in ("phase", "discriminator", "d_step", "step") if c in df],
                                keep="last")
    return df


def _x_column(df: pd.DataFrame) -> str:
    """A training log's x axis: the discriminator's step where logged, else the step, else the time."""
    return next((c for c in ("d_step", "step") if c in df), "time")


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.=+-]+", "_", text).strip("_")


def training_curves(long: pd.DataFrame, out: Path) -> list[Path]:
    """One figure per configuration (dataset, method with its settings, ε, members): a panel
    per logged quantity, one line per seed. Named ``<dataset>-eps<ε>-<method>[-m<members>]-training``
    (a suffix ``-2``, ``-3`` … where two configurations would share a name). A figure per run
    cost ~1 s each (png and pdf): minutes for a report over a sweep's hundreds of runs, and a
    reader compares a configuration's seeds in one panel anyway."""
    plt = _plt()
    paths, used = [], set()
    runs = long.drop_duplicates("run_dir").copy()
    runs["members_key"] = runs["members"].fillna(-1)  # groupby would drop the NaN / None keys
    runs["variant_key"] = runs["variant"].fillna("")
    runs["seed_key"] = runs["seed"].fillna(-1)
    keys = ["dataset", "method", "eps_target", "members_key", "variant_key"]
    for (dataset, method, eps, members, _), g in runs.groupby(keys, sort=True, dropna=False):
        logs = [(r.seed_key, r.run_id, df) for r in g.sort_values("seed_key").itertuples()
                if (df := _read_training_log(r.run_dir)) is not None]
        quantities = [k for k in TRAINING_KEYS if any(k in df and df[k].notna().any() for _, _, df in logs)]
        if not quantities:
            continue
        fig, axes = _figure(plt, len(quantities), figsize=(3 * len(quantities), 2.8))
        xs = {_x_column(df) for _, _, df in logs}
        x_label = next(iter(xs)) if len(xs) == 1 else "step"  # mixed logs: their steps, in their own units
        for ax, k in zip(axes[0], quantities):
            for seed, run_id, df in logs:
                if k in df:
                    ax.plot(df[_x_column(df)], df[k], lw=1, label=f"seed {seed:g}" if seed >= 0 else run_id)
            ax.set_xlabel(x_label)
            ax.set_title(k, fontsize=9)
            if k == "n_d":
                ax.set_yscale("log")
        if len(logs) > 1:
            axes[0][0].legend(fontsize=6)
        eps_text = "∞" if not math.isfinite(eps) else f"{eps:g}"
        member_text = f", {members:g} members" if members >= 0 else ""
        fig.suptitle(f"{method}: {dataset}, ε = {eps_text}{member_text}", fontsize=8)
        name = _slug(f"{dataset}-eps{eps_text.replace('∞', 'inf')}-{method}" + (f"-m{members:g}" if members >= 0 else ""))
        base, i = name, 2
        while name in used:
            name, i = f"{base}-{i}", i + 1
        used.add(name)
        paths += _save(fig, out, f"{name}-training")
    return paths


def all_figures(long: pd.DataFrame, agg: pd.DataFrame, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    ours = long[long["source"] == "ours"]
    return (metric_vs_eps(agg, out, classes_per_dataset(ours)) + sample_grids(ours, out) + roc_curves(ours, out)
            + training_curves(ours, out))
