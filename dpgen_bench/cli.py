"""The ``bench`` command. Data to stdout; logs and progress to stderr; a user's mistake
is one line on stderr and exit code 2."""

from __future__ import annotations

import json
import logging
import math
import sys
from pathlib import Path

import click

from . import registry, settings, store
from .config import DEFAULT_DELTA, DEFAULTS_PRESET, EVAL_SPLITS, build_config, load_config_file, parse_set
from .errors import Interrupted, PrivacyViolation, UserError
from .logs import setup_logging

log = logging.getLogger("dpgen_bench")
TEST_PRESET = "tiny"
TEST_PRESET_NOTE = "tests only: seconds of training, not a benchmark"


class BenchGroup(click.Group):
    """Turns user errors (ours and click's) into one line and exit code 2."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        try:
            rv = super().main(args=args, prog_name=prog_name or "bench", complete_var=complete_var,
                              standalone_mode=False, **extra)
        except click.exceptions.Exit as e:
            sys.exit(e.exit_code)
        except click.exceptions.Abort:
            click.echo("error: aborted", err=True)
            sys.exit(130)
        except click.ClickException as e:
            click.echo(f"error: {e.format_message()}", err=True)
            sys.exit(2)
        except UserError as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(2)
        except PrivacyViolation as e:
            click.echo(f"privacy violation: {e}", err=True)
            sys.exit(3)
        if not standalone_mode:
            return rv
        sys.exit(rv if isinstance(rv, int) else 0)


@click.group(cls=BenchGroup, context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.option("-v", "--verbose", is_flag=True, help="More log lines on stderr.")
def cli(verbose: bool) -> None:
    """Differentially private image generators under one shared budget."""
    setup_logging(verbose)


# ---------------------------------------------------------------------- options


def _run_options(f):
    opts = [
        click.option("--method", "-m", default=None, help="Method name (bench list methods)."),
        click.option("--dataset", "-d", default=None, help="Dataset name (bench list datasets) [default: digits]."),
        click.option("--eps", type=float, default=None,
                     help="Target ε (required for private methods; omit for non-private ones)."),
        click.option("--delta", type=float, default=None, help=f"Target δ [default: {DEFAULT_DELTA:g}]."),
        click.option("--preset", default=None,
                     help="Preset name (bench list presets) [default: quick where the method has one for the "
                          "dataset, else paper]."),
        click.option("--n-d", "n_d", default=None, help="Discriminator steps per G step: INT or 'adaptive'."),
        click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="Override a method setting."),
        click.option("--config", "config_file", default=None, help="YAML/JSON file of run keys and hparams."),
        click.option("--seed", type=int, default=None, help="Seed [default: 0]."),
        click.option("--data-root", default=None,
                     help="Root of local dataset files (else $DPGEN_DATA, else ~/.cache/dpgen_bench/data)."),
        click.option("--eval-split", "eval_split", type=click.Choice(EVAL_SPLITS), default=None,
                     help="Evaluate on the real test split, or train on the training split minus a fixed "
                          "stratified 15% validation part and evaluate on that (for choosing settings) "
                          "[default: test]."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


# ------------------------------------------------------------------------- run


@cli.command()
@_run_options
@click.option("--members", type=int, default=None, help="Train on N training images only (membership inference).")
@click.option("--eval", "evaluators", default=None, help="Comma-separated evaluators [default: the preset's].")
@click.option("--device", default=None, help="auto | cpu | cuda | cuda:N [default: auto].")
@click.option("--out", default=None, help="Exact run directory [default: RESULTS/<run-id>].")
@click.option("--results", default=None, help="Root of run directories (else $DPGEN_RESULTS, else results/runs).")
@click.option("--dry-run", is_flag=True,
              help="Print the resolved config, the privacy plan and a run-time estimate (from a short timed "
                   "probe of the first training steps on this device), then exit without writing anything.")
@click.option("--probe-seconds", type=float, default=10.0, show_default=True,
              help="Length of --dry-run's timing probe (0: no estimate).")
@click.option("--probe-steps", type=click.IntRange(min=0), default=5, show_default=True,
              help="--dry-run's gradient probe: each private part's first N steps, its measured gradient norms and "
                   "noise to signal beside the bound-based one (0: none; a diagnostic on the private data).")
@click.option("--resume", "resume_dir", default=None, help="Continue an interrupted run from its last checkpoint.")
@click.option("--noise-off", "noise_off", is_flag=True, default=None,
              help="Diagnostic, NOT private: the same pipeline (plan, clipping, steps) with every noise multiplier "
                   "0; recorded with ε = ∞ and the σ the target calibrated.")
@click.option("--noise-off-part", "noise_off_parts", multiple=True, metavar="PART",
              help="Diagnostic, NOT private: --noise-off for this private part only (repeatable; the parts: "
                   "bench privacy). Which part's noise costs what, one at a time.")
def run(method, dataset, eps, delta, preset, n_d, sets, config_file, seed, data_root, eval_split, members,
        evaluators, device, out, results, dry_run, probe_seconds, probe_steps, resume_dir, noise_off,
        noise_off_parts):
    """Train one method on one dataset at a target (ε, δ), sample, evaluate, record."""
    from . import runner

    settings = dict(epsilon=eps, delta=delta, preset=preset, n_d=n_d, sets=sets, config_file=config_file, seed=seed,
                    members=members, device=device, evaluators=evaluators, eval_split=eval_split, noise_off=noise_off,
                    noise_off_parts=noise_off_parts)
    try:
        if resume_dir:
            expected = None
            if any(v not in (None, ()) for k, v in settings.items() if k != "device") or method or dataset:
                # what was given is compared with the run's config; what was not given is the run's
                cfg = runner.resume_config(resume_dir)
                expected = build_config(
                    method or cfg.method, dataset or cfg.dataset,
                    epsilon=eps if eps is not None else (cfg.epsilon if math.isfinite(cfg.epsilon) else None),
                    delta=delta if delta is not None else cfg.delta, preset=preset or cfg.preset, n_d=n_d,
                    sets=sets, hparams=None if (config_file or method or dataset or preset) else cfg.hparams,
                    config_file=config_file, seed=seed if seed is not None else cfg.seed,
                    members=members if members is not None else cfg.members,
                    evaluators=evaluators if evaluators is not None else cfg.evaluators,
                    eval_split=eval_split or cfg.eval_split,
                    noise_off=noise_off if noise_off is not None else cfg.noise_off,
                    noise_off_parts=noise_off_parts or cfg.noise_off_parts)
            result = runner.resume(resume_dir, device=device, data_root=data_root, expected=expected)
        else:
            cfg = build_config(method, dataset, **settings)
            if dry_run:
                _dry_run(runner, cfg, data_root, probe_seconds, probe_steps)
                return
            result = runner.run(cfg, out=out, results=results, data_root=data_root)
    except Interrupted as e:
        run_dir = getattr(e, "run_dir", resume_dir)
        click.echo(f"interrupted: checkpoint written; resume with: bench run --resume {run_dir}", err=True)
        sys.exit(130)
    _print_result(result)


def _dry_run(runner, cfg, data_root, probe_seconds, probe_steps) -> None:
    from . import probe

    prepared = runner.prepare(cfg, data_root)
    # every caveat the run will record: the ledger's and the run's own (a paper's accounting, TF32)
    plan = runner.with_caveat(prepared.ledger.planned_report(), runner.run_caveat(prepared)).to_json()
    estimate = probe.estimate_runtime(prepared, probe_seconds) if probe_seconds > 0 else None
    gradients = probe.measure_gradients(cfg, data_root, probe_steps) if probe_steps > 0 else None
    click.echo(json.dumps({"config": cfg.to_json(), "privacy_plan": plan, "runtime_estimate": estimate,
                           **({"gradient_probe": gradients} if gradients else {})}, indent=2, default=str))


def _print_result(result: dict) -> None:
    from .privacy import fmt_eps  # opacus: not imported by `bench list`

    priv = result["privacy"]
    lines = [f"run_dir: {result['run_dir']}",
             f"epsilon: target {fmt_eps(priv['target']['epsilon'])}, spent {fmt_eps(float(priv['epsilon']['rdp']))} "
             f"(RDP), {fmt_eps(float(priv['epsilon']['prv']))} (PRV); delta {priv['target']['delta']:g}"]
    if priv.get("caveat"):
        lines.append(f"epsilon caveat: {priv['caveat']}")
    click.echo("\n".join(lines + _metric_lines(result)))


def _metric_lines(result: dict) -> list[str]:
    """``name: value`` per metric; an MIA AUC with its DeLong SE and the p-value of a leak
    (``protocol.<evaluator>.auc_uncertainty``): an AUC of 0.55 on 64 members is noise."""
    lines = []
    for k, v in result["metrics"].items():
        u = ((result.get("protocol") or {}).get(k) or {}).get("auc_uncertainty")
        extra = f" (± {u['se_delong']:.4f} DeLong SE, one-sided Mann–Whitney p = {u['p_value']:.2g})" if u else ""
        lines.append(f"{k}: {v:.4f}{extra}")
    return lines


# ----------------------------------------------------------------------- audit


@cli.command()
@_run_options
@click.option("--canaries", type=int, default=None,
              help="Canaries, each in the run with probability 1/2 [default: 500 images; 1,000 gradients per part "
                   "with --white-box].")
@click.option("--white-box", is_flag=True,
              help="Gradient canaries inside each private part's own noisy release (optimizer or sanitiser), "
                   "scored on the released sums: audits the privacy code, not an attack on the samples.")
@click.option("--confidence", type=float, default=0.95, help="Confidence of the lower bound.")
@click.option("--members", type=int, default=None,
              help="Train on N training images (plus the included canaries) instead of the whole split.")
@click.option("--eval", "evaluators", default="", help="Comma-separated evaluators of the run [default: none].")
@click.option("--device", default=None, help="auto | cpu | cuda | cuda:N [default: auto].")
@click.option("--out", default=None, help="Exact run directory [default: RESULTS/<run-id>].")
@click.option("--results", default=None, help="Root of run directories (else $DPGEN_RESULTS, else results/runs).")
def audit(method, dataset, eps, delta, preset, n_d, sets, config_file, seed, data_root, eval_split, canaries,
          white_box, confidence, members, evaluators, device, out, results):
    """Train one run with canaries and bound ε from below (one-run auditing); writes audit.json."""
    from . import audit_run as audit_
    from .audit_run import DEFAULT_CANARIES, DEFAULT_GRADIENT_CANARIES

    if not 0 < confidence < 1:
        raise UserError(f"--confidence must be in (0, 1), got {confidence:g}")
    if white_box:
        image, gradient = None, DEFAULT_GRADIENT_CANARIES if canaries is None else canaries
    else:
        image, gradient = DEFAULT_CANARIES if canaries is None else canaries, None
    cfg = build_config(method, dataset, epsilon=eps, delta=delta, preset=preset, n_d=n_d, sets=sets,
                       config_file=config_file, seed=seed, device=device, evaluators=evaluators, members=members,
                       eval_split=eval_split, canaries=image, gradient_canaries=gradient)
    result = audit_.run_audit(cfg, out=out, results=results, data_root=data_root, confidence=confidence)
    click.echo(f"run_dir: {result['run_dir']}\n{audit_.summary_line(result)}")


# ------------------------------------------------------------------------ eval


@cli.command("eval")
@click.argument("run_dir", type=click.Path(file_okay=False))
@click.option("--eval", "evaluators", default=None, help="Comma-separated evaluators [default: the run's].")
@click.option("--data-root", default=None, help="Root of local dataset files.")
def eval_(run_dir, evaluators, data_root):
    """Re-evaluate a finished run from its checkpoint (no training); merge into eval.json."""
    from . import runner

    names = tuple(e.strip() for e in evaluators.split(",") if e.strip()) if evaluators else None
    result = runner.reevaluate(run_dir, names, data_root)
    click.echo("\n".join(_metric_lines(result)))


# --------------------------------------------------------------------- privacy


@cli.command()
@_run_options
@click.option("--members", type=int, default=None, help="Plan for a run on N training images only (as bench run).")
@click.option("--probe", "probe_steps", type=click.IntRange(min=0), default=0, show_default=True,
              help="Run each private part's first N steps on the data and add its measured gradient norms and noise "
                   "to signal (a diagnostic on the private data, outside the guarantee; 0: the plan alone).")
def privacy(method, dataset, eps, delta, preset, n_d, sets, config_file, seed, data_root, eval_split, members,
            probe_steps):
    """Print the calibrated privacy plan (noise, steps, ε by RDP and PRV) without training;
    with --probe N, also each part's measured gradient norms from a short probe."""
    from . import runner
    from .privacy import fmt_eps

    cfg = build_config(method, dataset, epsilon=eps, delta=delta, preset=preset, n_d=n_d, sets=sets,
                       config_file=config_file, seed=seed, eval_split=eval_split, members=members)
    plan = runner.privacy_plan(cfg, data_root)
    if not plan.ledger.budget.private:
        click.echo(f"method {cfg.method} is not private (ε = ∞): it has no private parts to account")
        return
    rep = plan.ledger.planned_report()
    click.echo(f"method {cfg.method}, dataset {cfg.dataset} (N={plan.n_train}), preset {cfg.preset}")
    if plan.standard:
        click.echo(plan.standard)
    click.echo(f"target: epsilon {cfg.epsilon:g}, delta {cfg.delta:g}")
    measured = {}
    if probe_steps:
        from . import probe

        measured = probe.measure_gradients(cfg, data_root, probe_steps)["parts"]
    extra = " measured noise / signal | median ‖g‖ / C | clipped |" if probe_steps else ""
    click.echo("| part | mechanism | noise multiplier | sample rate | steps | ε (RDP, alone) | noise / signal |" + extra)
    click.echo("|---|---|---|---|---|---|---|" + "---|" * (3 if probe_steps else 0))
    g = lambda v, f=".3g": "n/a" if v is None else format(v, f)  # noqa: E731
    for p in rep.parts:
        m = measured.get(p.name, {})
        ratio = "n/a" if p.noise_to_signal is None else f"{p.noise_to_signal:.3g}"
        share = None if m.get("median_norm") is None else m["median_norm"] / m["clip_bound"]
        cells = (f" {g(m.get('noise_to_signal_measured'))} | {g(share)} | {g(m.get('clip_fraction'), '.0%')} |"
                 if probe_steps else "")
        click.echo(f"| {p.name} | {p.mechanism} | {p.noise_multiplier:.4f} | {p.sample_rate:.5f} | {p.steps} | "
                   f"{p.epsilon:.4f} | {ratio} |" + cells)
    if probe_steps:
        click.echo(f"measured: over each part's first {probe_steps} steps, on the private data without noise (a "
                   "diagnostic outside the guarantee): the noise's norm over the exact clipped sum's, and the "
                   "records' median norm against the clip bound C")
    if any(p.noise_to_signal is not None for p in rep.parts):
        click.echo("noise / signal: the noise's norm on one step's released average over the largest signal a "
                   "record gives it (σ·√d / B for DP-SGD; docs/accounting.md); far above 1, the steps are noise-bound")
    click.echo(f"composed epsilon: {rep.epsilon_rdp:.4f} (RDP, compared with the target), "
               f"{fmt_eps(rep.epsilon_prv, '.4f')} (PRV upper bound)")


