"""``bench run --dry-run``'s run-time estimate: time the first training steps of a prepared
run and extrapolate each progress phase to its total, then time the sampling of a few images
and extrapolate it to the run's sample set (nothing written)."""

from __future__ import annotations

import math
import time
from typing import Any

import torch

from .context import TrainingContext
from .numerics import exact_float32, tf32_allowed
from .runner import Prepared, sample_generator, seed_everything


class _ProbeDone(Exception):
    """Raised inside ``fit`` by the probe's progress bars when the probe time is up."""


class _ProbeBar:
    """A progress bar that times its own updates (for the run-time estimate)."""

    def __init__(self, probe: "_ProbeContext", total: int, desc: str):
        self.probe, self.total, self.desc, self.n = probe, int(total), desc, 0
        self.t_first: float | None = None  # time of the first update (set-up excluded)
        self.t_last: float | None = None
        self.n_first = 0
        probe.bars.append(self)

    def update(self, n: int = 1) -> None:
        if self.probe.device.type == "cuda":  # count the queued kernels, not just their launch
            torch.cuda.synchronize(self.probe.device)
        now = time.time()
        if self.t_first is None:  # the first update may be a resume offset or one slow warm-up step
            self.t_first, self.n_first = now, self.n + n
        self.n += n
        self.t_last = now
        if now - self.probe.t0 >= self.probe.seconds and self.n - self.n_first >= 3:
            raise _ProbeDone

    def close(self) -> None:
        return None

    def set_postfix(self, *a, **k) -> None:
        return None


class _ProbeContext(TrainingContext):
    def __init__(self, device, seed, ledger, seconds: float):
        super().__init__(device, seed, ledger)
        self.seconds, self.t0, self.bars = seconds, time.time(), []

    def progress(self, total: int, desc: str):
        return _ProbeBar(self, total, desc)


def estimate_runtime(p: Prepared, seconds: float = 10.0) -> dict[str, Any]:
    """Time the first training steps of ``p``'s method for about ``seconds`` (on the run's
    device, with the run's data, writing nothing) and extrapolate each progress phase the
    method opened to its total. Phases the probe did not reach are not in the sum, which is
    then a lower bound (``complete`` false). Then time ``sample`` on a few images (at most
    ``seconds`` more) and extrapolate to the run's ``samples_per_class`` × classes
    (``sampling``): a diffusion model's sampler can cost more than its training (DPDM's
    paper U-Net on mnist-5k's quick schedule: 152 s of training, 491 s of sampling on two
    cores). Evaluators are not included. The probe's steps are not left in ``p.ledger``;
    ``p.method`` is trained a little (build a new ``Prepared`` to train for real)."""
    taken = dict(p.ledger.taken)
    ctx = _ProbeContext(p.device, p.config.seed, p.ledger, seconds)
    seed_everything(p.config.seed)
    t0 = time.time()
    finished = False
    try:
        with exact_float32(p.device, allow_tf32=tf32_allowed()):  # the numerics a run trains with
            p.method.fit(p.data.train, p.budget, ctx)
        finished = True
    except _ProbeDone:
        pass
    finally:
        p.ledger.taken = taken
    wall = time.time() - t0
    phases, total, setup = [], 0.0, 0.0
    for b in ctx.bars:
        steps = b.n - b.n_first
        rate = (b.t_last - b.t_first) / steps if steps > 0 and b.t_first is not None else None
        est = rate * b.total if rate is not None else None
        phases.append({"phase": b.desc, "steps": b.total, "timed_steps": steps,
                       "seconds_per_step": rate, "estimated_seconds": est})
        total += est or 0.0
    if ctx.bars and ctx.bars[0].t_first is not None:
        setup = ctx.bars[0].t_first - t0  # data to device, network construction, the first step
    sampling = estimate_sampling(p, seconds)
    # rounded up to 0.1 s, so that the total is never below a phase's own estimate
    fit_s = math.ceil((setup + total) * 10) / 10
    sample_s = sampling.get("estimated_seconds")
    return {"device": str(p.device), "probe_seconds": round(wall, 2), "setup_seconds": round(setup, 2),
            "phases": phases, "estimated_fit_seconds": fit_s, "complete": finished, "sampling": sampling,
            "estimated_fit_and_sample_seconds": None if sample_s is None else math.ceil((fit_s + sample_s) * 10) / 10,
            "note": "training, then sampling (evaluators excluded); training extrapolated from the first steps of "
                    "each phase reached; complete is false when the probe stopped before training ended: phases the "
                    "method opens later (if it has any) are missing and the figure is a lower bound; sampling "
                    "extrapolated from a few images drawn from the probe's half-trained model"}


