"""``bench claims``: check papers' claims, kept as data in a claims file (``benchmarks/claims.yaml``),
against run records, and write the verdicts (``benchmarks/CLAIMS.md``).

    bench claims [CLAIMS_FILE] [--run] [--jobs N] [--dataset D,...] [--only ID,...] [--require-commit REV]
                 [--results DIR] [--also DIR ...] [--out FILE] [--figures DIR]

Reads the claims file (``benchmarks/claims.yaml``'s header says what an arm and an expectation
are). Every arm is expanded once per dataset of the file's ``datasets`` (a claim's own
``datasets`` narrows that); ``--dataset`` limits what is run and rendered to some of them.
``--run`` first runs every cell that has no complete record (``bench sweep``'s machinery:
deterministic run directories, complete cells skipped, crashed ones run again); without it the
file is written from the records already there, and an arm without its seeds says so. Every
number in a block rendered this time is recomputed from the run records. The file's roots
(``results``: where its runs go; ``also_results``: committed records that count as runs of their
cells) are paths relative to the working directory, as every path ``bench`` takes;
``--results`` replaces the first, ``--also`` adds to the second.

A record is reused for as long as its cell's config is unchanged, whatever code changed
since (the digits sections once still held runs from before the evaluator CNN was seeded,
f194080). Each section therefore names the commits its records were made at
(``env.json``), and ``--require-commit REV`` treats a record made by code without REV as
missing: ``--run`` runs it again (the old directory kept as ``.stale-…``), a render without
``--run`` leaves it out and says how many.

CLAIMS.md holds one block per dataset, between ``<!-- claims:dataset=D -->`` and
``<!-- /claims:dataset=D -->``: that dataset's sections (arms, numbers, checks, verdict),
where its runs ran, and when the block was last regenerated. Outside the blocks are the
header and one summary table with a verdict column per dataset. The block of a dataset not
rendered this time is copied from the current file verbatim: run records are not in git, so
the machine rendering mnist-5k may have none of digits', and its numbers must survive. The
summary is regenerated each time from the blocks themselves, fresh and kept alike, by
reading each section's ``**Verdict: …**`` line, rather than from the checks in memory: one
code path for both kinds of block, so the table cannot disagree with the sections below it,
and a kept block needs no records. (A summary inside each block with only an index outside
would need no parsing, but would leave no place where a claim's verdicts on the datasets sit
side by side.) A section the parser does not find, such as a claim added after its block was
rendered, shows as "—" instead of failing. A file whose markers do not pair up, or one with
content but no markers when only some datasets are rendered, is refused, not overwritten.
"""

from __future__ import annotations

import logging
import math
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import yaml
from scipy import stats

from . import store
from .errors import UserError
from .report.references import load_references
from .report.table import cell_values, higher_is_better
from .sweep import Cell, expand, run_sweep

DEFAULT_FILE = Path("benchmarks") / "claims.yaml"  # relative to the working directory, as bench's other paths
log = logging.getLogger("dpgen_bench")
ARM_ONLY = ("ref", "per_dataset")  # arm keys that are not grid keys
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
    commits: list[str | None] = field(default_factory=list)  # the code that made each complete seed (env.json)
    stale: int = 0  # complete records left out: made without the required commit

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
    """The claims file, checked: unique ids, a non-empty ``datasets`` list that every claim's
    own ``datasets`` lies in, a scale text for each dataset a claim covers, and no ``dataset``
    in ``defaults`` or an arm (the datasets list decides it, so each arm runs on each)."""
    spec = yaml.safe_load(path.read_text())
    ids = [c["id"] for c in spec["claims"]]
    if len(set(ids)) != len(ids):
        raise UserError(f"{path}: duplicate claim ids")
    datasets = spec.get("datasets")
    if not isinstance(datasets, list) or not datasets or len(set(datasets)) != len(datasets):
        raise UserError(f"{path}: 'datasets' must be a list of distinct dataset names")
    if "dataset" in spec.get("defaults", {}):
        raise UserError(f"{path}: 'dataset' belongs in the top-level 'datasets' list, not in 'defaults'")
    for claim in spec["claims"]:
        own = claim_datasets(spec, claim)
        if not own or not set(own) <= set(datasets):
            raise UserError(f"{path}: claim {claim['id']}: 'datasets' must be some of {datasets}, got {own}")
        scale = claim.get("scale")
        if isinstance(scale, dict) and not set(own) <= set(scale):
            raise UserError(f"{path}: claim {claim['id']}: no scale text for {sorted(set(own) - set(scale))}")
        for name, arm in claim["arms"].items():
            if "dataset" in arm or any("dataset" in o for o in (arm.get("per_dataset") or {}).values()):
                raise UserError(f"{path}: claim {claim['id']}, arm {name!r}: 'dataset' comes from 'datasets'")
    return spec