# ------------------------------------------------------------------------ list


@cli.command("list")
@click.argument("what", type=click.Choice(["methods", "datasets", "evaluators", "presets", "settings"]))
@click.argument("method", required=False)
def list_(what, method):
    """List registered methods, datasets, evaluators or presets; `settings [METHOD]`: each
    setting of METHOD (of every method without it) as method, setting, type, range ("-": none
    declared) and default, the range as its Hparams declares it (dpgen_bench/settings.py)."""
    if method and what != "settings":
        raise UserError(f"bench list {what} takes no METHOD (bench list settings METHOD does)")
    if what == "settings":
        _list_settings(method)
        return
    reg = {"methods": registry.methods, "datasets": registry.datasets, "evaluators": registry.evaluators,
           "presets": registry.methods}[what]
    for name in reg.names():
        try:  # a plugin that cannot be loaded is named on stderr; the others are still listed
            obj = reg.get(name)
        except UserError as e:
            log.warning("%s", e)
            continue
        if what == "methods":
            click.echo(f"{name}\t{'private' if obj.private else 'non-private'}\t{_first_line(obj)}")
        elif what == "datasets":
            click.echo(f"{name}\t{_first_line(obj) or _dataset_summary(name, obj)}")
        elif what == "evaluators":
            ideal = getattr(obj, "ideal", None)
            direction = (f"{ideal:g} is ideal" if ideal is not None else
                         f"{'higher' if obj.higher_is_better else 'lower'} is better")
            click.echo(f"{name}\t{direction}\t{_first_line(obj)}")
        else:
            for preset in list(obj.presets) or [DEFAULTS_PRESET]:  # ``defaults``: every method has it
                note = f"\t{TEST_PRESET_NOTE}" if preset == TEST_PRESET else ""
                click.echo(f"{name}\t{preset}\t{', '.join(sorted(obj.presets.get(preset, ['*'])))}{note}")