def estimate_sampling(p: Prepared, seconds: float, max_timed: int = 512) -> dict[str, Any]:
    """Time ``p.method.sample`` on 4, 16, 64, … images (up to ``max_timed``, the whole set
    or about ``seconds`` of sampling) and extrapolate to the run's ``samples_per_class`` ×
    classes along the line through the last two timings (per-call overheads excluded from
    the slope). A method that cannot sample before its training ends (the probe stops it
    early) gives ``error`` instead of an estimate."""
    c = p.data.num_classes
    n = p.config.samples_per_class * c
    rng = sample_generator(p.config.seed)
    points: list[tuple[int, float]] = []
    k, t_start = min(4, n), time.time()
    try:
        with exact_float32(p.device, allow_tf32=tf32_allowed()):  # as the runner samples
            while True:
                labels = torch.arange(k) % c
                t = time.time()
                p.method.sample(k, labels if p.method.conditional else None, rng)
                if p.device.type == "cuda":
                    torch.cuda.synchronize(p.device)
                points.append((k, time.time() - t))
                if k >= min(n, max_timed) or (time.time() - t_start) + 4 * points[-1][1] > seconds:
                    break
                k = min(4 * k, n, max_timed)
    except Exception as e:  # noqa: BLE001 - e.g. a method whose generator exists only after its last phase
        return {"images": n, "error": f"{type(e).__name__}: {e}"}
    k2, t2 = points[-1]
    per = t2 / k2
    if len(points) > 1 and t2 > points[-2][1]:
        per = (t2 - points[-2][1]) / (k2 - points[-2][0])
    return {"images": n, "timed_images": k2, "seconds_per_image": per,
            "estimated_seconds": t2 + per * (n - k2)}


# ------------------------------------------------------------ gradient probe


class _QuietContext(TrainingContext):
    """A context whose progress bars print nothing (the gradient probe's)."""

    def progress(self, total: int, desc: str):
        return _SilentBar()


class _SilentBar:
    def update(self, n: int = 1) -> None:
        return None

    def close(self) -> None:
        return None

    def set_postfix(self, *a, **k) -> None:
        return None


def measure_gradients(config, data_root: str | None = None, steps: int = 5) -> dict[str, Any]:
    """A short probe of every private part: the run's own preparation (data, networks, σ),
    then ``fit`` on the plan with every part's steps cut by one factor, the shortest part to
    ``steps`` (GS-WGAN's counted in generator steps of B compositions), so every phase is
    reached in its planned proportion, and the measured
    telemetry of each part (``privacy.telemetry``) beside its bound-based noise to signal.
    Nothing is written; the probe's statistics are computed on the private data without
    noise, a diagnostic outside the guarantee (the probe releases nothing)."""
    import dataclasses

    from .privacy.ledger import PrivacyLedger
    from .runner import prepare

    p = prepare(config, data_root)
    if not p.budget.private:
        return {}
    per = int(getattr(p.method, "compositions_per_step", 1))
    planned = p.ledger.planned_report().parts
    # every part cut by one factor, so that the shortest takes ``steps``: a method that interleaves
    # its parts (DPAF's conv2* every few DPAGG steps) reaches each of them
    shortest = min((part.steps // per for part in p.ledger.planned.values() if part.steps), default=1)
    factor = min(1.0, steps / max(shortest, 1))
    capped = [dataclasses.replace(part, steps=per * max(1, round(part.steps // per * factor)) if part.steps else 0)
              for part in p.ledger.planned.values()]
    ledger = PrivacyLedger(p.budget, capped)
    ctx = _QuietContext(p.device, config.seed, ledger)
    seed_everything(config.seed)
    t0 = time.time()
    with exact_float32(p.device, allow_tf32=tf32_allowed()):
        p.method.fit(p.data.train, p.budget, ctx)
    measured = ctx.telemetry.summary()
    out = {}
    for part in planned:
        m = measured.get(part.name, {})
        out[part.name] = {"noise_multiplier": part.noise_multiplier, "noise_to_signal_bound": part.noise_to_signal,
                          "noise_to_signal_measured": m.get("noise_to_signal"),
                          **{k: m.get(k) for k in ("median_norm", "p90_norm", "clip_fraction", "clip_bound", "steps")}}
    return {"parts": out, "probe_seconds": round(time.time() - t0, 2), "steps_per_part": steps,
            "note": "measured on the private data without noise over the probe's first steps: a diagnostic outside "
                    "the guarantee (docs/privacy.md, 'Measured gradient telemetry')"}
