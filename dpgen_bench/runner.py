"""One run: validate → seed → data → plan privacy → fit → check ε → sample → evaluate →
record. Everything a user can get wrong is checked before the run directory exists.

Public: ``prepare`` (validate and calibrate, no training), ``run`` (a new run),
``resume`` (an interrupted one), ``reevaluate`` (a finished one). Beside it, not the run:
``probe.estimate_runtime`` (``--dry-run``'s timing), ``context.stop_on_signals`` (SIGINT /
SIGTERM during fit), ``grid.save_grid`` (grid.png).
``dpgen_bench.run`` / ``dpgen_bench.evaluate`` are the notebook entry points over them."""

from __future__ import annotations

import dataclasses
import logging
import math
import random
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import torch

from . import numerics, registry, store
from .grid import save_grid
from .api import VAL_FRACTION, Budget, DataInfo, EvalInput, ImageData, Method, PrivacyPart, PrivacyReport
from .config import RunConfig, stream_key
from .context import CHECKPOINT_FORMAT, RESUME_FILE, TrainingContext, stop_on_signals
from .data import load_dataset
from .data.files import MissingDataFiles
from .data.files import data_root as data_root_of
from .data.standard import standard_split
from .errors import BudgetTooLow, Interrupted, PrivacyViolation, UserError
from .privacy.accounting import reachability_only
from .privacy.ledger import PrivacyLedger
from .settings import as_recorded

log = logging.getLogger("dpgen_bench")


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"--device {name}: CUDA is not available on this machine (use --device auto or cpu)")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise UserError(f"--device: unknown device '{name}' (auto, cpu, cuda, cuda:N)") from None
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise UserError(f"--device {name}: this machine has {torch.cuda.device_count()} CUDA device(s) "
                        f"(cuda:0 to cuda:{torch.cuda.device_count() - 1})")
    if dev.type not in ("cpu", "cuda"):
        raise UserError(f"--device {name}: only cpu and cuda are supported (auto, cpu, cuda, cuda:N)")
    return dev


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def sample_generator(seed: int) -> torch.Generator:
    """The CPU generator a run's samples are drawn from (its own stream, apart from training's)."""
    return torch.Generator().manual_seed(seed + 12345)


# ------------------------------------------------------------------- preparation


@dataclasses.dataclass
class Prepared:
    """A validated run: its method (built, seeded), data, budget and privacy ledger (the
    calibrated plan, nothing spent yet)."""

    config: RunConfig
    method: Method
    data: ImageData
    ledger: PrivacyLedger
    device: torch.device
    data_root: str | None = None

    @property
    def budget(self) -> Budget:
        return self.ledger.budget


def budget_of(config: RunConfig, method_cls: type) -> Budget:
    """The run's budget; the one place that checks ε and δ against the method's kind."""
    epsilon, delta = config.epsilon, config.delta
    if not (0 < delta < 1):
        raise UserError(f"--delta must be in (0, 1), got {delta:g}")
    if math.isnan(epsilon) or epsilon <= 0:
        raise UserError(f"--eps must be > 0, got {epsilon:g}")
    if method_cls.private and not math.isfinite(epsilon):
        raise UserError(f"method '{method_cls.name}' is private: --eps must be finite")
    if not method_cls.private and math.isfinite(epsilon):
        raise UserError(f"method '{method_cls.name}' is not private (ε = ∞): drop --eps")
    if config.any_noise_off and not method_cls.private:
        raise UserError(f"--noise-off: method '{method_cls.name}' is not private, it has no noise to switch off")
    return Budget(epsilon=epsilon, delta=delta)


def check_config(config: RunConfig) -> tuple[type, Budget]:
    """The method class and budget of ``config``, after every check that needs no data."""
    method_cls = registry.methods.get(config.method)
    budget = budget_of(config, method_cls)
    for name in config.evaluators:
        evaluator = registry.evaluators.get(name)
        if getattr(evaluator, "needs_members", False) and config.members is None:
            raise UserError(f"--eval {name} needs --members N (membership inference trains on N training images "
                            "and attacks them; the DPAF appendix uses 64 and 128)")
    if config.samples_per_class < 1:
        raise UserError("samples_per_class must be ≥ 1")
    return method_cls, budget


