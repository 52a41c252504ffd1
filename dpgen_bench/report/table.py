"""Records → one long frame (one row per run × metric) → aggregate over seeds → layouts
that mirror the papers → markdown / LaTeX / CSV. Pure functions of the records.

Rows are configurations, not just methods: two runs of one method on one dataset whose
settings differ (preset, δ, samples per class, or any hparam outside the method's
``bookkeeping_hparams``) are different rows, labelled with the settings that differ
(``dpgan [n_d=adaptive]``); mean ± std pools seeds of one configuration only. Of runs
that repeat a (configuration, ε, members, seed), only the newest counts. A run whose
privacy.json carries a caveat (an ε from a paper's own accounting, not a DP guarantee)
has its ε spent marked ‡, with the caveat as a note under the table; so has a published
number whose ε is such an accounting (references.csv's ``accounting``): its ε spent cell,
or in ``tiers`` the paper's number itself.

Layouts (``bench report --layout NAME``; the first four were ``a``, ``b``, ``c``, ``d``, which
still work, and their functions keep those letters):
- ``eps-rows`` (``layout_a``): rows (ε, method), columns (dataset, metric) — Private GANs
  Table 2, DPAF Tables 1–2.
- ``one-setting`` (``layout_b``): rows method, columns metrics, for one (dataset, ε) —
  DP-GAN-DPAC Tables 1–4.
- ``mia`` (``layout_c``): rows (method, ε), columns (attack, members) of MIA AUC — DPAF Table 18.
- ``eps-columns`` (``layout_d``): rows method, columns (dataset, ε, metric) — Private GANs
  Table 2, DPAF Table 1 turned round.
- ``tiers``: rows method, columns one metric per preset tier (quick, long, paper) and the
  method's own paper's number: what a CPU-minute, a CPU-hour and the paper's GPU-days give.
- ``audit``: the accountant's ε beside ``bench audit``'s lower bounds, per seed.
- ``runs``: one row per run (no aggregation).

Bold marks the best of our private values among the rows of one (dataset, ε): never an
ε = 1 cell against an ε = 10 one.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from .. import registry, store
from ..auc import null_sd
from ..identity import report_identity
from ..privacy import fmt_eps

ID_COLS = ["run_id", "method", "dataset", "preset", "seed", "members", "eps_target", "delta", "eps_rdp", "eps_prv",
           "variant", "caveat", "finished", "run_dir"]
MIA_PREFIX = "mia_auc"  # ours: mia_auc_<attack>[_calibrated]; papers: mia_auc (attack unstated)
AUDIT_PREFIX = "eps_lb_"  # bench audit: eps_lb_<attack>, the one-run lower bound (audit.json)
GAUSSIAN_CURVE = " (Gaussian curve)"  # eps_lb_<attack> (Gaussian curve): audit.json's fdp_gaussian ε
MIA_IDEAL = 0.5  # an attack AUC's ideal (no leakage): neither end of the scale is best (evaluators.mia's ``ideal``)
SIDE = (MIA_PREFIX, AUDIT_PREFIX)  # shown by their own layouts (mia, audit), not with the utility metrics
CAVEAT_MARK = "‡"
log = logging.getLogger("dpgen_bench")


def collect(root: Path, *more: Path) -> tuple[pd.DataFrame, int]:
    """Long frame of all complete runs under ``root`` (and the roots in ``more``, their
    configurations labelled together, as one set of runs) and the number skipped: incomplete
    ones, and damaged ones, each named in a warning with what is wrong."""
    rows, skipped = [], 0
    for run_dir in (d for r in (root, *more) for d in store.iter_run_dirs(Path(r))):
        try:
            rec = store.load_record(run_dir)
            if rec is not None:
                if (run_dir / store.AUDIT_FILE).is_file():
                    rec["audit"] = store.read_json(run_dir / store.AUDIT_FILE)
                rows.extend(record_rows(rec, run_dir.name))
                continue
        except store.DamagedRecord as e:
            log.warning("skipped the damaged run %s: %s", run_dir, e)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            log.warning("skipped the damaged run %s: %s: %s", run_dir, type(e).__name__, e)
        skipped += 1
    long = pd.DataFrame(rows, columns=ID_COLS + ["metric", "value", "source"])
    return label_variants(long), skipped


def identity(cfg: dict, priv: dict) -> dict:
    """The settings that define what a run trained and how it was evaluated, seed and ε
    aside: two runs with equal identities are seeds of one configuration (the settings that
    count for the report: ``dpgen_bench.identity``)."""
    return report_identity(cfg, priv)


def record_rows(rec: dict, run_id: str) -> list[dict]:
    cfg, priv, ev = rec["config"], rec["privacy"], rec["eval"]
    base = {
        "run_id": cfg.get("run_id", run_id), "method": cfg["method"], "dataset": cfg["dataset"],
        "preset": cfg.get("preset"), "seed": cfg.get("seed"), "members": cfg.get("members"),
        "eps_target": float(priv["target"]["epsilon"]), "delta": float(priv["target"]["delta"]),
        "eps_rdp": float(priv["epsilon"]["rdp"]), "eps_prv": float(priv["epsilon"]["prv"]), "source": "ours",
        "variant": json.dumps(identity(cfg, priv), sort_keys=False, default=str), "caveat": priv.get("caveat"),
        "finished": rec.get("finished", math.nan), "run_dir": rec.get("run_dir"),
    }
    metrics = dict(ev.get("metrics", {}))
    for attack, bound in (rec.get("audit") or {}).get("attacks", {}).items():
        metrics[AUDIT_PREFIX + attack] = bound["epsilon_lower_bound"]
        if "fdp_gaussian" in bound:
            metrics[AUDIT_PREFIX + attack + GAUSSIAN_CURVE] = bound["fdp_gaussian"]["epsilon"]
    if not metrics:
        return [{**base, "metric": None, "value": math.nan}]
    return [{**base, "metric": m, "value": float(v)} for m, v in metrics.items()]


def _fmt_setting(v) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    return "none" if v is None else str(v).lower() if isinstance(v, bool) else str(v)


def variant_labels(variants: dict[str, dict]) -> dict[str, str]:
    """For the identities of one method's configurations on one dataset: the settings
    that tell each apart ("n_d=adaptive"; "" when there is one configuration). When the
    presets differ, settings a preset fixes are not repeated: "preset=paper" says them.
    A configuration evaluated on the validation split always says so."""
    keys: list[str] = []
    for ident in variants.values():
        keys += [k for k in ident if k not in keys]
    vals = {v: {k: _fmt_setting(ident[k]) if k in ident else "unset" for k in keys} for v, ident in variants.items()}

    def varies(k: str, group) -> bool:
        return len({vals[v][k] for v in group}) > 1

    differ = [k for k in keys if varies(k, variants)]
    if "preset" in differ:
        by_preset: dict[str, list[str]] = {}
        for v in variants:
            by_preset.setdefault(vals[v]["preset"], []).append(v)
        differ = ["preset"] + [k for k in differ if k != "preset" and any(varies(k, g) for g in by_preset.values())]
    if "eval_split" not in differ:  # all on val: still say so (never read as test numbers)
        differ += ["eval_split"] if any(vals[v].get("eval_split") == "val" for v in variants) else []
    return {v: ", ".join(f"{k}={vals[v][k]}" for k in differ) for v in variants}


def label_variants(long: pd.DataFrame) -> pd.DataFrame:
    """``method`` → the method plus the settings that tell its configurations apart on a
    dataset (``dpgan [n_d=adaptive]``); the plain name stays in ``base_method``."""
    long = long.copy()
    long["base_method"] = long["method"]
    if "variant" not in long:
        long["variant"] = ""
    long["variant"] = long["variant"].fillna("")
    ours = long["source"] == "ours"
    names: dict[tuple, str] = {}
    for (method, dataset), g in long[ours].groupby(["method", "dataset"], sort=False):
        variants = {v: json.loads(v) if v else {} for v in g["variant"].unique()}
        for v, lab in variant_labels(variants).items():
            names[(method, dataset, v)] = f"{method} [{lab}]" if lab else method
    long.loc[ours, "method"] = [names[k] for k in zip(long.loc[ours, "base_method"], long.loc[ours, "dataset"],
                                                      long.loc[ours, "variant"])]
    return long


def latest_per_seed(long: pd.DataFrame) -> pd.DataFrame:
    """Of our runs that repeat a (configuration, dataset, ε, members, seed), keep the
    newest: a rerun is not another seed, and counting it would shrink the std."""
    ours = long[long["source"] == "ours"]
    if ours.empty:
        return long
    runs = ours.drop_duplicates("run_id")
    keys = ["method", "dataset", "eps_target", "members", "seed"]
    runs = runs.assign(members=runs["members"].fillna(0)).sort_values(["finished", "run_id"], na_position="first")
    keep = set(runs.drop_duplicates(keys, keep="last")["run_id"])
    dropped = len(runs) - len(keep)
    if dropped:
        log.warning("%d run(s) repeat the configuration, ε and seed of a newer run; only the newest of each "
                    "counts (bench report --layout runs lists them all)", dropped)
    return long[(long["source"] != "ours") | long["run_id"].isin(keep)]


def _declared_metrics(evaluator: str) -> tuple[str, ...]:
    """The metric keys an evaluator records under names other than its own (``metric_names``
    in its registration or on its class; prc: precision, recall, density, coverage)."""
    try:
        return tuple(registry.evaluators.attribute(evaluator, "metric_names") or ())
    except Exception:  # noqa: BLE001 - none declared, or a plugin that fails to import
        return ()


def recording_evaluator(metric: str) -> str | None:
    """The evaluator a metric key belongs to: the evaluator of that name, one that declares the
    key in ``metric_names``, else the name before the last ``_`` (kid_std → kid); None if none."""
    if metric in registry.evaluators:
        return metric
    for name in registry.evaluators.names():
        if metric in _declared_metrics(name):
            return name
    base = metric.rsplit("_", 1)[0]
    return base if base in registry.evaluators else None


def higher_is_better(metric: str) -> bool | None:
    if metric.endswith("_std") and metric not in registry.evaluators:
        return None  # a spread recorded beside a metric (kid_std, gen2real_all_std): neither end is best
    name = recording_evaluator(metric)
    if name is None:
        return None
    try:
        return bool(registry.evaluators.attribute(name, "higher_is_better"))
    except Exception:  # noqa: BLE001 - an evaluator that fails to import has no direction
        return None


# ------------------------------------------------------------------ aggregation


def aggregate(long: pd.DataFrame) -> pd.DataFrame:
    """Mean, sample std and n over seeds per (source, method, dataset, ε, members, metric)."""
    if "base_method" not in long:  # references or rows built by hand: label them here
        long = label_variants(long)
    if "caveat" not in long:
        long = long.assign(caveat=None)
    long = latest_per_seed(long.dropna(subset=["metric"]))
    long = long.copy()
    long["members"] = long["members"].fillna(0).astype(int)
    keys = ["source", "method", "dataset", "eps_target", "members", "metric"]
    if "seed" in long:
        long = long.sort_values("seed", kind="stable")
    g = long.groupby(keys, dropna=False, sort=True)
    agg = g.agg(mean=("value", "mean"), std=("value", "std"), n=("value", "size"), eps_rdp=("eps_rdp", "max"),
                eps_prv=("eps_prv", "max"), caveat=("caveat", _first_caveat),
                values=("value", tuple)).reset_index()  # per seed, in seed order (layout audit)
    if "ref_std" in long:
        ref = g["ref_std"].first().reset_index(drop=True)
        agg["std"] = agg["std"].where(agg["source"] == "ours", ref.values)
    agg.loc[(agg["n"] < 2) & (agg["source"] == "ours"), "std"] = np.nan
    return agg


def _first_caveat(s: pd.Series):
    s = s.dropna()
    s = s[s.astype(bool)]
    return s.iloc[0] if len(s) else None


# ---------------------------------------------------------------------- tables


@dataclass
class Cell:
    mean: float
    std: float = math.nan
    n: int = 1
    source: str = "ours"
    bold: bool = False
    mark: str = ""  # CAVEAT_MARK when the number's ε carries a caveat (``_mark``), else ""

    def text(self) -> str:
        if math.isnan(self.mean):
            return "—"
        decimals = 3 if abs(self.mean) < 1 else 2 if abs(self.mean) < 10 else 1
        s = f"{self.mean:.{decimals}f}"
        if not math.isnan(self.std):
            s += f" ± {self.std:.{decimals}f}"
        if self.source == "ours" and self.n < 3:
            s += f" (n={self.n})"
        return f"{s} {self.mark}" if self.mark else s


CELL_NUMBER = re.compile(r"([0-9.]+)(?: ± ([0-9.]+))?(?: \(n=(\d+)\))?")  # what Cell.text prints, unmarked


def cell_values(text: str, n: int) -> list[float] | None:
    """A rendered cell read back as runs: values whose mean and sample std are the ones
    ``Cell.text`` printed (as many as its ``(n=k)`` says, else ``n``), to the cell's rounding;
    None for a cell that is not a number ("—", a caveat mark)."""
    m = CELL_NUMBER.fullmatch(text)
    if m is None:
        return None
    n = int(m.group(3) or n)
    z = np.arange(n) - (n - 1) / 2
    z = z / z.std(ddof=1) if n > 1 else z  # n values of mean 0 and sample std 1
    return [float(v) for v in float(m.group(1)) + float(m.group(2) or 0) * z]


@dataclass
class Table:
    title: str
    row_header: list[str]
    rows: list[tuple]  # row labels, one tuple per row (len == len(row_header))
    columns: list[str]  # column headers (arrows included)
    cells: list[list[Cell | str]]
    notes: list[str] = field(default_factory=list)


def _metrics_order(metrics) -> list[str]:
    """Metrics in the order of their evaluators' names; an evaluator's own key first, then the
    keys it declares in their declared order (prc: precision, recall, density, coverage)."""
    order = list(registry.evaluators.names())

    def key(m: str):
        owner = recording_evaluator(m)
        if owner not in order:
            return (len(order), 0, m)
        declared = _declared_metrics(owner)
        rank = 0 if m == owner else declared.index(m) + 1 if m in declared else len(declared) + 1
        return (order.index(owner), rank, m)

    return sorted(set(metrics), key=key)


def arrow(metric: str) -> str:
    if metric.startswith(MIA_PREFIX):
        return f" ({MIA_IDEAL:g} ideal)"
    hib = higher_is_better(metric)
    return "" if hib is None else (" ↑" if hib else " ↓")


def _bold_best(cells: list[list[Cell | str]], col: int, metric: str) -> None:
    hib = higher_is_better(metric)
    if hib is None or metric.startswith(MIA_PREFIX):  # AUC: the ideal is MIA_IDEAL, not an extreme
        return
    ours = [r[col] for r in cells if isinstance(r[col], Cell) and r[col].source == "ours" and not math.isnan(r[col].mean)]
    if len(ours) < 2:
        return
    best = (max if hib else min)(c.mean for c in ours)
    for c in ours:
        c.bold = c.mean == best


def _row_label(source: str, method: str) -> str:
    return method if source == "ours" else f"{method} (paper)"


def _mark(sel: pd.DataFrame, notes: list[str]) -> str:
    """"‡" when one of the selected runs' ε carries a caveat (added to ``notes``), else ""."""
    cav = _first_caveat(sel["caveat"]) if "caveat" in sel else None
    if not cav:
        return ""
    if f"{CAVEAT_MARK} {cav}" not in notes:
        notes.append(f"{CAVEAT_MARK} {cav}")
    return f" {CAVEAT_MARK}"