def _list_settings(method: str | None) -> None:
    for name in [method] if method else registry.methods.names():
        try:
            cls = registry.methods.get(name)
        except UserError as e:
            if method:
                raise
            log.warning("%s", e)  # as for the other lists: the methods that load are still listed
            continue
        for row in settings.describe(cls.Hparams):
            click.echo("\t".join((name, *row)))


def _dataset_summary(name: str, loader) -> str:
    """For a dataset loader without a docstring: its name and sizes, from loading it once
    (a plugin's own description when it gives one)."""
    try:
        data = loader()
    except UserError as e:
        return f"{name} (no description; it cannot be loaded here: {e})"
    c, h, w = data.image_shape
    sizes = (f"{len(data.train)} train / {len(data.test)} test, {c}x{h}x{w}, {data.num_classes} classes")
    return f"{data.description} ({sizes})" if data.description else f"{name}: {sizes}"


def _first_line(obj) -> str:
    doc = (obj.__doc__ or "").strip()
    return doc.splitlines()[0] if doc else ""


# ---------------------------------------------------------------------- report

# bench report's layouts (dpgen_bench/report/table.py), named by what their rows and columns
# are; the first four were called a, b, c, d, which still work
LAYOUTS = ("eps-rows", "one-setting", "mia", "eps-columns", "tiers", "audit", "runs")
LAYOUT_LETTERS = {"a": "eps-rows", "b": "one-setting", "c": "mia", "d": "eps-columns"}