def check_method_evaluators(config: RunConfig, method: Method) -> None:
    """Evaluators that need something of the built method (a latent input)."""
    for name in config.evaluators:
        if getattr(registry.evaluators.get(name), "needs_latent", False) and method.latent_dim is None:
            raise UserError(f"--eval {name} needs a method with a latent input (generate(z, labels)); "
                            f"'{config.method}' has none (mia_auc_full_black_box needs only its samples)")


def check_members(config: RunConfig, dataset: str, n_train: int, n_test: int) -> None:
    if config.members is not None and not (1 <= config.members <= min(n_train, n_test)):
        raise UserError(f"--members must be between 1 and {min(n_train, n_test)} for '{dataset}' (train {n_train}, "
                        f"test {n_test}), got {config.members}")


def _warn_delta(budget: Budget, n_train: int) -> None:
    if budget.private and budget.delta >= 1 / n_train:
        log.warning("δ=%g ≥ 1/N=%g: the guarantee allows leaking a whole record; use δ < 1/N", budget.delta,
                    1 / n_train)


def prepare(config: RunConfig, data_root: str | None = None) -> Prepared:
    """Validate everything and calibrate the privacy plan, without training."""
    method_cls, budget = check_config(config)
    device = resolve_device(config.device)
    data, n_plan = cell_data(config, data_root)
    info = DataInfo(data.name, data.image_shape, data.num_classes, n_plan)
    method, ledger = _calibrate(config, method_cls, budget, info)
    if config.any_noise_off:
        ledger.switch_noise_off(config.noise_off_parts or None)
    return Prepared(config, method, data, ledger, device, data_root)


def cell_data(config: RunConfig, data_root: str | None = None) -> tuple[ImageData, int]:
    """The data a run of ``config`` trains and is evaluated on (its members and canaries
    drawn in), and the N its privacy plan is calibrated for."""
    data = load_dataset(config.dataset, config.eval_split, root=data_root)
    check_members(config, data.name, len(data.train), len(data.test))
    full_train = data.train  # canary images come from the whole training split, --members or not
    if config.canaries and config.canaries > len(full_train):
        raise UserError(f"--canaries {config.canaries}: each canary needs its own image of the training split, "
                        f"which has {len(full_train)}; use at most {len(full_train)}")
    if config.members is not None:
        data = data.with_members(config.members, seed=config.seed)
    n_plan = len(data.train)
    if config.canaries:
        data = data.with_canaries(config.canaries, seed=config.seed, pool=full_train)
        # the plan must not depend on which canaries were drawn in (the one-run theorem needs a
        # mechanism fixed before the draw): N = N0 + m, every canary counted; each record is
        # Poisson-sampled at the planned rate, so the accounting is exact for the run's data
        n_plan += config.canaries
    return data, n_plan


def evaluators_to_prepare(names) -> tuple[str, ...]:
    """Those of the evaluators ``names`` that have real-data work to prepare (``has_prepare``)."""
    return tuple(n for n in names if registry.evaluators.get(n).has_prepare)


def prepare_evaluators(config: RunConfig, data_root: str | None = None) -> dict[str, Any]:
    """Run every ``Evaluator.prepare`` of ``config.evaluators`` on the data a run of
    ``config`` would be evaluated on (``bench sweep`` calls it once per dataset, split,
    seed and device, ahead of the cells). Returns ``{evaluator: protocol}``."""
    names = evaluators_to_prepare(config.evaluators)
    if not names:
        return {}
    data, _ = cell_data(config, data_root)
    device = resolve_device(config.device)
    with numerics.exact_float32(device):  # as run_evaluators: the prepared classifier is the one a cell trains
        return {n: registry.evaluators.get(n)().prepare(data, seed=config.seed, device=device) for n in names}