def _spent(source: str, sel: pd.DataFrame, notes: list[str]) -> str:
    if source != "ours":  # a published ε is the paper's; marked where it is not a DP guarantee
        return "—" + _mark(sel, notes)
    return f"{fmt_eps(sel['eps_rdp'].max())} / {fmt_eps(sel['eps_prv'].max())}" + _mark(sel, notes)


def layout_a(agg: pd.DataFrame, metrics: list[str] | None = None) -> Table:
    """Rows (ε, method), columns (dataset, metric)."""
    agg = agg[~agg["metric"].str.startswith(SIDE)] if metrics is None else agg[agg["metric"].isin(metrics)]
    agg = agg[agg["members"] == 0]
    datasets = sorted(agg["dataset"].unique())
    metrics = _metrics_order(agg["metric"].unique())
    cols = [(d, m) for d in datasets for m in metrics if ((agg["dataset"] == d) & (agg["metric"] == m)).any()]
    rows = (agg[["eps_target", "source", "method"]].drop_duplicates()
            .sort_values(["eps_target", "source", "method"], ascending=[False, False, True]))
    out_rows, cells, notes = [], [], []
    for _, r in rows.iterrows():
        sel = agg[(agg["eps_target"] == r["eps_target"]) & (agg["source"] == r["source"]) &
                  (agg["method"] == r["method"])]
        line: list[Cell | str] = [_spent(r["source"], sel, notes)]
        for d, m in cols:
            hit = sel[(sel["dataset"] == d) & (sel["metric"] == m)]
            line.append(Cell(hit["mean"].iloc[0], hit["std"].iloc[0], int(hit["n"].iloc[0]), r["source"])
                        if len(hit) else "—")
        out_rows.append((fmt_eps(r["eps_target"]), _row_label(r["source"], r["method"])))
        cells.append(line)
    for k, (_, m) in enumerate(cols, start=1):
        for eps in {row[0] for row in out_rows}:  # best per column within one ε block
            block = [cells[i] for i, row in enumerate(out_rows) if row[0] == eps]
            _bold_best(block, k, m)
    return Table("metric by dataset and ε", ["ε", "method"], out_rows,
                 ["ε spent (RDP / PRV)"] + [f"{d} {m}{arrow(m)}" for d, m in cols], cells, notes)