def claim_datasets(spec: dict, claim: dict) -> list[str]:
    """The datasets ``claim`` is checked on: its own list, or the file's."""
    return list(claim.get("datasets") or spec["datasets"])


def scale_text(claim: dict, dataset: str) -> str:
    scale = claim["scale"]
    return scale[dataset] if isinstance(scale, dict) else scale


def build_arms(spec: dict, claim: dict, dataset: str) -> dict[str, Arm]:
    """The claim's arms on ``dataset``: each arm's grid on top of ``defaults``, then the arm's
    ``per_dataset`` entry for this dataset (shallow: a ``set`` there replaces the arm's), with
    ``dataset`` set last. On a dataset without a ``per_dataset`` entry the grid is exactly
    ``{**defaults, **arm, dataset}``, so a cell's config, and with it its run directory, do not
    depend on which other datasets the file lists."""
    arms = {}
    for name, arm in claim["arms"].items():
        grid = {**spec.get("defaults", {}), **{k: v for k, v in arm.items() if k not in ARM_ONLY},
                **(arm.get("per_dataset") or {}).get(dataset, {}), "dataset": dataset}
        arms[name] = Arm(name, expand(grid), ref=arm.get("ref"))
    return arms


def committed_roots(spec: dict) -> list[Path]:
    """The file's ``also_results``: committed record directories (e.g. the hour-long runs of
    benchmarks/mnist_runs) where a cell's record counts as if it were under ``results``;
    relative to the working directory."""
    return [Path(r).absolute() for r in spec.get("also_results") or []]


def record_dir(cell: Cell, root: Path, also: list[Path] = ()) -> Path:
    """Where the cell's record is: under ``root``, else the first of ``also`` holding it
    complete (a fresh run always goes to ``root``)."""
    for where in (root, *also):
        if store.is_complete(where / cell.run_name):
            return where / cell.run_name
    return root / cell.run_name


def draw_figures(arms: dict[str, Arm], root: Path, out: Path, also: list[Path] = ()) -> list[Path]:
    """A claim's figures (those of ``bench report --figures``: the metric against ε, sample
    grids) from its own complete records only, linked into ``out/runs`` (rebuilt each time:
    a run of an earlier setting leaves); the other claims' records in ``root`` would crowd them."""
    from .report import table as T
    from .report.figures import all_figures

    links = out / "runs"
    links.mkdir(parents=True, exist_ok=True)
    for old in links.iterdir():
        if old.is_symlink():
            old.unlink()
    for cell in (c for a in arms.values() for c in a.cells):
        run_dir = record_dir(cell, root, also)
        if store.is_complete(run_dir) and not (links / cell.run_name).exists():
            (links / cell.run_name).symlink_to(run_dir.resolve())
    full, _ = T.collect(links)
    return all_figures(full, T.aggregate(full), out) if len(full) else []


def read_arm(arm: Arm, root: Path, require_commit: str | None = None, also: list[Path] = ()) -> None:
    """The arm's complete records under ``root`` (or ``also``); with ``require_commit`` (a full
    hash), a record made by code without that commit is left out (counted in ``arm.stale``)."""
    for cell in arm.cells:
        run_dir = record_dir(cell, root, also)
        rec = store.load_record(run_dir)
        if rec is None:
            continue
        try:
            env = store.read_json(run_dir / "env.json")
        except (OSError, ValueError):
            env = None
        commit = store.env_commit(env)
        if require_commit and not store.commit_contains(commit, require_commit):
            arm.stale += 1
            continue
        arm.commits.append(commit)
        for metric, value in rec["eval"].get("metrics", {}).items():
            arm.values.setdefault(metric, []).append(float(value))
        eps = rec["privacy"]["epsilon"]
        arm.eps.append((float(eps["rdp"]), float(eps["prv"])))
        arm.caveat = arm.caveat or rec["privacy"].get("caveat")
        arm.machines.append(f"{env.get('cpu_count')} CPUs, torch {env.get('packages', {}).get('torch')}, "
                            f"{env.get('device', {}).get('name', '?')}" if isinstance(env, dict) else "unknown machine")