def _calibrate(config: RunConfig, method_cls: type, budget: Budget, info: DataInfo) -> tuple[Method, PrivacyLedger]:
    """The method built for ``info`` and its calibrated plan (what needs N, not the data)."""
    _warn_delta(budget, info.n_train)
    method = build_method(config, method_cls, info)
    check_method_evaluators(config, method)
    return method, plan_ledger(config, method, budget)


def build_method(config: RunConfig, method_cls: type, info: DataInfo) -> Method:
    seed_everything(config.seed)  # methods build (and initialise) their networks here: same seed, same run
    return method_cls(method_settings(method_cls, config.hparams), info)


def method_settings(method_cls: type, hparams: dict[str, Any]) -> Any:
    """A run's settings as the method's ``Hparams``. Their declared ranges were checked when the
    config was built (``config.build_config``), not here: a record made before a range was
    declared still loads (``bench eval``, ``--resume``)."""
    with as_recorded():
        return method_cls.Hparams(**hparams)


@dataclasses.dataclass
class PlanOnly:
    """What ``bench privacy`` prints: the calibrated plan and the N it was calibrated for;
    ``standard`` says where N came from when the dataset's files were not there."""

    ledger: PrivacyLedger
    n_train: int
    standard: str | None = None


def privacy_plan(config: RunConfig, data_root: str | None = None) -> PlanOnly:
    """The calibrated plan of ``config``. A method's plan needs only N (and the image shape
    and classes): without the files of a named dataset, its standard split gives them."""
    try:
        p = prepare(config, data_root)
        return PlanOnly(p.ledger, len(p.data.train))
    except MissingDataFiles:
        split = standard_split(config.dataset, data_root)
        if split is None:
            raise
    method_cls, budget = check_config(config)
    n_train, n_test = split.n_train, split.n_test
    if config.eval_split == "val":  # ImageData.with_validation: sklearn's test part is ceil(fraction · N)
        n_test = math.ceil(VAL_FRACTION * n_train)
        n_train -= n_test
    check_members(config, config.dataset, n_train, n_test)
    if config.members is not None:
        n_train = config.members
    _, ledger = _calibrate(config, method_cls, budget,
                           DataInfo(config.dataset, split.image_shape, split.num_classes, n_train))
    note = (f"N={n_train} from the standard split ({split.source}); the dataset's files are not under "
            f"{data_root_of(data_root)}, and the plan does not need them")
    return PlanOnly(ledger, n_train, note)


def _too_low(e: Exception) -> bool:
    """The calibration's "no noise is enough" (ours, or Opacus' own from a plugin that calls it)."""
    return isinstance(e, BudgetTooLow) or (isinstance(e, ValueError) and "budget is too low" in str(e).lower())


def annotate_noise(method: Method, parts: list[PrivacyPart]) -> list[PrivacyPart]:
    """The parts with the method's noise-to-signal ratio of each (``PrivacyPart.noise_to_signal``)."""
    out = []
    for part in parts:
        ratio = method.noise_to_signal(part) if part.steps > 0 else None
        out.append(dataclasses.replace(part, noise_to_signal=None if ratio is None else float(ratio)))
    return out


def plan_ledger(config: RunConfig, method: Method, budget: Budget) -> PrivacyLedger:
    """The method's calibrated plan in a ledger. A plan refused at this ε (no noise is large
    enough, a fixed noise allows no step, a split leaves a part nothing) is one line that
    names the smallest ε that works for this method, preset and data, when there is one."""
    try:
        ledger = PrivacyLedger(budget, annotate_noise(method, method.plan(budget)))
    except (UserError, ValueError) as e:
        if not (isinstance(e, UserError) or _too_low(e)) or not budget.private:
            raise
        smallest = smallest_feasible_epsilon(method, budget)
        if smallest is None and not _too_low(e):
            raise  # not a matter of ε
        where = (f"{config.method} (preset {config.preset}, dataset {config.dataset}, N={method.info.n_train}, "
                 f"δ={budget.delta:g})")
        why = "no noise multiplier is large enough" if _too_low(e) else str(e)
        fix = (f"the smallest ε that works is {smallest:g}" if smallest is not None else
               f"no ε up to {FEASIBLE_EPS_MAX:g} works")
        raise UserError(f"--eps {budget.epsilon:g} is infeasible for {where}: {why}; {fix}") from None
    _warn_full_batches(config, ledger, method.info.n_train)
    return ledger