def layout_b(agg: pd.DataFrame, dataset: str, eps: float | None) -> Table:
    """Rows method, columns metrics, for one (dataset, ε)."""
    sel = agg[(agg["dataset"] == dataset) & (agg["members"] == 0)]
    if eps is not None:
        sel = sel[(sel["eps_target"] == eps) | ~np.isfinite(sel["eps_target"])]
    metrics = _metrics_order(m for m in sel["metric"].unique() if not m.startswith(SIDE))
    rows = sel[["source", "method", "eps_target"]].drop_duplicates().sort_values(
        ["source", "eps_target", "method"], ascending=[False, False, True])
    out_rows, cells, notes = [], [], []
    for _, r in rows.iterrows():
        s = sel[(sel["source"] == r["source"]) & (sel["method"] == r["method"]) & (sel["eps_target"] == r["eps_target"])]
        line: list[Cell | str] = [fmt_eps(r["eps_target"]), _spent(r["source"], s, notes)]
        for m in metrics:
            hit = s[s["metric"] == m]
            line.append(Cell(hit["mean"].iloc[0], hit["std"].iloc[0], int(hit["n"].iloc[0]), r["source"])
                        if len(hit) else "—")
        out_rows.append((_row_label(r["source"], r["method"]),))
        cells.append(line)
    for eps_text in {line[0] for line in cells if line[0] != "∞"}:  # best among private rows of one ε
        block = [line for line in cells if line[0] == eps_text]
        for k, m in enumerate(metrics, start=2):
            _bold_best(block, k, m)
    title = f"{dataset}" + (f", ε = {fmt_eps(eps)}" if eps is not None else "")
    return Table(title, ["method"], out_rows, ["ε", "ε spent (RDP / PRV)"] + [m + arrow(m) for m in metrics], cells,
                 notes)


