"""Measured gradient telemetry of every private part: how large the records' contributions
really are against the clip bound, and how loud the noise is against what the step says.

The bound-based noise to signal (``privacy.signal``, ``PrivacyPart.noise_to_signal``) assumes
every record's clipped contribution has norm C. When the contributions are far smaller the
noise is sized for gradients that do not exist: DPAF's conv2* on mnist had median norms of
~0.045 against C = 1, a noise to signal ~39 where the bound said 0.06. This module measures,
at every private step and **before the noise**:

- the per-record contribution norms (per-example gradient norms of a DP-SGD part, the rows a
  sanitiser clips, the records DPAGG sums), their median and 90th percentile;
- the fraction clipped (norm > C);
- the measured noise to signal: the noise's expected norm ``σ·C·√d`` over the norm of the
  exact clipped sum ``‖Σᵢ clip(gᵢ, C)‖`` (both divided by the same B in the update, so the
  ratio is the one of the step's mean update); for a one-shot release of a sum, ``σΔ√d`` over
  the sum's norm.

**These statistics are computed on the private data without noise: they are a diagnostic
outside the guarantee**, like the losses in ``train.jsonl``. They go to ``train.jsonl`` and to
the run record (``privacy.json``, ``telemetry``), never into what the ε covers (checkpoint,
samples, grid). docs/privacy.md, "Measured gradient telemetry".
"""

from __future__ import annotations

import logging
import math
import statistics
from collections import defaultdict
from typing import Any

import torch

log = logging.getLogger("dpgen_bench")

# a part whose median contribution is below this share of its clip bound gets one warning
LOW_NORM_SHARE = 0.1


def _quantile(values: torch.Tensor, q: float) -> float:
    return float(torch.quantile(values.double(), q)) if len(values) else math.nan


def step_stats(norms: torch.Tensor | None, clip: float, clipped_sum_norm: float, noise_norm: float) -> dict:
    """One private step's numbers (``norms``: the per-record contribution norms before
    clipping, None where the mechanism only sees the sum)."""
    out: dict[str, float] = {}
    if norms is not None and len(norms):
        n = norms.detach().flatten().double().cpu()
        out.update(median_norm=_quantile(n, 0.5), p90_norm=_quantile(n, 0.9),
                   clip_fraction=float((n > clip).double().mean()), records=float(len(n)))
    out["noise_to_signal"] = noise_norm / clipped_sum_norm if clipped_sum_norm > 0 else math.inf
    out["signal_norm"] = float(clipped_sum_norm)
    return out


_SUMMED = ("median_norm", "p90_norm", "clip_fraction", "noise_to_signal")