FEASIBLE_EPS_MAX = 1e4


def smallest_feasible_epsilon(method: Method, budget: Budget, rel: float = 5e-3) -> float | None:
    """The smallest ε (3 significant digits, rounded up) whose plan the method calibrates at
    ``budget.delta``: searched upwards from ``budget.epsilon`` (infeasible) by factors of 4,
    then bisected on log ε to ``rel`` (feasibility is monotone in ε). Calibrations only
    check reachability (``reachability_only``: one memoised composition per part, the same
    answer as a full calibration), so the search costs about a dozen cheap plans."""

    def feasible(eps: float) -> bool:
        b = Budget(eps, budget.delta)
        try:
            PrivacyLedger(b, method.plan(b))
        except (UserError, ValueError, PrivacyViolation):  # BudgetTooLow, "allows no step", over the target
            return False
        return True

    with reachability_only():
        lo = hi = budget.epsilon
        while True:
            lo, hi = hi, hi * 4
            if hi > FEASIBLE_EPS_MAX:
                return None
            if feasible(hi):
                break
        while hi / lo > 1 + rel:
            mid = math.sqrt(lo * hi)
            if feasible(mid):
                hi = mid
            else:
                lo = mid
    scale = 10.0 ** (math.floor(math.log10(hi)) - 2)
    return float(f"{math.ceil(hi / scale) * scale:.3g}")


def _warn_full_batches(config: RunConfig, ledger: PrivacyLedger, n_train: int) -> None:
    """A batch as large as the training set: legal, but the sample rate becomes 1 and
    subsampling no longer amplifies privacy; almost surely a mistake."""
    full = [p.name for p in ledger.planned.values() if p.sample_rate >= 1 and p.steps > 0]
    big = [f"{k}={v}" for k, v in config.hparams.items()
           if (k == "batch_size" or k.endswith("_batch_size")) and type(v) is int and v >= n_train]
    if full and big:
        log.warning("%s ≥ N=%d training images: part%s %s sample%s at rate 1 (the whole training set every step, "
                    "no amplification by subsampling)", ", ".join(big), n_train, "s" if len(full) > 1 else "",
                    ", ".join(f"'{n}'" for n in full), "" if len(full) > 1 else "s")


def prepare_out_dir(config: RunConfig, out: str | None, results: str | None) -> Path:
    if out:
        run_dir = Path(out)
        if run_dir.exists() and not run_dir.is_dir():
            raise UserError(f"--out {run_dir} exists and is not a directory")
        if run_dir.exists() and any(run_dir.iterdir()):
            raise UserError(f"--out {run_dir} exists and is not empty")
        parent = run_dir.parent
    else:
        parent = store.results_root(results)
        run_dir = parent / store.new_run_id(config.method, config.dataset, config.epsilon, config.seed)
    try:
        store.probe_writable_dir(run_dir)  # leaves nothing behind when it fails
    except OSError as e:
        raise UserError(f"cannot write the run directory {run_dir}: {e.strerror or e}") from None
    return run_dir


# --------------------------------------------------------------------------- run


def load_resume(run_dir: Path) -> dict:
    path = run_dir / RESUME_FILE
    try:
        state = torch.load(path, weights_only=True, map_location="cpu")
    except FileNotFoundError:
        raise UserError(f"{run_dir} has no checkpoint to resume from ({RESUME_FILE})") from None
    except Exception as e:  # noqa: BLE001 - truncated or corrupt: one clear line
        raise UserError(f"cannot read the checkpoint {path}: {type(e).__name__}: {e}") from None
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
        raise UserError(f"cannot resume from {path}: it was written by another version of dpgen_bench "
                        f"(checkpoint format {state.get('format', 1) if isinstance(state, dict) else '?'}, this "
                        f"version reads {CHECKPOINT_FORMAT}); start the run again")
    return state