TIER_ORDER = ("quick", "long", "paper")  # the tiers' columns first, in this order; other presets after them


def layout_tiers(long: pd.DataFrame, dataset: str, eps: float | None, metric: str = "gen2real_cnn") -> Table:
    """Rows method; columns one metric per preset tier (``quick``: a CPU-minute, ``long``: a
    CPU-hour, ``paper``: the paper's settings), mean ± std over seeds, then the method's own
    paper's number and where it is printed. Only a tier's plain configuration counts: settings
    equal to the preset as the code resolves it now (no ``--set`` override, no validation
    split, no ``--noise-off``, no record of a preset since changed), so the row reads "what
    this preset gives". The paper's number is the row a paper reports for its own method
    (references.csv's ``reported_in`` "This work"), else one citing the original source, else
    the first, at this dataset, ε and metric. "ε spent" is that of the row's first tier with a
    run."""
    long = long if "base_method" in long else label_variants(long)
    finite = eps is not None and math.isfinite(eps)
    at_eps = (long["eps_target"] == eps) | ~np.isfinite(long["eps_target"]) if finite else long["eps_target"].notna()
    sel = long[(long["dataset"] == dataset) & (long["members"].fillna(0) == 0) & at_eps & (long["metric"] == metric)]
    ours = latest_per_seed(sel[sel["source"] == "ours"])
    plain = ours[[v == _preset_variant(b, dataset, p, e) for v, b, p, e in zip(
        ours["variant"], ours["base_method"], ours["preset"], ours["eps_target"])]]
    presets = [p for p in TIER_ORDER if (plain["preset"] == p).any()]
    if "quick" in presets and "long" not in presets:  # a quick run's next tier, shown before it has records too
        presets.insert(presets.index("quick") + 1, "long")
    presets += sorted(set(plain["preset"].dropna()) - set(presets))
    refs = sel[sel["source"] == "paper"]
    # a method whose records all predate its preset's current form keeps its row ("—"): its paper's number stays
    shown = ours[ours["preset"].isin(TIER_ORDER)]
    methods = sorted(set(plain["base_method"]) | set(shown["base_method"]), key=lambda m: (not math.isfinite(
        ours[ours["base_method"] == m]["eps_target"].iloc[0]), m))
    cells, rows, notes = [], [], []
    for m in methods:
        line: list[Cell | str] = []
        mine = plain[plain["base_method"] == m]
        first = next((p for p in presets if (mine["preset"] == p).any()), None)  # the row's first tier with a run
        line.append(_spent("ours", mine[mine["preset"] == first], notes) if first else "—")
        for p in presets:
            v = mine[mine["preset"] == p].drop_duplicates("run_id")["value"]
            line.append(Cell(float(v.mean()), float(v.std()) if len(v) > 1 else math.nan, len(v)) if len(v) else "—")
        ref = refs[refs["method"] == m]
        if "reported_in" in ref:  # the paper's own row, else one citing the original, else any
            said = ref["reported_in"].fillna("")
            ref = ref[said == "This work"] if (said == "This work").any() else ref[said != ""] if (said != "").any() \
                else ref
        if len(ref):
            line += [Cell(float(ref["value"].iloc[0]), math.nan, 1, "paper", mark=_mark(ref.iloc[:1], notes).strip()),
                     str(ref["run_id"].iloc[0])]
        else:
            line += ["—", "—"]
        rows.append((m,))
        cells.append(line)
    title = f"{dataset}, {metric}" + (f", ε = {fmt_eps(eps)}" if eps is not None else "")
    return Table(title, ["method"], rows, ["ε spent"] + presets + ["paper", "paper's table"], cells, notes)