class AliasedChoice(click.Choice):
    """A choice among ``choices`` that also accepts ``aliases`` (older names), as typed; the
    help lists the choices only."""

    def __init__(self, choices, aliases: dict[str, str]):
        super().__init__(choices)
        self.aliases = aliases

    def convert(self, value, param, ctx):
        if value in self.aliases:
            return value
        return super().convert(value, param, ctx)



@cli.command()
@click.option("--results", default=None, help="Root of run directories (else $DPGEN_RESULTS, else results/runs).")
@click.option("--also", "also", multiple=True, metavar="DIR",
              help="Further roots of run directories reported together with --results (e.g. the records "
                   "committed under benchmarks/); repeatable.")
@click.option("--layout", type=AliasedChoice(LAYOUTS, LAYOUT_LETTERS), default="eps-rows",
              help="eps-rows: rows (ε, method), columns (dataset, metric); one-setting: method × metrics for one "
                   "(dataset, ε); mia: MIA AUC per attack and member count; eps-columns: method × (dataset, ε, "
                   "metric); tiers: method × preset (quick, long, paper) for one metric, beside the method's own "
                   "paper's number; audit: the accountant's ε beside bench audit's lower bounds; runs: one row per "
                   "run. The first four's old names a, b, c, d still work.")
@click.option("--metric", "metrics", default=None,
              help="Comma-separated metrics (layouts eps-rows, eps-columns; tiers: the first) [default: all].")
