"""Accounting for (Poisson-subsampled) Gaussian mechanisms.

- RDP (Mironov et al. 2019) through Opacus' ``RDPAccountant``: the number compared with
  the target, as in the papers (Private GANs §3, "by default we use the former").
- PRV (Gopi et al. 2021) through ``prv_accountant``: reported beside it; we report the
  upper bound of its (lower, estimate, upper) triple.
- Noise is calibrated with Opacus' ``get_noise_multiplier`` and then re-checked, because
  calibration has overshot ε in the past.
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Sequence

from opacus.accountants import RDPAccountant
from opacus.accountants.utils import get_noise_multiplier

from ..api import PrivacyPart
from ..errors import UserError

# RDP orders: Opacus' defaults plus a denser low range, which matters for large ε.
_ORDERS = sorted(set([1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64)) + [80, 128, 256, 512, 1024]))


def _history(parts: Sequence[PrivacyPart]) -> list[tuple[float, float, int]]:
    return [(p.noise_multiplier, p.sample_rate, int(p.steps)) for p in parts if p.steps > 0]


def compose_rdp(parts: Sequence[PrivacyPart], delta: float) -> float:
    """ε of all parts composed (RDP, converted at ``delta``)."""
    history = _history(parts)
    if not history:
        return 0.0
    acc = RDPAccountant()
    acc.history = history
    with warnings.catch_warnings():  # "optimal order is the largest alpha": only for tiny ε
        warnings.simplefilter("ignore", UserWarning)
        return float(acc.get_epsilon(delta=delta, alphas=_ORDERS))


def part_epsilon(part: PrivacyPart, delta: float) -> float:
    return compose_rdp([part], delta)


def fmt_eps(x: float, spec: str = ".3g") -> str:
    """An ε for tables and summaries: ∞ when non-private, "n/a" when not computable (PRV
    where prv-accountant fails, see ``compose_prv``)."""
    if math.isnan(x):
        return "n/a"
    return "∞" if not math.isfinite(x) else format(x, spec)


PRV_MAX_GRID_POINTS = 20_000_000  # measured ~200 B per point at peak (4.1e7 points: 8.4 GB, 212 s), so ≤ ~4 GB


def prv_grid_points(prvs, steps: Sequence[int], eps_error: float, delta_error: float) -> float:
    """Points of the grid prv-accountant 0.2 would discretise on (its ``PRVAccountant``:
    domain [-L, L] from ``compute_safe_domain_size``, mesh from Theorem 5.5 of Gopi et
    al.), computed before allocating it: at tiny noise (ε in the thousands) L explodes and
    the accountant would ask for tens of GB."""
    from prv_accountant.accountant import compute_safe_domain_size

    L = compute_safe_domain_size(prvs, steps, eps_error=eps_error, delta_error=delta_error)
    mesh = eps_error / math.sqrt(sum(steps) / 2 * math.log(12 / delta_error))
    return 2 * L / mesh


def compose_prv(parts: Sequence[PrivacyPart], delta: float, eps_error: float | None = None) -> float:
    """Upper bound on ε from the PRV accountant, all parts composed; NaN where the
    accountant cannot compute one.

    The returned upper bound is the estimate plus ``eps_error``. The accountant's cost grows
    with the number of compositions and with 1/eps_error. The default error is 0.01 up to
    20K steps and 0.05 beyond (paper-scale runs: 380K steps take ~6 s instead of ~50 s),
    and never more than a tenth of the RDP ε (floor 0.002). An absolute 0.05 at ε = 0.2
    would put the PRV "upper bound" above the RDP one (0.155 vs 0.123 for dpaf, MNIST).

    prv-accountant 0.2 fails ("Discrete mean differs from continuous mean significantly")
    for a low-noise, high-rate part such as σ = 0.5 at q = 0.13 (dpaf's conv2* at ε = 50 on
    digits), and setting ``eps_max`` only clips the answer to it. PRV is reported beside RDP,
    not compared with the target, so the failure is logged and NaN is returned ("n/a" in
    records and tables); the run stands on its RDP ε. The same holds where the
    accountant's grid would not fit in memory (``prv_grid_points``: ε ≈ 10⁵ asked for
    34 GB and crashed a finished run).
    """
    from prv_accountant import PoissonSubsampledGaussianMechanism, PRVAccountant

    history = _history(parts)
    if not history:
        return 0.0
    prvs = [PoissonSubsampledGaussianMechanism(noise_multiplier=s, sampling_probability=q) for s, q, _ in history]
    steps = [t for _, _, t in history]
    if eps_error is None:
        eps_error = 0.01 if sum(steps) <= 20_000 else 0.05
        eps_error = min(eps_error, max(0.1 * compose_rdp(parts, delta), 0.002))
    delta_error = delta / 1000
    try:
        points = prv_grid_points(prvs, steps, eps_error, delta_error)
        if points > PRV_MAX_GRID_POINTS:  # a near-noiseless part: the grid would not fit in memory
            raise ValueError(f"its grid would have {points:.3g} points (limit {PRV_MAX_GRID_POINTS:.0e}), "
                             "e.g. a part with very little noise")
        acc = PRVAccountant(prvs=prvs, max_self_compositions=steps, eps_error=eps_error, delta_error=delta_error)
        _, _, upper = acc.compute_epsilon(delta=delta, num_self_compositions=steps)
    except (RuntimeError, ValueError, FloatingPointError) as e:
        logging.getLogger("dpgen_bench").warning(f"PRV accountant failed ({e}); PRV ε not reported, RDP ε stands")
        return float("nan")
    return float(upper)


def calibrate_noise(*, target_epsilon: float, target_delta: float, sample_rate: float, steps: int) -> float:
    """Smallest noise multiplier (to ~0.5% of ε) whose RDP ε after ``steps`` is ≤ target."""
    _check_target(target_epsilon, target_delta)
    tolerance = max(1e-4, 0.005 * target_epsilon)
    sigma = get_noise_multiplier(
        target_epsilon=target_epsilon,
        target_delta=target_delta,
        sample_rate=sample_rate,
        steps=steps,
        accountant="rdp",
        epsilon_tolerance=tolerance,
        alphas=_ORDERS,
    )
    spent = compose_rdp([PrivacyPart("check", sigma, sample_rate, steps)], target_delta)
    if spent > target_epsilon:  # never trust a calibration blindly
        raise AssertionError(f"noise calibration overshot: ε={spent} > {target_epsilon}")
    return float(sigma)


def steps_for_budget(*, target_epsilon: float, target_delta: float, sample_rate: float, noise_multiplier: float,
                     max_steps: int = 10_000_000) -> int:
    """Largest number of steps whose RDP ε at this noise is ≤ target ("train until the
    budget is spent"). 0 when even one step exceeds it."""
    _check_target(target_epsilon, target_delta)

    def eps(t: int) -> float:
        return compose_rdp([PrivacyPart("check", noise_multiplier, sample_rate, t)], target_delta)

    if eps(1) > target_epsilon:
        return 0
    lo, hi = 1, 2
    while hi <= max_steps and eps(hi) <= target_epsilon:
        lo, hi = hi, hi * 2
    hi = min(hi, max_steps + 1)
    while hi - lo > 1:  # invariant: eps(lo) <= target < eps(hi)
        mid = (lo + hi) // 2
        if eps(mid) <= target_epsilon:
            lo = mid
        else:
            hi = mid
    return lo


def _check_target(epsilon: float, delta: float) -> None:
    if not (epsilon > 0) or not math.isfinite(epsilon):
        raise UserError(f"epsilon must be a positive finite number, got {epsilon}")
    if not (0 < delta < 1):
        raise UserError(f"delta must be in (0, 1), got {delta}")
