"""Check the seed papers' claims at digits scale and write ``benchmarks/CLAIMS.md``.

    python benchmarks/claims.py [--run] [--jobs N] [--only ID,...] [--results DIR] [--out FILE]

Reads ``benchmarks/claims.yaml`` (its header says what an arm and an expectation are).
``--run`` first runs every cell that has no complete record (``bench sweep``'s machinery:
deterministic run directories, complete cells skipped, crashed ones run again); without it
the file is written from the records already there, and an arm without its seeds says so.
Every number in CLAIMS.md is recomputed from the run records each time.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import yaml
from scipy import stats

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dpgen_bench import store  # noqa: E402
from dpgen_bench.errors import UserError  # noqa: E402
from dpgen_bench.logs import setup_logging  # noqa: E402
from dpgen_bench.report.references import load_references  # noqa: E402
from dpgen_bench.report.table import higher_is_better  # noqa: E402
from dpgen_bench.sweep import Cell, expand, run_sweep  # noqa: E402

ARM_ONLY = ("ref",)  # arm keys that are not grid keys
REPRODUCED, NOT_REPRODUCED, UNTESTABLE, INCONCLUSIVE, MISSING = (
    "reproduced", "not reproduced", "not testable at this scale", "inconclusive", "not run yet")


@dataclass
class Arm:
    name: str
    cells: list[Cell]
    ref: str | None = None
    values: dict[str, list[float]] = field(default_factory=dict)  # metric → one value per complete seed
    eps: list[tuple[float, float]] = field(default_factory=list)  # (RDP, PRV) per complete seed
    caveat: str | None = None
    machines: list[str] = field(default_factory=list)  # where each complete seed ran (env.json)

    def mean(self, metric: str) -> float:
        v = self.values.get(metric, [])
        return float(np.mean(v)) if v else math.nan

    def cell_text(self, metric: str) -> str:
        v = self.values.get(metric, [])
        if not v:
            return "—"
        n = f" (n={len(v)})" if len(v) < len(self.cells) else ""
        sd = f" ± {np.std(v, ddof=1):.3f}" if len(v) > 1 else ""
        return f"{np.mean(v):.3f}{sd}{n}"


def load_claims(path: Path) -> dict:
    spec = yaml.safe_load(path.read_text())
    ids = [c["id"] for c in spec["claims"]]
    if len(set(ids)) != len(ids):
        raise UserError(f"{path}: duplicate claim ids")
    return spec


def build_arms(spec: dict, claim: dict) -> dict[str, Arm]:
    arms = {}
    for name, arm in claim["arms"].items():
        grid = {**spec.get("defaults", {}), **{k: v for k, v in arm.items() if k not in ARM_ONLY}}
        arms[name] = Arm(name, expand(grid), ref=arm.get("ref"))
    return arms


def read_arm(arm: Arm, root: Path) -> None:
    for cell in arm.cells:
        rec = store.load_record(root / cell.run_name)
        if rec is None:
            continue
        for metric, value in rec["eval"].get("metrics", {}).items():
            arm.values.setdefault(metric, []).append(float(value))
        eps = rec["privacy"]["epsilon"]
        arm.eps.append((float(eps["rdp"]), float(eps["prv"])))
        arm.caveat = arm.caveat or rec["privacy"].get("caveat")
        try:
            env = store.read_json(root / cell.run_name / "env.json")
            arm.machines.append(f"{env.get('cpu_count')} CPUs, torch {env.get('packages', {}).get('torch')}, "
                                f"{env.get('device', {}).get('name', '?')}")
        except (OSError, ValueError):
            arm.machines.append("unknown machine")


def welch_greater(a: list[float], b: list[float]) -> float:
    """One-sided p-value of mean(a) > mean(b) (Welch); nan with fewer than 2 values each."""
    if len(a) < 2 or len(b) < 2:
        return math.nan
    if np.std(a) == 0 and np.std(b) == 0:
        return 0.0 if np.mean(a) > np.mean(b) else 1.0
    return float(stats.ttest_ind(a, b, equal_var=False, alternative="greater").pvalue)


def _at_chance(spec: dict, metric: str, arms: list[Arm]) -> bool:
    chance = spec.get("chance", {}).get(metric)
    return chance is not None and all(a.mean(metric) < chance + spec.get("chance_margin", 0.05) for a in arms)


def _oriented(metric: str, values: list[float]) -> list[float]:
    return values if higher_is_better(metric) is not False else [-v for v in values]


def check_better(spec, metric, good: Arm, bad: Arm) -> tuple[str, str]:
    a, b = good.values.get(metric, []), bad.values.get(metric, [])
    if len(a) < 2 or len(b) < 2:
        return MISSING, f"{good.name} vs {bad.name}: fewer than 2 seeds"
    alpha = spec.get("alpha", 0.05)
    text = (f"{good.name} {np.mean(a):.3f} vs {bad.name} {np.mean(b):.3f} ({metric}, difference "
            f"{np.mean(a) - np.mean(b):+.3f}")
    if _at_chance(spec, metric, [good, bad]):
        return UNTESTABLE, text + "): both at chance"
    p_yes = welch_greater(_oriented(metric, a), _oriented(metric, b))
    p_no = welch_greater(_oriented(metric, b), _oriented(metric, a))
    if p_yes < alpha:
        return REPRODUCED, text + f", one-sided Welch p = {p_yes:.3g})"
    if p_no < alpha:
        return NOT_REPRODUCED, text + f": the reverse holds, p = {p_no:.3g})"
    return INCONCLUSIVE, text + f", p = {p_yes:.3g}: no significant difference)"


def check(spec: dict, exp: dict, arms: dict[str, Arm]) -> list[tuple[str, str]]:
    kind, metric = exp["kind"], exp["metric"]
    if kind == "better":
        return [check_better(spec, metric, arms[exp["better"]], arms[exp["than"]])]
    if kind == "at_least_best":
        arm, others = arms[exp["arm"]], [arms[n] for n in exp["of"]]
        if len(arm.values.get(metric, [])) < 2 or any(len(o.values.get(metric, [])) < 2 for o in others):
            return [(MISSING, f"{arm.name} vs {', '.join(o.name for o in others)}: fewer than 2 seeds")]
        best = max(others, key=lambda o: np.mean(_oriented(metric, o.values[metric])))
        verdict, text = check_better(spec, metric, best, arm)
        if verdict == UNTESTABLE:
            return [(verdict, text)]
        ok = verdict != REPRODUCED  # the best fixed setting is not significantly better
        return [(REPRODUCED if ok else NOT_REPRODUCED,
                 f"best fixed: {text}; {arm.name} is {'not ' if ok else ''}significantly worse")]
    if kind == "range":
        arm = arms[exp["arm"]]
        v = arm.values.get(metric, [])
        if not v:
            return [(MISSING, f"{arm.name}: no complete run")]
        lo, hi = exp.get("min", -math.inf), exp.get("max", math.inf)
        m = float(np.mean(v))
        bounds = " and ".join(s for s in (f"≥ {lo:g}" if math.isfinite(lo) else "",
                                          f"≤ {hi:g}" if math.isfinite(hi) else "") if s)
        seeds = f"{len(v)} seed{'s' if len(v) > 1 else ''}"
        return [(REPRODUCED if lo <= m <= hi else NOT_REPRODUCED,
                 f"{arm.name}: {metric} {m:.3f} over {seeds} (expected {bounds})")]
    if kind == "paper_order":
        ref = exp["reference"]
        refs = load_references()
        refs = refs[refs["run_id"].str.startswith(f"{ref['paper']}:{ref['table']}") & (refs["dataset"] == ref["dataset"])
                    & (refs["eps_target"] == float(ref["eps"])) & (refs["metric"] == ref["metric"])]
        paper = {a.name: refs.loc[refs["method"] == a.ref, "value"] for a in arms.values() if a.ref}
        paper = {k: float(v.iloc[0]) for k, v in paper.items() if len(v)}
        order = sorted(paper, key=lambda k: paper[k], reverse=higher_is_better(ref["metric"]) is not False)
        out = [(None, f"{ref['paper']} {ref['table']} ({ref['dataset']}, ε = {ref['eps']}): " +
                " > ".join(f"{k} {paper[k]:.3f}" for k in order))]
        for i, hi_name in enumerate(order):
            for lo_name in order[i + 1:]:
                out.append(check_better(spec, metric, arms[hi_name], arms[lo_name]))
        return out
    raise UserError(f"unknown expectation kind {kind!r}")


def claim_verdict(results: list[tuple[str | None, str]]) -> str:
    verdicts = [v for v, _ in results if v is not None]
    missing = verdicts.count(MISSING)
    verdicts = [v for v in verdicts if v != MISSING]
    if not verdicts:
        return MISSING
    if missing:
        return f"{claim_verdict([(v, '') for v in verdicts])} ({missing} check{'s' if missing > 1 else ''} not run yet)"
    if all(v == UNTESTABLE for v in verdicts):
        return UNTESTABLE
    tested = [v for v in verdicts if v != UNTESTABLE]
    if all(v == REPRODUCED for v in tested):
        return REPRODUCED + (" where testable" if len(tested) < len(verdicts) else "")
    if all(v == NOT_REPRODUCED for v in tested):
        return NOT_REPRODUCED
    return "partly reproduced" if REPRODUCED in tested else (
        NOT_REPRODUCED if NOT_REPRODUCED in tested else INCONCLUSIVE)


def render(spec: dict, claims: list[dict], arms_by_claim: dict[str, dict[str, Arm]], root: Path,
           seconds: float | None) -> str:
    lines = ["# The papers' claims at digits scale", "",
             "Generated by `python benchmarks/claims.py` (or `make claims`, which first runs what is missing) from "
             f"`benchmarks/claims.yaml` and the run records under `{spec.get('results', 'results/claims')}`; do not "
             "edit by hand. Numbers are mean ± std over seeds on the real test split of digits (n shown when fewer "
             "seeds are complete); a comparison is a one-sided Welch t-test at "
             f"α = {spec.get('alpha', 0.05)}; an accuracy comparison whose arms are all within "
             f"{spec.get('chance_margin', 0.05)} of chance is *not testable at this scale*.", ""]
    machines: dict[str, int] = {}
    for arms in arms_by_claim.values():
        for a in arms.values():
            for cell, m in zip(a.cells, a.machines):
                machines[m] = machines.get(m, 0) + 1
    if machines:
        lines += ["Where the runs ran (each run's `env.json`; a run shared by several claims counted once per arm): " +
                  "; ".join(f"{n} on {m}" for m, n in sorted(machines.items())) + ".", ""]
    summary = ["| claim | source | verdict |", "|---|---|---|"]
    body = []
    for claim in claims:
        arms = arms_by_claim[claim["id"]]
        results = [r for exp in claim["expect"] for r in check(spec, exp, arms)]
        verdict = claim_verdict(results)
        summary.append(f"| [{claim['title']}](#{claim['id']}) | {claim['source']} | **{verdict}** |")
        metrics = list(dict.fromkeys([e["metric"] for e in claim["expect"]] +
                                     [m for a in arms.values() for m in a.values]))
        body += [f'<a id="{claim["id"]}"></a>', f"## {claim['title']}", "",
                 f"- **Source:** {claim['source']}", f"- **The paper:** {claim['paper']}",
                 f"- **Checked at:** {claim['scale']}", f"- **Verdict: {verdict}**", "",
                 "| arm | seeds | ε spent (RDP / PRV) | " + " | ".join(metrics) + " |",
                 "|---|---|---|" + "---|" * len(metrics)]
        for a in arms.values():
            eps = "—"
            if a.eps:
                rdp, prv = max(e[0] for e in a.eps), max(e[1] for e in a.eps)
                eps = "∞" if math.isinf(rdp) else f"{rdp:.3g} / {prv:.3g}" if math.isfinite(prv) else f"{rdp:.3g} / n/a"
                eps += " ‡" if a.caveat else ""
            body.append(f"| {a.name} | {len(a.eps)}/{len(a.cells)} | {eps} | " +
                        " | ".join(a.cell_text(m) for m in metrics) + " |")
        caveats = sorted({a.caveat for a in arms.values() if a.caveat})
        body += [""] + [f"‡ {c}" for c in caveats] + ([""] if caveats else [])
        body += [f"- {v + ': ' if v else ''}{t}" for v, t in results] + [""]
    tail = [f"_Last regenerated {time.strftime('%Y-%m-%d')}" +
            (f"; the runs it started took {seconds / 60:.0f} min of wall time" if seconds else "") + "._", ""]
    return "\n".join(lines + summary + [""] + body + tail)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--claims", default=str(ROOT / "benchmarks" / "claims.yaml"))
    ap.add_argument("--results", default=None, help="Root of the claims' run directories [default: the file's].")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "CLAIMS.md"))
    ap.add_argument("--run", action="store_true", help="Run the cells without a complete record first.")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--only", default=None, help="Comma-separated claim ids.")
    args = ap.parse_args(argv)
    setup_logging(False)
    try:
        spec = load_claims(Path(args.claims))
        root = Path(args.results or ROOT / spec.get("results", "results/claims"))
        claims = spec["claims"]
        if args.only:
            wanted = set(args.only.split(","))
            unknown = wanted - {c["id"] for c in claims}
            if unknown:
                raise UserError(f"unknown claim ids {sorted(unknown)}")
            claims = [c for c in claims if c["id"] in wanted]
        arms_by_claim = {c["id"]: build_arms(spec, c) for c in claims}
        seconds = None
        if args.run:
            cells = {cell.run_name: cell for arms in arms_by_claim.values() for a in arms.values() for cell in a.cells}
            t = time.time()
            counts = run_sweep(list(cells.values()), root, jobs=args.jobs)
            seconds = time.time() - t
            print(f"claims: {counts['ran']} runs, {counts['done']} already complete, {counts['failed']} failed",
                  file=sys.stderr)
        for arms in arms_by_claim.values():
            for a in arms.values():
                read_arm(a, root)
        text = render(spec, claims, arms_by_claim, root, seconds)
        with store.atomic_open(args.out, "w") as f:
            f.write(text)
        print(f"wrote {args.out}", file=sys.stderr)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