def code_text(arms: dict[str, Arm]) -> str:
    """Which code made a section's records: each git commit their ``env.json`` names, with its
    date and how many runs it made, newest first (a record shared by several arms counted
    once per arm); "unknown" for a record without a commit or one this checkout lacks."""
    counts: dict[str | None, int] = {}
    for a in arms.values():
        for c in a.commits:
            counts[c] = counts.get(c, 0) + 1
    dated = []
    for commit, n in counts.items():
        dated.append((store.commit_date(commit) or "" if commit else "", commit, n))
    parts = []
    for date, commit, n in sorted(dated, key=lambda t: t[0], reverse=True):
        runs = f"{n} run{'s' if n != 1 else ''}"
        parts.append(f"{runs} at {commit[:7]} ({date[:10]})" if commit and date else
                     f"{runs} at {commit[:7]} (not in this checkout)" if commit else f"{runs} at an unknown commit")
    return "; ".join(parts)


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
        ran = [o for o in others if len(o.values.get(metric, [])) >= 2]
        missing = f"{arm.name} vs {', '.join(o.name for o in others)}: fewer than 2 seeds"
        if len(arm.values.get(metric, [])) < 2 or not ran:
            return [(MISSING, missing)]
        best = max(ran, key=lambda o: np.mean(_oriented(metric, o.values[metric])))
        verdict, text = check_better(spec, metric, best, arm)
        if verdict == UNTESTABLE:
            return [(verdict, text)]
        if len(ran) < len(others):
            # significantly worse than an arm run is significantly worse than the best of all,
            # whatever the arms not run give; otherwise they could still decide it
            if verdict != REPRODUCED:
                return [(MISSING, missing)]
            absent = ", ".join(o.name for o in others if o not in ran)
            return [(NOT_REPRODUCED, f"best fixed run: {text}; {arm.name} is significantly worse "
                                     f"({absent} not run yet: it cannot change this)")]
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
        refs = refs[refs["run_id"].str.startswith(f"{ref['paper']}:{ref['table']}")
                    & (refs["dataset"] == ref["dataset"])
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


def anchor(claim_id: str, dataset: str) -> str:
    return f"{claim_id}-{dataset}"


KEPT_NOTE = ("_Kept as last rendered: the machine that regenerated this block holds fewer of this claim's runs "
             "than this section shows (`results/` is not in git); `--run` there renews it._")


def find_section(block: str, claim_id: str, dataset: str) -> tuple[str, str] | None:
    """(anchor name, section) of a claim in a block as it stands: its anchor (``<id>-<dataset>``,
    or ``<id>`` in a block rendered before anchors named their dataset) up to the next claim's
    anchor or the block's date line; None if the block has no section for it."""
    for name in (anchor(claim_id, dataset), claim_id):
        tag = f'<a id="{name}"></a>'
        if tag in block:
            rest = tag + block.split(tag, 1)[1]
            end = [i for i in (rest.find('<a id="', 1), rest.find("\n_Last regenerated")) if i > 0]
            return name, (rest[:min(end)] if end else rest).rstrip("\n")
    return None


def old_section(block: str, claim_id: str, dataset: str) -> str | None:
    """A claim's section in a block as it stands (``find_section``), or None."""
    found = find_section(block, claim_id, dataset)
    return found[1] if found else None


def _fewer_here(section: str, arms: dict[str, Arm]) -> bool:
    """Whether some arm of a rendered section had more complete seeds there than its records
    here: re-rendering would then lose results this machine does not hold."""
    before = {m.group(1): int(m.group(2)) for m in re.finditer(r"^\| (.+?) \| (\d+)/\d+ \|", section, re.M)}
    return any(len(a.eps) < before.get(name, 0) for name, a in arms.items())


CARRIED = "_Carried from the previous render: "  # the rows of a section this machine holds only some runs of


def _merge_kept(section: str, arms: dict[str, Arm]) -> tuple[dict[str, Arm], dict[str, str]]:
    """A section this machine holds fewer runs of than it shows, against the arms read here:
    where every arm here has at most the seeds its row shows, or its row is already what the
    records here give, nothing is newer (returns no carried rows: keep the section). Otherwise
    the arms with at least their row's complete seeds here come from the records, the others
    from their rows as shown (``_arm_from_row``: the statistics the checks read), with those
    rows' lines to print verbatim."""
    _, rows = _table(section)
    lines = {m.group(1): m.group(0) for m in _ROW.finditer(section)}
    fresh = {n for n, a in arms.items() if a.eps and len(a.eps) >= rows.get(n, (0,))[0]}
    newer = {n for n in fresh if n not in rows or any(
        rows[n][2].get(m) != arms[n].cell_text(m) for m in arms[n].values)}
    if not newer:
        return arms, {}
    carried = {n: lines[n] for n in arms if n not in fresh and n in rows}
    merged = {n: arms[n] if n not in carried else _arm_from_row(n, a.ref, *rows[n]) for n, a in arms.items()}
    return merged, carried


CARRIED_CODE = "; the carried rows' runs among the previous render's: "


def _with_carried_code(code: str, before: str) -> str:
    """This render's code line, then the previous render's runs it does not name, once each:
    a section re-rendered with carried rows again names every commit once, instead of nesting
    the previous line inside the new one render after render."""
    def commit(item: str) -> str:  # code_text's "2 runs at e9e2ccd (its date)" -> "e9e2ccd (its date)"
        return item.split(" at ", 1)[-1]

    here = {commit(c) for c in code.split("; ") if c}
    rest: dict[str, str] = {}  # commit -> the previous render's first item naming it
    for part in before.split(CARRIED_CODE):
        for c in part.split("; "):
            if c and commit(c) not in here:
                rest.setdefault(commit(c), c)
    return f"{code}{CARRIED_CODE}{'; '.join(rest.values())}" if rest else code


def render_block(spec: dict, dataset: str, claims: list[dict], arms_by_claim: dict[str, dict[str, Arm]],
                 seconds: float | None, previous: str = "", require_commit: str | None = None) -> str:
    """One dataset's block (without its markers): where its runs ran, a section per claim, the
    date. A claim for which this machine holds fewer runs than ``previous`` (the block as it
    stood) showed keeps that section, marked as kept, instead of losing results; where some of
    its arms have newer complete records here, those rows are rendered and the others carried
    (``_merge_kept``)."""
    lines = []
    machines: dict[str, int] = {}
    for arms in arms_by_claim.values():
        for a in arms.values():
            for cell, m in zip(a.cells, a.machines):
                machines[m] = machines.get(m, 0) + 1
    if machines:
        lines += [f"Where the {dataset} runs ran (each run's `env.json`; a run shared by several claims counted once "
                  "per arm): " + "; ".join(f"{n} on {m}" for m, n in sorted(machines.items())) + ".", ""]
    for claim in claims:
        arms = arms_by_claim[claim["id"]]
        kept = old_section(previous, claim["id"], dataset)
        # fewer runs here than the section showed: keep it, unless the missing ones are records
        # this machine holds but --require-commit left out (their numbers are what must go)
        if kept is not None and (not _fewer_here(kept, arms) or any(a.stale for a in arms.values())):
            kept = None
        carried: dict[str, str] = {}
        if kept is not None:
            arms, carried = _merge_kept(kept, arms)
            if not carried:  # nothing here is newer than the section: keep it whole
                if KEPT_NOTE not in kept and CARRIED not in kept:  # (a merged one's own rows are current)
                    kept += "\n\n" + KEPT_NOTE
                lines += [kept, ""]
                continue
        results = [r for exp in claim["expect"] for r in check(spec, exp, arms)]
        verdict = claim_verdict(results)
        metrics = list(dict.fromkeys([e["metric"] for e in claim["expect"]] +
                                     [m for a in arms.values() for m in a.values]))
        lines += [f'<a id="{anchor(claim["id"], dataset)}"></a>', f"## {claim['title']} ({dataset})", "",
                  f"- **Source:** {claim['source']}", f"- **The paper:** {claim['paper']}",
                  f"- **Checked at:** {scale_text(claim, dataset)}"]
        code = code_text(arms)
        before = re.search(r"^- \*\*Code:\*\* (.*)$", kept or "", re.M) if carried else None
        if before:  # the carried rows' runs are among those the previous render named
            code = _with_carried_code(code, before.group(1))
        stale = sum(a.stale for a in arms.values())
        if code or stale:
            lines.append(f"- **Code:** {code or 'no record'}" +
                         (f" ({stale} older record{'s' if stale != 1 else ''} left out: made without "
                          f"{require_commit[:7]})" if stale else ""))
        lines += [f"- **Verdict: {verdict}**", "",
                  "| arm | seeds | ε spent (RDP / PRV) | " + " | ".join(metrics) + " |",
                  "|---|---|---|" + "---|" * len(metrics)]
        for a in arms.values():
            if a.name in carried:
                lines.append(carried[a.name])
                continue
            eps = "—"
            if a.eps:
                rdp, prv = max(e[0] for e in a.eps), max(e[1] for e in a.eps)
                eps = "∞" if math.isinf(rdp) else f"{rdp:.3g} / {prv:.3g}" if math.isfinite(prv) else f"{rdp:.3g} / n/a"
                eps += " ‡" if a.caveat else ""
            lines.append(f"| {a.name} | {len(a.eps)}/{len(a.cells)} | {eps} | " +
                         " | ".join(a.cell_text(m) for m in metrics) + " |")
        caveats = sorted({a.caveat for a in arms.values() if a.caveat})
        lines += [""] + [f"‡ {c}" for c in caveats] + ([""] if caveats else [])
        lines += [f"- {v + ': ' if v else ''}{t}" for v, t in results] + [""]
        if carried:
            lines += [CARRIED + ", ".join(f"`{n}`" for n in carried) + " (this machine lacks their runs; "
                      "the other rows are its records); the checks above are recomputed from the rows as shown._", ""]
    lines.append(f"_Last regenerated {time.strftime('%Y-%m-%d')}" +
                 (f"; the runs it started took {seconds / 60:.0f} min of wall time" if seconds else "") + "._")
    return "\n".join(lines)


def replace_sections(previous: str, fresh: str, dataset: str, claims: list[dict]) -> str:
    """``previous`` (a dataset's block as it stands) with the sections of ``claims`` taken
    from ``fresh`` (a block rendered for those claims only) and its date line noting them;
    every other claim's section and the block's "where the runs ran" line stay as they
    were (``--only``: a few claims re-run without the records of the rest). A claim that
    ``previous`` lacks is added before the date line."""
    out = previous
    for claim in claims:
        new = find_section(fresh, claim["id"], dataset)
        if new is None:
            continue
        old = find_section(out, claim["id"], dataset)
        if old is not None:
            out = out.replace(old[1], new[1], 1)
        else:
            head, sep, tail = out.rpartition("\n_Last regenerated")
            out = f"{head}\n{new[1]}\n{sep}{tail}" if sep else f"{out}\n\n{new[1]}"
    # which sections were re-rendered when: the previous note's entries, then these claims today
    dates: dict[str, str] = {}
    # `claims.py --only`: the note as written before the command was bench claims
    earlier = re.search(r"\n+_Sections (.*?) \(`(?:bench claims|claims\.py) --only`\); the others as last "
                        r"regenerated._$", out, re.S)
    if earlier:
        for group in re.finditer(r"(.+?) re-rendered (\d{4}-\d{2}-\d{2})(?:; |$)", earlier.group(1)):
            dates.update(dict.fromkeys(group.group(1).split(", "), group.group(2)))
        out = out[:earlier.start()]
    today = time.strftime("%Y-%m-%d")
    for c in claims:
        dates.pop(c["id"], None)
        dates[c["id"]] = today
    by_date: dict[str, list[str]] = {}
    for cid, d in dates.items():
        by_date.setdefault(d, []).append(cid)
    groups = "; ".join(f"{', '.join(ids)} re-rendered {d}" for d, ids in sorted(by_date.items()))
    return f"{out}\n\n_Sections {groups} (`bench claims --only`); the others as last regenerated._"


_BLOCK = re.compile(r"^<!-- claims:dataset=([^\s>]+) -->\n(.*?)\n<!-- /claims:dataset=\1 -->$", re.S | re.M)
_MARKER = re.compile(r"^<!-- /?claims:dataset=", re.M)


def split_blocks(text: str) -> dict[str, str]:
    """dataset → its block's text between the markers, exactly as it stands; a file whose
    markers do not pair up (or that holds one dataset twice) is an error, since the block it
    cannot read would otherwise be dropped."""
    blocks: dict[str, str] = {}
    for m in _BLOCK.finditer(text):
        if m.group(1) in blocks:
            raise UserError(f"two blocks for dataset {m.group(1)!r}")
        blocks[m.group(1)] = m.group(2)
    if len(_MARKER.findall(text)) != 2 * len(blocks):
        raise UserError("unpaired <!-- claims:dataset=… --> markers")
    return blocks


def block_verdicts(block: str, dataset: str, claims: list[dict]) -> dict[str, tuple[str, str]]:
    """claim id → (verdict, anchor) read from a block: the ``**Verdict: …**`` line of the
    claim's section (``find_section``). Claims without a section are left out."""
    out = {}
    for claim in claims:
        found = find_section(block, claim["id"], dataset)
        m = re.search(r"^- \*\*Verdict: (.+)\*\*$", found[1], re.M) if found else None
        if m:
            out[claim["id"]] = (m.group(1), found[0])
    return out


def sync_claim_text(block: str, dataset: str, claims: list[dict]) -> str:
    """``block`` with each section's Source and The paper lines as the claims file says now:
    they state the claim, not its runs, so a kept section needs no records to follow an edit."""
    for claim in claims:
        found = find_section(block, claim["id"], dataset)
        if found is None:
            continue
        section = found[1]
        for label, text in (("Source", claim["source"]), ("The paper", claim["paper"])):
            section = re.sub(rf"^- \*\*{label}:\*\* .*$", lambda _: f"- **{label}:** {text}", section, count=1,
                             flags=re.M)
        block = block.replace(found[1], section, 1)
    return block


_ROW = re.compile(r"^\| (.+?) \| (\d+)/(\d+) \| (.*) \|$", re.M)
REFRESHED = "_Rows of "  # the note of a section whose shared arms show a later section's rows


def _rendered_on(block: str, dataset: str, claims: list[dict]) -> dict[str, str]:
    """claim id → when its section's numbers were rendered, as sortable text: the block's
    date, or the date ``--only`` re-rendered it; "" for a section kept from an earlier render."""
    base = re.search(r"^_Last regenerated (\d{4}-\d{2}-\d{2})", block, re.M)
    dates = {c["id"]: base.group(1) if base else "" for c in claims}
    note = re.search(r"^_Sections (.*?) \(`(?:bench claims|claims\.py) --only`\)", block, re.M | re.S)
    for group in re.finditer(r"(.+?) re-rendered (\d{4}-\d{2}-\d{2})(?:; |$)", note.group(1) if note else ""):
        dates.update(dict.fromkeys(group.group(1).split(", "), group.group(2)))
    for c in claims:
        found = find_section(block, c["id"], dataset)
        if found and KEPT_NOTE in found[1]:
            dates[c["id"]] = ""
    return dates


def _table(section: str) -> tuple[list[str], dict[str, tuple[int, int, dict[str, str]]]]:
    """(metric columns, arm → (complete seeds, seeds, column → cell)) of a section's table."""
    header = re.search(r"^\| arm \| seeds \| ε spent \(RDP / PRV\) \| (.*) \|$", section, re.M)
    metrics = header.group(1).split(" | ") if header else []
    rows = {}
    for m in _ROW.finditer(section):
        cells = m.group(4).split(" | ")
        rows[m.group(1)] = (int(m.group(2)), int(m.group(3)), dict(zip(["ε spent"] + metrics, cells)))
    return metrics, rows


def _arm_from_row(name: str, ref: str | None, done: int, total: int, cells: dict[str, str]) -> Arm:
    """An arm whose values have the mean, sample std and count a row prints: the statistics
    every check reads, so a check of such arms is the check of the runs, to the row's rounding."""
    arm = Arm(name, [None] * total, ref=ref)
    for metric, text in cells.items():
        values = None if metric == "ε spent" else cell_values(text, done)
        if values is not None:
            arm.values[metric] = values
    return arm


def refresh_shared_rows(spec: dict, block: str, dataset: str, claims: list[dict]) -> str:
    """One number per run in a block: an arm that several sections show (the same cells)
    shows, in every section, the row of the section rendered last, when one was (a section
    kept from an earlier render, or one ``--only`` did not re-render, can hold older runs of
    it); such a section's checks and verdict are recomputed from its rows as shown, and a
    note names the rows and where they come from."""
    claims = [c for c in claims if dataset in claim_datasets(spec, c) and find_section(block, c["id"], dataset)]
    dates = _rendered_on(block, dataset, claims)
    sections = {c["id"]: find_section(block, c["id"], dataset) for c in claims}
    tables = {cid: _table(s[1]) for cid, s in sections.items()}
    arms = {c["id"]: build_arms(spec, c, dataset) for c in claims}
    shown: dict[tuple, list[tuple[str, str]]] = {}  # the arm's cells → (claim id, arm name) of each row
    for cid, by_name in arms.items():
        for name, a in by_name.items():
            if name in tables[cid][1]:
                shown.setdefault(tuple(c.run_name for c in a.cells), []).append((cid, name))
    replaced: dict[str, dict[str, str]] = {}  # claim id → arm name → the claim id its row comes from
    for places in shown.values():
        last = max(dates[cid] for cid, _ in places)
        if len({repr(tables[cid][1][name]) for cid, name in places if dates[cid] == last}) > 1:
            continue  # sections of the same render disagree: nothing says which is current
        source = next((cid, name) for cid, name in places if dates[cid] == last)
        for cid, name in places:
            done, total, cells = tables[cid][1][name]
            new = tables[source[0]][1][source[1]]
            if dates[cid] < last and (done, total, cells) != new and set(cells) <= set(new[2]):
                tables[cid][1][name] = new
                replaced.setdefault(cid, {})[name] = source[0]
    for claim in claims:
        cid = claim["id"]
        if cid not in replaced:
            continue
        name_of, section = sections[cid]
        metrics, rows = tables[cid]
        for name, (done, total, cells) in rows.items():
            line = f"| {name} | {done}/{total} | " + " | ".join(cells[k] for k in ["ε spent"] + metrics) + " |"
            section = re.sub(rf"^\| {re.escape(name)} \| .*$", lambda _: line, section, count=1, flags=re.M)
        built = {name: _arm_from_row(name, a.ref, *rows[name]) for name, a in arms[cid].items() if name in rows}
        results = [r for exp in claim["expect"] for r in check(spec, exp, built)]
        lines = section.split("\n")
        last_row = max(i for i, s in enumerate(lines) if _ROW.match(s))
        first = next((i for i in range(last_row + 1, len(lines)) if lines[i].startswith("- ")), len(lines))
        end = next((i for i in range(first, len(lines)) if not lines[i].startswith("- ")), len(lines))
        lines[first:end] = [f"- {v + ': ' if v else ''}{t}" for v, t in results]
        by_source: dict[str, list[str]] = {}
        for name, src in replaced[cid].items():
            by_source.setdefault(src, []).append(name)
        note = REFRESHED + "; ".join(", ".join(f"`{n}`" for n in names) + f" as [{src}](#{sections[src][0]}) shows them"
                                     for src, names in by_source.items()) + \
            " (rendered since, from newer runs); the checks above are recomputed from the rows as shown._"
        old = [i for i, s in enumerate(lines) if s.startswith(REFRESHED)]
        if old:
            lines[old[0]] = note
        else:
            lines[end:end] = ["", note]
        section = re.sub(r"^- \*\*Verdict: .*\*\*$", lambda _: f"- **Verdict: {claim_verdict(results)}**",
                         "\n".join(lines), count=1, flags=re.M)
        block = block.replace(sections[cid][1], section, 1)
    return block


def render(spec: dict, blocks: dict[str, str], source: str | Path = DEFAULT_FILE) -> str:
    """The whole file: the header, the summary (read back from ``blocks``), then the blocks in
    the order of the file's datasets (a kept block of a dataset the file no longer lists last),
    each with its claims' text as the file says now and one row per shared arm
    (``sync_claim_text``, ``refresh_shared_rows``); ``source``: the claims file, as the header
    names it."""
    datasets = [d for d in spec["datasets"] if d in blocks] + [d for d in blocks if d not in spec["datasets"]]
    listed = spec["datasets"] + [d for d in datasets if d not in spec["datasets"]]
    names = ", ".join(listed[:-1]) + " and " + listed[-1] if len(listed) > 1 else listed[0]
    lines = [f"# The papers' claims on {names}", "",
             "Generated by `bench claims` (or `make claims`, which first runs what is missing) from "
             f"`{Path(source).as_posix()}` and the run records under `{spec.get('results', 'results/claims')}`"
             + "".join(f" and the committed ones in `{r}`" for r in spec.get("also_results") or []) + "; do not "
             "edit by hand. Each dataset has its own block below, regenerated by `bench claims --dataset D` (the other "
             "blocks are kept as they are, so each block carries its own date); the table gathers every claim's "
             "verdict on each. Numbers are mean ± std over seeds on the real test split of the block's dataset "
             "(n shown when fewer seeds are complete); a comparison is a one-sided Welch t-test at "
             f"α = {spec.get('alpha', 0.05)}; an accuracy comparison whose arms are all within "
             f"{spec.get('chance_margin', 0.05)} of chance is *not testable at this scale*.", "",
             "| claim | source | " + " | ".join(listed) + " |", "|---|---|" + "---|" * len(listed)]
    blocks = {d: refresh_shared_rows(spec, sync_claim_text(b, d, spec["claims"]), d, spec["claims"])
              if d in spec["datasets"] else b for d, b in blocks.items()}
    verdicts = {d: block_verdicts(blocks[d], d, spec["claims"]) for d in datasets}
    for claim in spec["claims"]:
        cells = []
        for d in listed:
            if d in spec["datasets"] and d not in claim_datasets(spec, claim):
                cells.append("not checked on this dataset")
            elif claim["id"] in verdicts.get(d, {}):
                verdict, name = verdicts[d][claim["id"]]
                cells.append(f"[**{verdict}**](#{name})")
            else:
                cells.append("—")
        lines.append(f"| {claim['title']} | {claim['source']} | " + " | ".join(cells) + " |")
    lines.append("")
    for d in datasets:
        lines += [f"<!-- claims:dataset={d} -->", blocks[d], f"<!-- /claims:dataset={d} -->", ""]
    return "\n".join(lines)


def _shown(path: Path) -> str:
    """``path`` as CLAIMS.md's header names it: relative to the working directory when under it."""
    try:
        return path.resolve().relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return path.as_posix()


def run_claims(claims_file: str | Path = DEFAULT_FILE, *, results: str | Path | None = None,
               also: tuple[str | Path, ...] = (), out: str | Path | None = None, run: bool = False, jobs: int = 2,
               require_commit: str | None = None, datasets: str | None = None, only: str | None = None,
               figures: str | Path | None = None) -> Path:
    """``bench claims``: (with ``run``) run the cells without a complete record, then write
    ``out`` (default: CLAIMS.md beside the claims file); returns the file written. ``datasets``
    and ``only`` are comma-separated: the datasets whose blocks, and the claims whose sections,
    are run and rendered (the rest kept as they stand). A mistake is a ``UserError``."""
    claims_file = Path(claims_file)
    if not claims_file.is_file():
        raise UserError(f"no claims file at {claims_file} (bench claims CLAIMS_FILE)")
    spec = load_claims(claims_file)
    root = Path(results or spec.get("results", "results/claims"))
    claims = spec["claims"]
    if only:
        wanted = set(only.split(","))
        unknown = wanted - {c["id"] for c in claims}
        if unknown:
            raise UserError(f"unknown claim ids {sorted(unknown)}")
        claims = [c for c in claims if c["id"] in wanted]
    chosen = spec["datasets"]
    if datasets:
        wanted = {d.strip() for d in datasets.split(",") if d.strip()}
        unknown = wanted - set(chosen)
        if unknown or not wanted:
            raise UserError(f"unknown datasets {sorted(unknown)} ({claims_file.name} has: {', '.join(chosen)})")
        chosen = [d for d in chosen if d in wanted]
    out = Path(out) if out else claims_file.with_name("CLAIMS.md")
    old = out.read_text() if out.exists() else ""
    blocks = split_blocks(old)
    if old.strip() and not blocks and set(chosen) != set(spec["datasets"]):
        raise UserError(f"{out} has no <!-- claims:dataset=… --> blocks: rendering only {', '.join(chosen)} "
                        "would drop what it holds (render every dataset, or wrap it in its dataset's block)")
    arms = {(d, c["id"]): build_arms(spec, c, d) for d in chosen for c in claims if d in claim_datasets(spec, c)}
    seconds = None
    required = store.resolve_commit(require_commit) if require_commit else None
    committed = committed_roots(spec) + [Path(a).absolute() for a in also]
    if run:
        if jobs < 1:
            raise UserError("--jobs must be ≥ 1")
        cells = {cell.run_name: cell for by_name in arms.values() for a in by_name.values() for cell in a.cells
                 if record_dir(cell, root, committed).parent == root}  # committed ones: done
        t = time.time()
        counts = run_sweep(list(cells.values()), root, jobs=jobs, require_commit=required)
        seconds = time.time() - t
        log.info("claims: %d runs, %d already complete, %d failed", counts["ran"], counts["done"], counts["failed"])
    for by_name in arms.values():
        for a in by_name.values():
            read_arm(a, root, required, committed)
    stale = sum(a.stale for by_name in arms.values() for a in by_name.values())
    if stale:
        log.info("claims: %d records made without %s left out (--run runs them again)", stale, require_commit)
    if figures:
        for (d, claim_id), by_name in arms.items():
            paths = draw_figures(by_name, root, Path(figures) / f"{claim_id}-{d}", committed)
            log.info("claims: %d figure files for %s on %s", len(paths), claim_id, d)
    for d in chosen:
        covered = [c for c in claims if (d, c["id"]) in arms]
        block = render_block(spec, d, covered, {c["id"]: arms[d, c["id"]] for c in covered}, seconds,
                             previous=blocks.get(d, ""), require_commit=required)
        blocks[d] = replace_sections(blocks[d], block, d, covered) if only and d in blocks else block
    with store.atomic_open(out, "w") as f:
        f.write(render(spec, blocks, _shown(claims_file)))
    kept = [d for d in blocks if d not in chosen]
    log.info("wrote %s (%s%s)", out, ", ".join(chosen), "; kept " + ", ".join(kept) if kept else "")
    return out