@functools.lru_cache(maxsize=None)
def _preset_variant(method: str, dataset: str, preset: str | None, eps: float) -> str | None:
    """The identity (``variant``) of a plain run of ``preset`` as the code resolves it now,
    at its own δ, on the test split, with noise; None where it cannot be resolved here."""
    from ..config import build_config

    try:
        cfg = build_config(method, dataset, epsilon=eps if math.isfinite(eps) else None, preset=preset)
    except Exception:  # noqa: BLE001 - a method or preset this installation lacks: no plain run
        return None
    priv = {"private": math.isfinite(eps), "target": {"delta": cfg.delta}, "noise_off": False}
    return json.dumps(identity(cfg.to_json(), priv), sort_keys=False, default=str)


def layout_d(agg: pd.DataFrame, metrics: list[str] | None = None) -> Table:
    """Rows method, columns (dataset, ε) with the ε spent and each metric: Private GANs
    Table 2, DPAF Table 1 turned round. Each column is one (dataset, ε, metric): best in bold."""
    agg = agg[~agg["metric"].str.startswith(SIDE)] if metrics is None else agg[agg["metric"].isin(metrics)]
    agg = agg[agg["members"] == 0]
    order = _metrics_order(agg["metric"].unique())
    groups = sorted({(d, e) for d, e in zip(agg["dataset"], agg["eps_target"])})
    rows = agg[["source", "method"]].drop_duplicates().sort_values(["source", "method"], ascending=[False, True])
    columns: list[str] = []
    layout: list[tuple[str, float, str | None]] = []  # (dataset, ε, metric); None: the ε spent
    for d, e in groups:
        here = agg[(agg["dataset"] == d) & (agg["eps_target"] == e)]
        layout.append((d, e, None))
        columns.append(f"{d} ε={fmt_eps(e)} spent")
        for m in order:
            if (here["metric"] == m).any():
                layout.append((d, e, m))
                columns.append(f"{d} ε={fmt_eps(e)} {m}{arrow(m)}")
    out_rows, cells, notes = [], [], []
    for _, r in rows.iterrows():
        sel = agg[(agg["source"] == r["source"]) & (agg["method"] == r["method"])]
        line: list[Cell | str] = []
        for d, e, m in layout:
            here = sel[(sel["dataset"] == d) & (sel["eps_target"] == e)]
            if m is None:
                line.append(_spent(r["source"], here, notes) if len(here) else "—")
                continue
            hit = here[here["metric"] == m]
            line.append(Cell(hit["mean"].iloc[0], hit["std"].iloc[0], int(hit["n"].iloc[0]), r["source"])
                        if len(hit) else "—")
        out_rows.append((_row_label(r["source"], r["method"]),))
        cells.append(line)
    for k, (_, e, m) in enumerate(layout):
        if m is not None and math.isfinite(e):
            _bold_best(cells, k, m)
    return Table("metric by method, dataset and ε", ["method"], out_rows, columns, cells, notes)