@click.option("--dataset", default=None, help="Dataset [default: one-setting, tiers: the first; the others: all].")
@click.option("--eps", type=float, default=None, help="Target ε (layouts one-setting, tiers) [default: all].")
@click.option("--format", "fmt", type=click.Choice(["markdown", "latex", "csv"]), default="markdown")
@click.option("--out", default=None, help="Write the table to this file instead of stdout.")
@click.option("--with-references", is_flag=True, help="Add the papers' published numbers as '(paper)' rows.")
@click.option("--figures", default=None, help="Also write figures (PNG and PDF) into this directory.")
@click.option("--require-commit", "require_commit", default=None, metavar="REV",
              help="Leave out the runs made by code without git commit REV (a fix made since).")
def report(results, also, layout, metrics, dataset, eps, fmt, out, with_references, figures, require_commit):
    """Comparison tables of the completed runs, in the papers' layouts."""
    import pandas as pd

    from .report import table as T

    typed, layout = layout, LAYOUT_LETTERS.get(layout, layout)  # a letter: the layout's first name
    roots = [store.results_root(results)] + [Path(a) for a in also]
    if also and results is None and not roots[0].exists():  # a clean checkout reading committed records only
        roots = roots[1:]
    for root in roots:
        _check_results_root(root)
    where = ", ".join(map(str, roots))
    if out:
        _check_writable(Path(out).parent, f"--out {out}")
        if Path(out).is_dir():
            raise UserError(f"--out {out} is a directory; give a file name")
    if figures:
        _check_writable(Path(figures), f"--figures {figures}")
    required = store.resolve_commit(require_commit) if require_commit else None
    long, skipped = T.collect(*roots)
    if skipped:
        log.warning("skipped %d incomplete, failed or damaged run(s) under %s", skipped, where)
    if required and not long.empty:
        fresh = {d: store.made_after(Path(d), required) for d in long["run_dir"].unique()}
        stale = sum(not ok for ok in fresh.values())
        if stale:
            log.warning("left out %d run(s) made by code without %s (bench sweep --require-commit runs them "
                        "again)", stale, require_commit)
        long = long[long["run_dir"].map(fresh)]
    if long.empty:
        raise UserError(f"no completed runs under {where}" + (f" made by code with {require_commit}" if required else ""))
    full = long
    if with_references:
        from .report.references import load_references

        full = pd.concat([long, load_references()], ignore_index=True)
    if layout == "runs":
        tab = T.runs_table(long)
    else:
        agg = T.aggregate(full)
        chosen = [m.strip() for m in metrics.split(",") if m.strip()] if metrics else None
        if chosen:
            unknown = set(chosen) - set(agg["metric"])
            if unknown:
                raise UserError(f"--metric: no runs recorded {sorted(unknown)}")
        ours_datasets = set(long["dataset"])
        shown = agg[agg["dataset"].isin(ours_datasets) if not dataset else agg["dataset"] == dataset]
        if layout == "eps-rows":
            tab = T.layout_a(shown, chosen)
        elif layout == "eps-columns":
            tab = T.layout_d(shown, chosen)
        elif layout == "one-setting":
            dataset = dataset or sorted(long["dataset"].unique())[0]
            tab = T.layout_b(agg, dataset, eps)
        elif layout == "tiers":
            dataset = dataset or sorted(long["dataset"].unique())[0]
            tab = T.layout_tiers(full, dataset, eps, chosen[0] if chosen else "gen2real_cnn")
        elif layout == "audit":
            tab = T.layout_audit(agg, dataset)
        else:
            tab = T.layout_c(agg, dataset)
    if not tab.rows:
        raise UserError(_nothing_to_report(typed, long, dataset, eps))
    text = T.RENDERERS[fmt](tab)
    if fmt == "csv":  # CSV has no room for notes: the ‡ cells are explained on stderr
        for note in tab.notes:
            log.warning("%s", note)
    if out:
        with store.atomic_open(Path(out), "w") as f:
            f.write(text)
        log.info("wrote %s", out)
    else:
        click.echo(text, nl=False)
    if figures:
        from .report.figures import all_figures

        paths = all_figures(full, T.aggregate(full), Path(figures))
        log.info("wrote %d figure files to %s", len(paths), figures)