def recorded_config(run_dir: Path) -> RunConfig:
    """The configuration a run directory's ``config.json`` records (its ``run_id`` dropped)."""
    raw = store.read_json(Path(run_dir) / "config.json")
    raw.pop("run_id", None)
    return RunConfig.from_json(raw)


def resume_config(run_dir: Path) -> RunConfig:
    """The config of an interrupted run, refusing finished or foreign directories."""
    run_dir = Path(run_dir)
    if not (run_dir / "config.json").is_file():
        raise UserError(f"--resume {run_dir}: not a run directory (no config.json)")
    if store.is_complete(run_dir):
        raise UserError(f"--resume {run_dir}: the run has already finished")
    return recorded_config(run_dir)


def tf32_for(p: Prepared) -> bool:
    """Whether the run's training may use TF32 (``DPGEN_ALLOW_TF32=1`` on CUDA)."""
    return numerics.tf32_allowed() and p.device.type == "cuda"


def run_caveat(p: Prepared) -> str | None:
    """The ε caveat the run of ``p`` adds to its ledger's own in privacy.json: the method's
    (``Method.accounting_caveat``: a paper's own accounting) and TF32's (``numerics.TF32_CAVEAT``);
    None when its ε is a DP guarantee. ``bench run --dry-run`` shows it in the plan."""
    if not p.budget.private:
        return None
    parts = (p.method.accounting_caveat(), numerics.TF32_CAVEAT if tf32_for(p) else None)
    return "; ".join(filter(None, parts)) or None


def with_caveat(report: PrivacyReport, caveat: str | None) -> PrivacyReport:
    """``report`` with ``caveat`` (``run_caveat``) joined to its own."""
    if not caveat:
        return report
    return dataclasses.replace(report, caveat="; ".join(filter(None, (report.caveat, caveat))))