def layout_c(agg: pd.DataFrame, dataset: str | None = None) -> Table:
    """MIA AUC: rows (method, ε), columns (attack, members)."""
    sel = agg[agg["metric"].str.startswith(MIA_PREFIX)]
    if dataset:
        sel = sel[sel["dataset"] == dataset]
    cols = sorted({(m, k) for m, k in zip(sel["metric"], sel["members"])},
                  key=lambda mk: (_metrics_order(sel["metric"].unique()).index(mk[0]), mk[1]))
    rows = sel[["source", "method", "eps_target"]].drop_duplicates().sort_values(
        ["source", "method", "eps_target"], ascending=[False, True, False])
    out_rows, cells, notes = [], [], []
    for _, r in rows.iterrows():
        s = sel[(sel["source"] == r["source"]) & (sel["method"] == r["method"]) & (sel["eps_target"] == r["eps_target"])]
        line: list[Cell | str] = []
        for m, k in cols:
            hit = s[(s["metric"] == m) & (s["members"] == k)]
            line.append(Cell(hit["mean"].iloc[0], hit["std"].iloc[0], int(hit["n"].iloc[0]), r["source"])
                        if len(hit) else "—")
        out_rows.append((_row_label(r["source"], r["method"]), fmt_eps(r["eps_target"]) + _mark(s, notes)))
        cells.append(line)
    headers = [f"{m[len(MIA_PREFIX):].lstrip('_') or 'attack unstated'}, {k if k else 'all'} members{arrow(m)}"
               for m, k in cols]
    sizes = sorted({int(k) for _, k in cols if k and not pd.isna(k)})
    if sizes:  # GAN-Leaks' protocol: as many non-members (test images) as members
        spread = " and ".join(f"±{null_sd(k, k):.3f} at {k} members" for k in sizes)
        notes.append(f"One run's AUC spreads by {spread} when nothing leaks (one s.d., members against as "
                     "many non-members); each run's eval.json has its DeLong standard error, 95 % interval and "
                     "Mann–Whitney p-value (protocol.<evaluator>.auc_uncertainty).")
    return Table("membership-inference ROC AUC (0.5 = no leakage)", ["method", "ε"], out_rows, headers, cells, notes)