def _check_results_root(root: Path) -> None:
    """The results root exists and can be listed; else one line that says where runs go."""
    if not root.is_dir():
        elsewhere = _run_roots_beside(root)
        hint = f"; runs were found under {', '.join(elsewhere)} (bench report --results DIR)" if elsewhere else ""
        raise UserError(f"no results directory at {root} (bench run writes runs to --results DIR, else "
                        f"$DPGEN_RESULTS, else results/runs){hint}")
    try:
        next(iter(root.iterdir()), None)
    except OSError as e:
        raise UserError(f"cannot read the results directory {root}: {e.strerror or e}") from None


def _run_roots_beside(root: Path, limit: int = 3) -> list[str]:
    """Directories next to ``root`` that hold run directories (a config.json one level down)."""
    found = []
    try:
        for d in sorted(p for p in root.parent.iterdir() if p.is_dir() and p != root):
            if any((run / "config.json").is_file() for run in d.iterdir() if run.is_dir()):
                found.append(str(d))
            if len(found) == limit:
                break
    except OSError:
        pass
    return found


def _check_writable(directory: Path, what: str) -> None:
    try:
        store.probe_writable_dir(directory)
    except OSError as e:
        raise UserError(f"{what}: cannot write into {directory}: {e.strerror or e}") from None


