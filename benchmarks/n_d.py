"""The n_D sweep of DPGAN on digits (Private GANs, Revisited §4 / §6 at N = 1,437): writes
``benchmarks/n_d.md`` (table) and ``benchmarks/n_d.png`` (adaptive runs: n_D and the EMA of
D's fake accuracy against D steps) from the run records.

    .venv/bin/python benchmarks/n_d.py --run --jobs 2     # runs the missing cells, then writes
    .venv/bin/python benchmarks/n_d.py                    # writes from the records already there

Cells: dpgan, quick preset, ε = 10, n_D ∈ {1, 2, 5, 10, adaptive} × T ∈ {1,500, 6,000} D
steps (σ recalibrated for ε = 10 at each T) × seeds {0, 1, 2}, plus adaptive with the
paper's EMA β = 0.99 (the quick preset has 0.95; at T = 6,000 this is ``--preset long``),
on the validation split
(``--eval-split val``: trained on the training part without the validation images,
evaluated on those) and on the test split; gen2real / real2gen CNN accuracy. Records go to
``results/n_d`` (git-ignored); the test-split cells the claims already ran
(``results/claims``) are read from there and not run again.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = [ROOT / "results" / "n_d", ROOT / "results" / "claims"]
BETA_ARM = "adaptive, β = 0.99"  # the paper's EMA (grace 2/(1−β) = 200 G steps); quick: β = 0.95, grace 40
ARMS = ["1", "2", "5", "10", "adaptive", BETA_ARM]
STEPS = [1500, 6000]
SPLITS = ["val", "test"]
METRICS = ["gen2real_cnn", "real2gen_cnn"]
SEEDS = [0, 1, 2]
VERDICT = "<!-- reading: hand-written, kept when the table is regenerated -->"


# test-split cells results/claims does not have (it has every arm at T = 1,500, and 1, 5,
# adaptive at T = 6,000)
TO_RUN = {("val", 1500): ARMS[:5], ("val", 6000): ARMS[:5], ("test", 6000): ["2", "10"]}


def grid(split: str, steps: int, arms: list[str], beta: float | None = None) -> str:
    extra = f", adaptive_beta: {beta}" if beta else ""
    return "\n".join([
        "method: [dpgan]", "dataset: [digits]", "eps: [10]", f"seeds: {SEEDS}",
        f"n_d: [{', '.join(arms)}]", "preset: quick", f"eval: [{', '.join(METRICS)}]",
        f"eval_split: {split}", f"set: {{steps: {steps}{extra}}}", ""])


def records() -> dict[tuple, list[tuple[int, dict, Path]]]:
    """(n_D, T, split) -> [(seed, metrics, run dir)], newest record per seed."""
    seen: dict[tuple, dict[int, tuple[float, dict, Path]]] = {}
    for root in RESULTS:
        for cfg in root.glob("*/config.json"):
            run = cfg.parent
            ev = run / "eval.json"
            if not ev.exists():
                continue
            c = json.loads(cfg.read_text())
            h = c.get("hparams", {})
            if (c.get("method") != "dpgan" or c.get("dataset") != "digits" or c.get("epsilon") != 10.0
                    or c.get("preset") not in ("quick", "long") or c.get("members") is not None or c.get("noise_off")):
                continue
            if h.get("batch_size") != 64 or h.get("adaptive_beta") not in (0.95, 0.99):
                continue  # another axis
            arm = str(h.get("n_d"))
            if h.get("adaptive_beta") == 0.99:
                if arm != "adaptive":
                    continue
                arm = BETA_ARM
            key = (arm, int(h.get("steps")), c.get("eval_split", "test"))
            metrics = json.loads(ev.read_text()).get("metrics", {})
            t = ev.stat().st_mtime
            slot = seen.setdefault(key, {})
            if c["seed"] not in slot or slot[c["seed"]][0] < t:
                slot[c["seed"]] = (t, metrics, run)
    return {k: sorted((s, m, r) for s, (_, m, r) in v.items()) for k, v in seen.items()}


def cell(values: list[float]) -> str:
    if not values:
        return "—"
    if len(values) == 1:
        return f"{values[0]:.3f} (n=1)"
    mean, sd = statistics.mean(values), statistics.stdev(values)
    return f"{mean:.3f} ± {sd:.3f}" + ("" if len(values) >= 3 else f" (n={len(values)})")


def g_steps(run: Path) -> int | None:
    last = None
    for line in (run / "train.jsonl").read_text().splitlines() if (run / "train.jsonl").exists() else []:
        r = json.loads(line)
        if "g_step" in r:
            last = r["g_step"]
    return last


def table(recs) -> str:
    head = ["n_D", "T (D steps)"] + [f"{m} ({s})" for m in METRICS for s in SPLITS] + ["G steps"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for steps in STEPS:
        for arm in ARMS:
            row = [arm, f"{steps:,}"]
            for m in METRICS:
                for s in SPLITS:
                    row.append(cell([r[1][m] for r in recs.get((arm, steps, s), []) if m in r[1]]))
            gs = [g for r in recs.get((arm, steps, "val"), []) + recs.get((arm, steps, "test"), [])
                  if (g := g_steps(r[2])) is not None]
            row.append(f"{min(gs)}–{max(gs)}" if gs and min(gs) != max(gs) else (str(gs[0]) if gs else "—"))
            lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def figure(recs, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    colors = {"adaptive": "tab:blue", BETA_ARM: "tab:orange"}
    for arm, color in colors.items():
        for steps, ls in zip(STEPS, ["-", "--"]):
            for _, _, run in recs.get((arm, steps, "val"), []) + recs.get((arm, steps, "test"), []):
                rows = [json.loads(x) for x in (run / "train.jsonl").read_text().splitlines()]
                rows = [r for r in rows if r.get("d_fake_acc_ema") is not None]
                d = [r["d_step"] for r in rows]
                label = f"{'β = 0.99' if arm == BETA_ARM else 'β = 0.95 (quick)'}, T = {steps:,}"
                axes[0].step(d, [r["n_d_next"] for r in rows], ls, color=color, where="post", alpha=0.5, label=label)
                axes[1].plot(d, [r["d_fake_acc_ema"] for r in rows], ls, color=color, alpha=0.5, label=label)
    axes[0].set(xlabel="D step", ylabel="n_D", yscale="log", title="adaptive n_D (every run, both splits)")
    axes[1].axhline(0.6, color="k", lw=0.8)
    axes[1].set(xlabel="D step", ylabel="EMA of D's fake accuracy", title="threshold 0.6 (black)")
    handles, labels = axes[0].get_legend_handles_labels()
    uniq = dict(zip(labels, handles))
    axes[0].legend(uniq.values(), uniq.keys(), fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run", action="store_true", help="run the missing cells first (bench sweep)")
    ap.add_argument("--jobs", type=int, default=1)
    args = ap.parse_args()
    if args.run:
        bench = Path(sys.executable).parent / "bench"
        for (split, steps), arms in TO_RUN.items():
            path = ROOT / "results" / "n_d" / f"grid-{split}-{steps}.yaml"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(grid(split, steps, arms))
            subprocess.run([str(bench), "sweep", str(path), "--jobs", str(args.jobs), "--results", str(RESULTS[0]),
                            "--no-report"], check=True, cwd=ROOT)
        grids = {f"grid-val-{steps}-beta.yaml": grid("val", steps, ["adaptive"], beta=0.99) for steps in STEPS}
        # the paper's EMA horizon on the validation split, then its T = 6,000 cell on the test
        # split through the preset it became (dpgan --preset long)
        grids["grid-test-long.yaml"] = grid("test", 6000, ["adaptive"]).replace("preset: quick", "preset: long")
        for name, text in grids.items():
            path = ROOT / "results" / "n_d" / name
            path.write_text(text)
            subprocess.run([str(bench), "sweep", str(path), "--jobs", str(args.jobs), "--results", str(RESULTS[0]),
                            "--no-report"], check=True, cwd=ROOT)
    recs = records()
    out = ROOT / "benchmarks" / "n_d.md"
    kept = ""  # the hand-written reading below the marker survives a regeneration
    if out.exists() and VERDICT in out.read_text():
        kept = out.read_text().split(VERDICT, 1)[1]
    out.write_text("# DPGAN's n_D on digits (table and figure generated by benchmarks/n_d.py)\n\n"
                   "dpgan, quick preset, ε = 10, mean ± std over seeds 0, 1, 2; val: trained without the "
                   "validation images, evaluated on them; test: the real test split. G steps = T / n_D "
                   "(adaptive: the range over runs).\n\n" + table(recs) + "\n\n![adaptive runs](n_d.png)\n\n"
                   + VERDICT + kept)
    figure(recs, ROOT / "benchmarks" / "n_d.png")
    print(table(recs))


if __name__ == "__main__":
    main()