def audit_cell(values) -> str:
    """Each seed's lower bound (in seed order) and the best of them; never their mean: a mean
    of 95 % lower bounds is no 95 % bound (the best of k holds at 1 − k·5 %, union bound)."""
    vals = [float(v) for v in values if not math.isnan(float(v))]
    if not vals:
        return "—"
    fmt = lambda v: f"{v:.3g}"  # noqa: E731
    return fmt(vals[0]) if len(vals) == 1 else f"best {fmt(max(vals))} (seeds: {', '.join(map(fmt, vals))})"


def layout_audit(agg: pd.DataFrame, dataset: str | None = None) -> Table:
    """bench audit: rows (method, ε), the accountant's ε and the one-run lower bound per
    attack: each seed's bound and the best one (``audit_cell``), never a mean over seeds."""
    sel = agg[agg["metric"].str.startswith(AUDIT_PREFIX) & (agg["source"] == "ours")]
    if dataset:
        sel = sel[sel["dataset"] == dataset]
    attacks = sorted(sel["metric"].unique())
    rows = sel[["method", "dataset", "eps_target"]].drop_duplicates().sort_values(
        ["dataset", "method", "eps_target"], ascending=[True, True, False])
    out_rows, cells, notes = [], [], []
    for _, r in rows.iterrows():
        s = sel[(sel["method"] == r["method"]) & (sel["dataset"] == r["dataset"]) & (sel["eps_target"] == r["eps_target"])]
        line: list[Cell | str] = [_spent("ours", s, notes)]
        for m in attacks:
            hit = s[s["metric"] == m]
            line.append(audit_cell(hit["values"].iloc[0]) if len(hit) else "—")
        out_rows.append((r["method"], r["dataset"], fmt_eps(r["eps_target"])))
        cells.append(line)
    if any(m.endswith(GAUSSIAN_CURVE) for m in attacks):
        notes.append(f"'{GAUSSIAN_CURVE.strip()}': the largest μ whose μ-GDP claim the guesses reject (Mahloujifar, "
                     "Melis, Chaudhuri's one-run f-DP audit), as ε at the run's δ: a lower bound for mechanisms whose "
                     "trade-off curve is Gaussian (DP-SGD's nearly is), not a certificate for any mechanism; a "
                     "violation is raised only by the ε-bound or by rejecting the accountant's own curve.")
    if any(len(v) > 1 for v in sel["values"]):
        notes.append("Each seed's bound holds for its run at the audit's confidence (95 % for all attacks "
                     "together); the best of k seeds holds at 1 − k·5 % (union bound). A mean of lower bounds is "
                     "not a bound, so none is shown.")
    return Table("empirical ε lower bound (one-run audit, 95 %) beside the accountant's", ["method", "dataset", "ε"],
                 out_rows, ["ε accountant (RDP / PRV)"] + [f"lower bound: {m[len(AUDIT_PREFIX):]}" for m in attacks],
                 cells, notes)