def _nothing_to_report(layout: str, long, dataset: str | None, eps: float | None) -> str:
    """Why ``layout`` (as typed: a name, or its letter) has no rows."""
    have = ", ".join(sorted(long["dataset"].unique()))
    kind = LAYOUT_LETTERS.get(layout, layout)
    if kind == "mia":
        where = f" on {dataset}" if dataset else ""
        return (f"layout {layout} shows membership inference, and no run{where} has an mia_auc_* metric: run with "
                "--members N --eval mia_auc_full_black_box (or another mia_auc_* evaluator)")
    if kind == "audit":
        return "layout audit shows bench audit's lower bounds, and no run here has an audit.json: run bench audit"
    if kind in ("one-setting", "tiers"):
        at = f" at ε = {eps:g}" if eps is not None else ""
        return f"layout {layout}: no completed run on {dataset}{at} (datasets with runs: {have})"
    if dataset:
        return f"no completed run on {dataset} (datasets with runs: {have})"
    return "nothing to report for this selection"


# ----------------------------------------------------------------------- sweep


@cli.command()
@click.argument("grid_file", required=False)
@click.option("--method", "-m", default=None, help="Comma-separated methods, or all (every method bench list shows).")
@click.option("--dataset", "-d", default=None, help="Comma-separated datasets [default: digits].")
@click.option("--eps", default=None, help="Comma-separated target ε (ignored for non-private methods).")
@click.option("--seeds", default=None, help="Comma-separated seeds [default: 0].")
@click.option("--preset", default=None,
              help="Preset [default: quick where the method has one for the dataset, else paper].")
@click.option("--members", default=None, help="Comma-separated member-set sizes (membership inference).")
@click.option("--eval", "evaluators", default=None, help="Comma-separated evaluators [default: each preset's].")
@click.option("--eval-split", "eval_split", type=click.Choice(EVAL_SPLITS), default=None,
              help="Evaluate every cell on the test split or on the validation part [default: test].")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="Override a method setting in every cell.")
@click.option("--results", default=None, help="Root of run directories (else $DPGEN_RESULTS, else results/runs).")
@click.option("--engine", type=click.Choice(["local", "ray"]), default="local")
@click.option("--jobs", type=int, default=1, help="Local worker processes.")
@click.option("--address", default=None, help="Ray cluster address [default: start a local instance].")
@click.option("--data-root", default=None, help="Root of local dataset files.")
@click.option("--no-report", is_flag=True, help="Do not print the report at the end.")
@click.option("--require-commit", "require_commit", default=None, metavar="REV",
              help="Run again every complete cell whose record was made by code without git commit REV "
                   "(a fix made since); the old run directory is kept as .stale-….")