def execute(p: Prepared, run_dir: Path, resume: bool = False, audit=None) -> dict[str, Any]:
    """Train, record privacy, sample, evaluate; ``audit``: a ``privacy.canaries.GradientAudit``
    that places its canaries in every part the method announces (``bench audit --white-box``)."""
    cfg = p.config
    run_dir.mkdir(parents=True, exist_ok=True)
    resume_state = load_resume(run_dir) if resume else None
    saved_on = resume_state.get("device", "cpu") if resume_state else None  # older checkpoints: CPU only
    if saved_on is not None and saved_on != p.device.type:
        # random-generator states (and float reductions) are device-specific: a resumed run
        # would be neither bit-exact nor loadable, so refuse instead of crashing in set_state
        raise UserError(f"--resume {run_dir}: the run was checkpointed on {saved_on}, this process would "
                        f"continue on {p.device.type}; resume with --device {saved_on}")
    if not resume:
        store.write_json(run_dir / "config.json", {"run_id": run_dir.name, **cfg.to_json()})
        store.write_json(run_dir / "env.json", store.environment(str(p.device)))
    else:
        (run_dir / "failed.json").unlink(missing_ok=True)
        log.info("resuming %s from its checkpoint (%s)", run_dir.name, resume_state["ledger"])
    if p.data.member_indices is not None:
        with store.atomic_open(run_dir / "membership.npz") as f:
            np.savez(f, member_indices=p.data.member_indices, nonmember_indices=p.data.nonmember_indices)
    if p.data.canaries is not None:
        with store.atomic_open(run_dir / "canaries.npz") as f:
            np.savez(f, included=p.data.canary_included, labels=p.data.canaries.labels.cpu().numpy())

    allow_tf32 = tf32_for(p)
    caveat = run_caveat(p)
    if caveat:  # said before training, not only in the record at the end
        log.warning("ε caveat: %s", caveat)
    if p.ledger.noise_off:
        log.warning("--noise-off: %s noise multiplier is 0 (the σ of ε = %g are recorded); this run is NOT "
                    "private and its ε is ∞", ", ".join(sorted(p.ledger.quiet_parts)) + "'s" if p.ledger.partial
                    else "every", p.budget.epsilon)
    phase, t0, timings = "fit", time.time(), {}
    if p.device.type == "cuda":  # the fit's own peak, for protocol.throughput
        torch.cuda.reset_peak_memory_stats(p.device)
    try:
        seed_everything(cfg.seed)
        ctx = TrainingContext(p.device, cfg.seed, p.ledger, run_dir, resume_state, audit=audit,
                              stream_key=stream_key(cfg))
        try:
            with stop_on_signals(ctx), numerics.exact_float32(p.device, allow_tf32=allow_tf32):
                p.method.fit(p.data.train, p.budget, ctx)
        finally:
            ctx.close()
        if resume_state and not ctx.restored:
            raise RuntimeError(f"method '{cfg.method}' resumed without calling ctx.restore(): its training state "
                               "and generators were not restored")
        timings["fit"] = time.time() - t0
        peak_gib = torch.cuda.max_memory_allocated(p.device) / 2**30 if p.device.type == "cuda" else None
        report = p.ledger.report()  # the runner's own count, not the method's claim
        check_privacy(report)
        measured = ctx.telemetry.summary()  # measured gradient norms: a diagnostic beside the accounting
        if measured:
            report = dataclasses.replace(report, telemetry=measured)
        report = with_caveat(report, caveat)
        store.write_json(run_dir / "privacy.json", report.to_json())
        with store.atomic_open(run_dir / "checkpoint.pt") as f:
            torch.save(p.method.state_dict(), f)

        phase, t1 = "sample", time.time()
        log.info("sampling %d images", p.data.num_classes * cfg.samples_per_class)
        images, labels = draw_samples(cfg, p.data.num_classes, p.method, p.device, allow_tf32)
        with store.atomic_open(run_dir / "samples.npz") as f:
            np.savez_compressed(f, images=images.numpy(), labels=labels.numpy().astype(np.int64))
        save_grid(images, labels, p.data.class_names, run_dir / "grid.png")
        timings["sample"] = time.time() - t1

        phase = "evaluate"
        result = run_evaluators(cfg, p.data, p.method, p.device, images, labels if p.method.conditional else None,
                                p.data_root)
        result["protocol"]["timings"] = {**timings, **result["protocol"].get("timings", {})}
        done_before = resume_state["ledger"] if resume_state else {}
        steps = {part.name: part.steps - int(done_before.get(part.name, 0)) for part in report.parts}
        result["protocol"]["throughput"] = {  # of this process's fit (a resumed run: of the steps after resuming)
            "device": str(p.device), "private_steps": steps,
            "private_steps_per_second": sum(steps.values()) / timings["fit"] if timings["fit"] > 0 else None,
            "peak_gpu_memory_gib": peak_gib,  # torch's allocator during the fit; null on the CPU
            "tf32": allow_tf32,  # numerics.exact_float32: off unless DPGEN_ALLOW_TF32=1
        }
        store.write_json(run_dir / store.COMPLETE_MARKER, result)  # last: marks the run complete
        # resume.pt is for an unfinished run only (--resume refuses a finished one), and it
        # holds what is never released: state trained without noise (GS-WGAN's and DPAC's
        # discriminators), every generator of randomness, the noise's included. A finished run
        # keeps only what may be shared (checkpoint.pt: the released generator).
        (run_dir / RESUME_FILE).unlink(missing_ok=True)
        return {"privacy": report.to_json(), **result}
    except Interrupted as e:
        e.run_dir = run_dir
        raise
    except BaseException as e:
        store.write_json(run_dir / "failed.json", {
            "phase": phase, "error": f"{type(e).__name__}: {e}", "seconds": time.time() - t0,
            "traceback": traceback.format_exc(),
        })
        raise