def runs_table(long: pd.DataFrame) -> Table:
    """One row per run."""
    long = long[long["source"] == "ours"] if "source" in long else long
    metrics = _metrics_order(long["metric"].dropna().unique())
    out_rows, cells, notes = [], [], []
    for run_id, g in long.sort_values(["dataset", "method", "eps_target", "seed"], kind="stable").groupby(
            "run_id", sort=False):
        r = g.iloc[0]
        out_rows.append((r["method"], r["dataset"], str(r["preset"]), str(r["seed"])))
        vals = dict(zip(g["metric"], g["value"]))
        rdp = fmt_eps(r["eps_rdp"]) + _mark(g.iloc[:1], notes)
        cells.append([fmt_eps(r["eps_target"]), rdp, fmt_eps(r["eps_prv"]), f"{r['delta']:g}"] +
                     [Cell(vals[m], source="ours", n=3) if m in vals else "—" for m in metrics])
    return Table("runs", ["method", "dataset", "preset", "seed"], out_rows,
                 ["ε target", "ε RDP", "ε PRV", "δ"] + [m + arrow(m) for m in metrics], cells, notes)


# ------------------------------------------------------------------- renderers


def _cell_text(c: Cell | str, bold: tuple[str, str]) -> str:
    if isinstance(c, str):
        return c
    t = c.text()
    return f"{bold[0]}{t}{bold[1]}" if c.bold else t


def render_markdown(t: Table) -> str:
    header = t.row_header + t.columns
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for row, line in zip(t.rows, t.cells):
        lines.append("| " + " | ".join(list(row) + [_cell_text(c, ("**", "**")) for c in line]) + " |")
    if t.notes:
        lines += [""] + t.notes
    return "\n".join(lines) + "\n"


def _tex(s: str) -> str:
    rep = {"ε": r"$\varepsilon$", "↑": r"$\uparrow$", "↓": r"$\downarrow$", "±": r"$\pm$", "∞": r"$\infty$",
           "_": r"\_", "%": r"\%", "&": r"\&", "#": r"\#", "‡": r"\ddag{}", "μ": r"$\mu$"}
    return "".join(rep.get(ch, ch) for ch in s)


def render_latex(t: Table) -> str:
    ncols = len(t.row_header) + len(t.columns)
    lines = [r"\begin{tabular}{" + "l" * len(t.row_header) + "c" * len(t.columns) + "}", r"\toprule",
             " & ".join(_tex(h) for h in t.row_header + t.columns) + r" \\", r"\midrule"]
    for row, line in zip(t.rows, t.cells):
        lines.append(" & ".join([_tex(str(x)) for x in row] + [_tex(_cell_text(c, ("", ""))) if not (
            isinstance(c, Cell) and c.bold) else r"\textbf{" + _tex(c.text()) + "}" for c in line]) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    if t.notes:
        lines += [r"\par\smallskip{\footnotesize " + r" \\ ".join(_tex(n) for n in t.notes) + "}"]
    assert ncols
    return "\n".join(lines) + "\n"


def render_csv(t: Table) -> str:
    rows = []
    for row, line in zip(t.rows, t.cells):
        rec = dict(zip(t.row_header, row))
        for h, c in zip(t.columns, line):
            if isinstance(c, Cell):
                rec[h] = round(c.mean, 6)
                rec[h + " std"] = round(c.std, 6)
                rec[h + " n"] = c.n
                if c.mark:  # explained by the notes, which the CLI prints on stderr for CSV
                    rec[h + " mark"] = c.mark
            else:
                rec[h] = c
        rows.append(rec)
    return pd.DataFrame(rows).to_csv(index=False)


RENDERERS = {"markdown": render_markdown, "latex": render_latex, "csv": render_csv}