def sweep(grid_file, method, dataset, eps, seeds, preset, members, evaluators, eval_split, sets, results, engine, jobs,
          address, data_root, no_report, require_commit):
    """Run a grid of runs, skipping cells already complete, then print the report."""
    from .sweep import expand, run_sweep

    grid = load_config_file(grid_file) if grid_file else {}
    flags = {"method": method, "dataset": dataset, "eps": eps, "seeds": seeds, "preset": preset,
             "members": members, "eval": evaluators, "eval_split": eval_split}
    grid.update({k: v for k, v in flags.items() if v is not None})
    if sets:
        grid["set"] = {**(grid.get("set") or {}), **parse_set(sets)}
    if jobs < 1:
        raise UserError("--jobs must be ≥ 1")
    root = store.results_root(results)
    cells = expand(grid)
    required = store.resolve_commit(require_commit) if require_commit else None
    try:
        counts = run_sweep(cells, root, engine=engine, jobs=jobs, address=address, data_root=data_root,
                           require_commit=required)
    except Interrupted:
        click.echo("interrupted: checkpoint written; the same bench sweep command resumes the stopped cell "
                   "and runs the rest", err=True)
        sys.exit(130)
    log.info("sweep finished: %d ran, %d skipped (complete), %d failed%s", counts["ran"], counts["done"],
             counts["failed"], f" ({counts['stale']} of the runs replaced stale records)" if required else "")
    if not no_report:
        from .report import table as T

        long, _ = T.collect(root)
        names = {c.run_name for c in cells}
        long = long[long["run_id"].isin(names)]
        if not long.empty:
            click.echo(T.render_markdown(T.layout_a(T.aggregate(long))), nl=False)
    if counts["failed"]:
        sys.exit(1)


# ---------------------------------------------------------------------- claims


@cli.command()
@click.argument("claims_file", required=False)
@click.option("--run", "run_missing", is_flag=True, help="Run the cells without a complete record first.")
@click.option("--jobs", type=int, default=2, help="Local worker processes for --run.")
@click.option("--results", default=None,
              help="Root of the claims' run directories [default: the file's `results`, e.g. results/claims].")
@click.option("--also", "also", multiple=True, metavar="DIR",
              help="Further roots of committed records that count as runs of their cells, beside the file's "
                   "`also_results`; repeatable.")
@click.option("--out", default=None, help="The file to write [default: CLAIMS.md beside CLAIMS_FILE].")
@click.option("--dataset", "datasets", default=None,
              help="Comma-separated datasets to run and render [default: every dataset of the file]; the other "
                   "datasets' blocks in --out are kept as they are.")
@click.option("--only", default=None,
              help="Comma-separated claim ids: run and re-render those claims' sections only; the other sections "
                   "of each block are kept as they are.")
@click.option("--require-commit", "require_commit", default=None, metavar="REV",
              help="Records made by code without git commit REV (a fix made since) count as missing: --run runs "
                   "them again (the old directory kept as .stale-…), a render leaves them out.")
@click.option("--figures", default=None, metavar="DIR",
              help="Also draw each rendered claim's figures from its own records, in DIR/<claim>-<dataset>/.")
def claims(claims_file, run_missing, jobs, results, also, out, datasets, only, require_commit, figures):
    """Check papers' claims against run records.

    CLAIMS_FILE (default benchmarks/claims.yaml) holds the claims as data: each with its arms
    (bench sweep grids) and expectations. Writes each claim's numbers and verdict per dataset
    (CLAIMS.md); the file's paths are relative to the working directory."""
    from .claims import DEFAULT_FILE, run_claims

    run_claims(claims_file or DEFAULT_FILE, results=results, also=also, out=out, run=run_missing, jobs=jobs,
               require_commit=require_commit, datasets=datasets, only=only, figures=figures)


def main() -> None:  # console-script entry point
    cli()


if __name__ == "__main__":
    main()