def run(config: RunConfig, *, out: str | None = None, results: str | None = None,
        data_root: str | None = None) -> dict[str, Any]:
    """Train, sample, evaluate and record one new run; the record (with ``run_dir``)."""
    p = prepare(config, data_root)
    run_dir = prepare_out_dir(config, out, results)
    _announce(p, run_dir)
    return {"run_dir": str(run_dir), **execute(p, run_dir)}


def _announce(p: Prepared, run_dir: Path) -> None:
    c = p.config
    log.info("run %s: %s on %s, ε=%s, δ=%g, preset %s, device %s", run_dir.name, c.method, c.dataset, c.epsilon,
             c.delta, c.preset, p.device)


def resume(run_dir: str | Path, *, device: str | None = None, data_root: str | None = None,
           expected: RunConfig | None = None) -> dict[str, Any]:
    """Continue an interrupted run from its checkpoint. ``device`` is the one setting a
    resume may change; ``expected`` (the settings a caller gave) must equal the run's."""
    run_dir = Path(run_dir)
    cfg = resume_config(run_dir)
    if expected is not None:
        diff = [k for k, v in expected.to_json().items() if k != "device" and v != cfg.to_json()[k]]
        if diff:
            raise UserError(f"--resume {run_dir}: the given settings differ from the run's config in "
                            f"{', '.join(diff)}")
    if cfg.gradient_canaries:
        raise UserError(f"--resume {run_dir}: a white-box audit run cannot be resumed (its canaries' scores are "
                        "not in the checkpoint); run the audit again")
    if device:
        cfg = dataclasses.replace(cfg, device=device)
    p = prepare(cfg, data_root)
    _announce(p, run_dir)
    return {"run_dir": str(run_dir), **execute(p, run_dir, resume=True)}