class GradientTelemetry:
    """Per part: the statistics of each observed step, a window since the last ``train.jsonl``
    line and the run's summary. ``observe`` is called by the mechanisms themselves
    (``dpsgd.make_private``, ``GradientSanitizer``, ``GaussianRelease``, DPAF's DPAGG)."""

    def __init__(self):
        self.clip: dict[str, float] = {}
        self._steps: dict[str, list[dict]] = defaultdict(list)
        self._window: dict[str, list[dict]] = defaultdict(list)
        self._warned: set[str] = set()

    def observe(self, part: str, *, norms: torch.Tensor | None, clip: float, clipped_sum_norm: float,
                noise_norm: float) -> None:
        s = step_stats(norms, clip, clipped_sum_norm, noise_norm)
        self.clip[part] = float(clip)
        self._steps[part].append(s)
        self._window[part].append(s)
        if part not in self._warned and not math.isnan(s.get("median_norm", math.nan)) \
                and s["median_norm"] < LOW_NORM_SHARE * clip:
            self._warned.add(part)
            log.warning("%s", low_norm_warning(part, s["median_norm"], clip, s["noise_to_signal"]))

    @staticmethod
    def _aggregate(steps: list[dict]) -> dict[str, float]:
        out: dict[str, float] = {"steps": len(steps)}
        for key in _SUMMED:
            vals = [s[key] for s in steps if key in s and not math.isnan(s[key])]
            if vals:
                out[key] = statistics.fmean(vals) if key == "clip_fraction" else statistics.median(vals)
        return out

    def window(self) -> dict[str, dict]:
        """The parts observed since the last call, aggregated (medians over steps; clip
        fraction: mean); the window is emptied."""
        out = {p: self._aggregate(steps) for p, steps in self._window.items() if steps}
        self._window.clear()
        return out

    def summary(self) -> dict[str, dict]:
        """Per part: the aggregate over every observed step, over the first and the last tenth
        of them (gradients shrink or grow as training goes), and the clip bound."""
        out = {}
        for part, steps in self._steps.items():
            k = max(1, len(steps) // 10)
            out[part] = {**self._aggregate(steps), "clip_bound": self.clip[part],
                         "first": self._aggregate(steps[:k]), "last": self._aggregate(steps[-k:])}
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"clip": dict(self.clip), "steps": {k: list(v) for k, v in self._steps.items()},
                "window": {k: list(v) for k, v in self._window.items()}, "warned": sorted(self._warned)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.clip = dict(state.get("clip", {}))
        self._steps = defaultdict(list, {k: list(v) for k, v in state.get("steps", {}).items()})
        self._window = defaultdict(list, {k: list(v) for k, v in state.get("window", {}).items()})
        self._warned = set(state.get("warned", ()))


def low_norm_warning(part: str, median: float, clip: float, measured_nsr: float) -> str:
    return (f"part {part}: the median contribution norm {median:.3g} is below a tenth of the clip bound "
            f"C = {clip:g}: the noise is sized for contributions {clip / median:.0f}× larger than measured "
            f"(noise to signal {measured_nsr:.3g} measured); a smaller max_grad_norm may help "
            "(docs/privacy.md, 'Measured gradient telemetry')")


# ---------------------------------------------------------------- DP-SGD parts


def _opacus_norms(optimizer) -> torch.Tensor | None:
    """Per-example gradient norms as Opacus' DPOptimizer computes them before clipping."""
    samples = optimizer.grad_samples
    if not samples or len(samples[0]) == 0:
        return None
    per_param = [g.reshape(len(g), -1).norm(2, dim=-1) for g in samples]
    return torch.stack([n.to(per_param[0].device) for n in per_param], dim=1).norm(2, dim=1)


def instrument_dpsgd(optimizer, module, observe, part: str) -> None:
    """Record each logical step of a ``make_private`` optimizer: the per-example norms of every
    physical chunk (read before clipping: from Opacus' per-example gradients, or the norms the
    book-keeping / ghost module computed), and at the noise step the exact clipped sum
    (``p.summed_grad`` before the noise is added) against ``σ·C·√d``."""
    from opacus.optimizers import DPOptimizerFastGradientClipping

    norm_only = isinstance(optimizer, DPOptimizerFastGradientClipping)
    pending: list[torch.Tensor] = []
    collect_name = "accumulate" if norm_only else "clip_and_accumulate"
    real_collect, real_noise = getattr(optimizer, collect_name), optimizer.add_noise

    def collect():
        if norm_only:
            norms = getattr(module, "per_sample_norms", None)
            if norms is not None:
                module.per_sample_norms = None  # read once: an empty batch's step must not see them again
            elif hasattr(module, "get_norm_sample"):  # Opacus' ghost clipping
                norms = module.get_norm_sample()
            if norms is not None:
                pending.append(norms.detach())
        else:
            norms = _opacus_norms(optimizer)
            if norms is not None:
                pending.append(norms.detach())
        return real_collect()

    def add_noise():
        summed = [p.summed_grad for p in optimizer.params if p.summed_grad is not None]
        if summed and pending:
            signal = float(torch.sqrt(sum((s.double() ** 2).sum() for s in summed)))
            d = sum(p.numel() for p in optimizer.params)
            noise = optimizer.noise_multiplier * optimizer.max_grad_norm * math.sqrt(d)
            observe(part, norms=torch.cat([n.flatten().cpu() for n in pending]), clip=optimizer.max_grad_norm,
                    clipped_sum_norm=signal, noise_norm=noise)
        pending.clear()
        return real_noise()

    setattr(optimizer, collect_name, collect)
    optimizer.add_noise = add_noise