def draw_samples(config: RunConfig, num_classes: int, method: Method, device: torch.device,
                 allow_tf32: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """A run's released samples, as float32 on the CPU with their labels: every class
    ``config.samples_per_class`` times (an unconditional method draws as many, unlabelled),
    from the run's own sample stream (``sample_generator(config.seed)``). The one place that
    draws them: a script that re-samples a run (benchmarks/ema_ab.py, sample_count.py) gets the
    run's images back by calling it with the run's config."""
    labels = torch.arange(num_classes).repeat_interleave(config.samples_per_class)
    # a method may sample on the GPU (dpdm)
    with torch.no_grad(), numerics.exact_float32(device, allow_tf32=allow_tf32):
        images, labels = method.sample(len(labels), labels if method.conditional else None,
                                       sample_generator(config.seed))
    return images.detach().cpu().float(), labels.cpu()


def check_privacy(report: PrivacyReport) -> None:
    if report.private and not report.noise_off and report.epsilon_rdp > report.budget.epsilon:
        raise PrivacyViolation(f"spent ε={report.epsilon_rdp:.4f} exceeds the target ε={report.budget.epsilon}; "
                               "the run is not recorded")


def run_evaluators(config: RunConfig, data: ImageData, method: Method, device: torch.device, images: torch.Tensor,
                   labels: torch.Tensor | None, data_root: str | None = None) -> dict[str, Any]:
    """``{"metrics", "protocol"}`` of ``config.evaluators`` on the generated samples."""
    metrics: dict[str, Any] = {}
    protocol: dict[str, Any] = {"timings": {}}
    from tqdm.auto import tqdm

    for name in tqdm(config.evaluators, desc="evaluators", file=sys.stderr, leave=False, disable=None):
        ev = registry.evaluators.get(name)()
        t = time.time()
        log.info("evaluating %s", name)
        # float32 on CUDA (no TF32, whatever DPGEN_ALLOW_TF32 says for training): the evaluators'
        # classifiers and reference generators train as on the CPU, so a metric is comparable
        with numerics.exact_float32(device):
            out = ev.evaluate(EvalInput(data=data, images=images, labels=labels, method=method, device=device,
                                        seed=config.seed, options={"data_root": data_root, "delta": config.delta}))
        metrics.update(out.get("metrics", {}))
        protocol[name] = {**out.get("protocol", {}), "eval_split": data.eval_split}
        protocol["timings"][f"eval:{name}"] = time.time() - t
    return {"metrics": metrics, "protocol": protocol}


def reevaluate(run_dir: Path, evaluators: tuple[str, ...] | None, data_root: str | None = None) -> dict[str, Any]:
    """Re-run evaluators on a finished run from its checkpoint and samples (no training);
    merge the metrics into ``eval.json`` atomically."""
    run_dir = Path(run_dir)
    if not (run_dir / "config.json").is_file() or not (run_dir / "checkpoint.pt").is_file():
        raise UserError(f"{run_dir} is not a finished run directory (no config.json / checkpoint.pt)")
    try:
        cfg = recorded_config(run_dir)
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as e:
        raise UserError(f"cannot read the run's config {run_dir / 'config.json'}: {type(e).__name__}: {e}") from None
    if evaluators:
        cfg = dataclasses.replace(cfg, evaluators=tuple(evaluators))
    method_cls = registry.methods.get(cfg.method)
    members = (run_dir / "membership.npz").is_file()
    check_config(cfg if members else dataclasses.replace(cfg, members=None))
    old = _read_eval(run_dir)
    try:
        store.probe_writable_dir(run_dir)
    except OSError as e:
        raise UserError(f"cannot write {run_dir / store.COMPLETE_MARKER}: {e.strerror or e}") from None
    data = load_dataset(cfg.dataset, cfg.eval_split, root=data_root)
    if members:
        m = np.load(run_dir / "membership.npz")
        data = dataclasses.replace(data, train=data.train.subset(m["member_indices"]),
                                   member_indices=m["member_indices"], nonmember_indices=m["nonmember_indices"])
    info = DataInfo(data.name, data.image_shape, data.num_classes, len(data.train))
    method = method_cls(method_settings(method_cls, cfg.hparams), info)
    check_method_evaluators(cfg, method)
    try:
        state = torch.load(run_dir / "checkpoint.pt", weights_only=True, map_location="cpu")
        method.load_state_dict(state)
    except Exception as e:  # noqa: BLE001 - a corrupt or truncated checkpoint is the user's file
        raise UserError(f"cannot load {run_dir / 'checkpoint.pt'}: {type(e).__name__}: {e}") from None
    samples = np.load(run_dir / "samples.npz")
    images = torch.from_numpy(samples["images"])
    labels = torch.from_numpy(samples["labels"]) if method.conditional else None
    seed_everything(cfg.seed)
    result = run_evaluators(cfg, data, method, resolve_device(cfg.device), images, labels, data_root)
    old["metrics"].update(result["metrics"])
    timings = {**old["protocol"].get("timings", {}), **result["protocol"].pop("timings", {})}
    old["protocol"].update(result["protocol"])
    old["protocol"]["timings"] = timings
    store.write_json(run_dir / store.COMPLETE_MARKER, old)
    return old


def _read_eval(run_dir: Path) -> dict[str, Any]:
    """The run's ``eval.json`` to merge new metrics into (empty when there is none); one line
    when it cannot be read or is not an evaluation record, before anything is evaluated."""
    path = run_dir / store.COMPLETE_MARKER
    if not path.exists():
        return {"metrics": {}, "protocol": {}}
    try:
        old = store.read_json(path)
    except OSError as e:
        raise UserError(f"cannot read {path}: {e.strerror or e}") from None
    except ValueError as e:
        raise UserError(f"{path} is not valid JSON ({' '.join(str(e).split())})") from None
    if not isinstance(old, dict) or not isinstance(old.get("metrics", {}), dict) or not isinstance(
            old.get("protocol", {}), dict):
        raise UserError(f"{path} is not an evaluation record (an object with 'metrics' and 'protocol')")
    return {"metrics": {}, "protocol": {}, **old}
