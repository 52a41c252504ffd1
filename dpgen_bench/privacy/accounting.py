"""Accounting for subsampled Gaussian mechanisms, two kinds (``PrivacyPart.mechanism``):

- ``subsampled_gaussian`` (``POISSON``): Poisson subsampling, add/remove neighbours
  (DPSGD). RDP (Mironov et al. 2019) through Opacus' ``RDPAccountant`` and its RDP → (ε, δ)
  conversion (on Opacus' RDP series evaluated for all orders at once, ``rdp_orders``):
  the number compared with the target, as in the papers (Private GANs §3, "by default we
  use the former"). PRV (Gopi et al. 2021) through ``prv_accountant`` is
  reported beside it (the upper bound of its (lower, estimate, upper) triple).
- ``subsampled_gaussian_wor`` (``WOR``): the mixture (1−q)·P0 + q·A versus
  (1−q)·P0 + q·A′ of sampling *without replacement* (GS-WGAN's choice of one of K
  discriminators, q = 1/K). Neither side is P0 alone, so Opacus' Poisson bound does not
  apply; we use Theorem 9 of Wang, Balle, Kasiviswanathan, "Subsampled Rényi Differential
  Privacy and Analytical Moments Accountant" (AISTATS 2019), the bound autodp's
  ``anaRDPacct.compose_subsampled_mechanism`` implements and GS-WGAN's
  ``privacy_analysis.py`` calls, at integer orders, with the classical conversion
  ε = min_α RDP(α) + log(1/δ)/(α−1) that autodp's ``get_eps`` uses (so our ε is never
  below autodp's: its order search is finer, ours is the integer grid). prv-accountant
  has no such mechanism: PRV ε is "n/a" for runs with a WOR part. The argument for why the
  theorem fits GS-WGAN and DP-GAN-DPAC is in docs/privacy.md.

Noise is calibrated from the target and the result re-checked with the same composition.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
import math
import warnings
from collections.abc import Iterator, Sequence

import numpy as np
from opacus.accountants import RDPAccountant
from opacus.accountants.analysis import rdp as _opacus_rdp
from opacus.accountants.analysis.rdp import get_privacy_spent
from scipy.special import gammaln, logsumexp

from ..api import PrivacyPart
from ..errors import BudgetTooLow, UserError
from .rdp_orders import compute_rdp as _fast_compute_rdp

# RDP orders: Opacus' defaults plus a denser low range, which matters for large ε.
_ORDERS = sorted(set([1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64)) + [80, 128, 256, 512, 1024]))
# Theorem 9 of Wang et al. holds at integer orders: compositions with a WOR part use these.
_INT_ORDERS = np.array(list(range(2, 257)) + [320, 384, 512, 768, 1024])

# Opacus' RDP of the subsampled Gaussian at ~150 orders is a pure-Python series per order,
# evaluated at every σ a calibration tries (DPAF's plan on mnist-5k: ~15 of its ~19 s).
# ``rdp_orders.compute_rdp`` evaluates the same series for all orders at once in NumPy (same
# terms and stopping rule; values within Opacus' own rounding, ~1e-9 relative where the
# series cancels: tests/unit/test_rdp_orders.py), installed where Opacus' accountant looks
# it up, so that its RDPAccountant, conversion and noise search run unchanged on it.
if _opacus_rdp.compute_rdp is not _fast_compute_rdp:
    _opacus_rdp.opacus_compute_rdp = _opacus_rdp.compute_rdp  # Opacus' own, kept for the tests
    _opacus_rdp.compute_rdp = _fast_compute_rdp

POISSON = "subsampled_gaussian"
WOR = "subsampled_gaussian_wor"  # Theorem 9 of Wang et al. (generic): GS-WGAN's own accounting, paper mode
WOR_GAUSSIAN = "subsampled_gaussian_wor_t27"  # Theorem 27 (Gaussian-specific): GS-WGAN / DPAC sound mode
MECHANISMS = (POISSON, WOR, WOR_GAUSSIAN)
WOR_MECHANISMS = (WOR, WOR_GAUSSIAN)
# autodp's continuous order search lands within ~1e-6 (relative) of our integer-order ε,
# above or below: WOR calibration aims this far under the target so that autodp's ε of the
# part we print is ≤ the target too.
_WOR_MARGIN = 1e-4
MAX_NOISE_MULTIPLIER = 1e6  # where calibration gives up (Opacus' MAX_SIGMA): a larger σ means ε is out of reach
# The largest σ each calibration tries before giving up: Opacus doubles from 20, ours from 1.
_LAST_SIGMA = {POISSON: 20 * 2 ** int(math.log2(MAX_NOISE_MULTIPLIER / 20)),
               WOR: 2 ** int(math.log2(MAX_NOISE_MULTIPLIER)),
               WOR_GAUSSIAN: 2 ** int(math.log2(MAX_NOISE_MULTIPLIER))}


def _aim(epsilon: float, mechanism: str) -> float:
    """The ε a calibration aims at: the target, or just under it for WOR (``_WOR_MARGIN``)."""
    return epsilon * (1 - _WOR_MARGIN) if mechanism in WOR_MECHANISMS else epsilon


def _history(parts: Sequence[PrivacyPart]) -> list[tuple[float, float, int]]:
    return [(p.noise_multiplier, p.sample_rate, int(p.steps)) for p in parts if p.steps > 0]


# Theorem 27's Gaussian-specific term is evaluated for j ≤ this; higher terms keep Theorem 9's
# (a valid bound for every j: the theorem takes the smaller of the two).
_T27_MAX_J = 128


@functools.lru_cache(maxsize=4096)
def _log_gaussian_chi_moments(noise_multiplier: float, jmax: int = _T27_MAX_J) -> tuple[float, ...]:
    """log E[(L − 1)^j], j = 0..jmax+1, for the Gaussian pair N(Δ, σ²Δ²) vs N(0, σ²Δ²), where
    L is their likelihood ratio under the second (the binary |χ|^j divergence for even j).

    E[L^i] = exp(i(i−1)/(2σ²)), so E[(L − 1)^j] = Σ_i C(j, i)(−1)^{j−i} exp(i(i−1)/(2σ²)), the
    j-th forward difference at 0 of i ↦ exp(i(i−1)/(2σ²)) (the ``_get_forward_diffs`` of
    dp-accounting). The alternating sum cancels to ~(j−1)!!/σ^j out of terms of size up to
    2^j·e^{j²/(2σ²)}, so it is summed in exact-enough arithmetic (mpmath, with more digits
    than the cancellation eats, checked per sum), not in floats, where large σ would turn it
    into rounding noise (possibly below the truth: unsound). Odd j are NaN (not used: Hölder
    interpolates them from their even neighbours)."""
    import mpmath

    sigma = float(noise_multiplier)
    top = jmax + 1 + (jmax + 1) % 2  # the even order above jmax is needed to interpolate jmax
    # Digits: enough for the cancellation at large σ (terms ~2^j, result ~(j−1)!!/σ^j); each
    # sum is then checked against its terms' magnitude and redone with twice the digits if
    # rounding could have reached the 20th significant digit (small σ needs far fewer).
    digits = int(40 + top * (math.log10(2) + max(0.0, math.log10(sigma))))
    while True:
        with mpmath.workdps(digits):
            s2 = 2 * mpmath.mpf(sigma) ** 2
            f = [mpmath.exp(mpmath.mpf(i * (i - 1)) / s2) for i in range(top + 1)]
            out, exact = [math.nan] * (top + 1), True
            binom = [1]  # C(j, i), i = 0..j, as exact integers
            for j in range(top + 1):
                if j > 0:
                    binom = [1] + [binom[i - 1] + binom[i] for i in range(1, j)] + [1]
                if j % 2:
                    continue
                total = mpmath.fsum((binom[i] if (j - i) % 2 == 0 else -binom[i]) * f[i] for i in range(j + 1))
                scale = mpmath.fsum(binom[i] * f[i] for i in range(j + 1))
                if total <= 0 or mpmath.log10(scale / total) > digits - 20:
                    exact = False
                    break
                out[j] = float(mpmath.log(total))
        if exact:
            return tuple(out)
        digits *= 2


def rdp_wor_gaussian(sample_rate: float, noise_multiplier: float, orders, *, gaussian: bool = False) -> np.ndarray:
    """RDP ε'(α) of one Gaussian mechanism (noise multiplier σ: ε(α) = α/(2σ²)) under
    sampling without replacement at rate γ, replace-one neighbours, at integer orders α ≥ 2.

    ``gaussian=False``: Wang, Balle, Kasiviswanathan 2019, Theorem 9 (any mechanism, here
    with ε(∞) = ∞), the bound autodp implements and GS-WGAN's ``privacy_analysis.py`` calls::

        ε'(α) = min{ ε(α), 1/(α−1) · log(1 + γ²·C(α,2)·min{4(e^{ε(2)}−1), 2e^{ε(2)}}
                                        + Σ_{j=3..α} γ^j·C(α,j)·ξ_j) },   ξ_j = 2e^{(j−1)ε(j)}

    ``gaussian=True``: Theorem 27 of the arXiv version of the same paper (1808.00087), the
    Gaussian-specific bound dp-accounting's ``_compute_rdp_sample_wor_gaussian`` implements:
    the same sum with ξ_j = min{2e^{(j−1)ε(j)}, 4·χ_j}, where χ_j = E[(L−1)^j] is the binary
    |χ|^j divergence of two Gaussians Δ apart for even j and √(χ_{j−1}·χ_{j+1}) for odd j
    (Hölder). Theorem 9's ξ_j does not vanish as σ → ∞ (a σ-independent floor per step);
    4·χ_j ≈ 4(j−1)!!/σ^j does. Evaluated for j ≤ 128 (beyond, ξ_j keeps Theorem 9's value,
    which is valid: the theorem's bound is the smaller one). Why the theorem applies to
    GS-WGAN's step: docs/privacy.md.
    """
    orders = np.asarray(orders)
    if np.any(orders < 2) or np.any(orders != np.round(orders)):
        raise ValueError("the WOR bounds of Wang et al. need integer orders ≥ 2")
    sigma2 = float(noise_multiplier) ** 2
    if sigma2 == 0:
        return np.full(len(orders), np.inf)

    def eps(a):
        return a / (2 * sigma2)

    if sample_rate >= 1.0:
        return eps(orders.astype(float))
    log_q = math.log(sample_rate)
    e2 = eps(2.0)
    j2 = min(math.log(4) + e2 + math.log(-math.expm1(-e2)), math.log(2) + e2)
    amax = int(orders.max())
    jj = np.arange(3, amax + 1, dtype=float)
    log_xi = math.log(2) + (jj - 1) * eps(jj)  # Theorem 9's ξ_j, j = 3..amax
    if gaussian:
        chi = np.asarray(_log_gaussian_chi_moments(float(noise_multiplier)))
        n = min(amax, _T27_MAX_J) - 2  # j = 3..min(amax, 128)
        j = np.arange(3, 3 + n)
        lo, hi = 2 * (j // 2), 2 * ((j + 1) // 2)  # even neighbours (j itself when even)
        log_xi[:n] = np.minimum(log_xi[:n], math.log(4) + 0.5 * (chi[lo] + chi[hi]))
    log_fact = gammaln(np.arange(amax + 1) + 1.0)  # log k!, once for every order
    out = np.empty(len(orders))
    for i, a in enumerate(orders.astype(int)):
        log_comb = log_fact[a] - log_fact[:a + 1] - log_fact[a::-1]  # log C(a, j), j = 0..a
        terms = np.concatenate([[0.0, 2 * log_q + log_comb[2] + j2],
                                log_xi[:a - 2] + jj[:a - 2] * log_q + log_comb[3:]])
        out[i] = min(eps(float(a)), logsumexp(terms) / (a - 1))
    return out


def rdp_curve(part: PrivacyPart, orders) -> np.ndarray:
    """RDP of ``part`` (all its steps composed) at ``orders``."""
    if part.mechanism == POISSON:
        return np.asarray(_fast_compute_rdp(q=part.sample_rate, noise_multiplier=part.noise_multiplier,
                                            steps=int(part.steps), orders=list(orders)), dtype=float)
    if part.mechanism in WOR_MECHANISMS:
        return int(part.steps) * rdp_wor_gaussian(part.sample_rate, part.noise_multiplier, orders,
                                                  gaussian=part.mechanism == WOR_GAUSSIAN)
    raise ValueError(f"unknown mechanism '{part.mechanism}' (known: {', '.join(MECHANISMS)})")


def compose_rdp(parts: Sequence[PrivacyPart], delta: float) -> float:
    """ε of all parts composed (RDP, converted at ``delta``).

    All-Poisson compositions: Opacus' accountant over ``_ORDERS`` and its conversion
    (Balle et al. 2020), unchanged from the DPSGD papers. With a WOR part: the RDP curves
    add at integer orders; with Theorem 9's (paper mode) the classical conversion
    ε = min_α RDP(α) + log(1/δ)/(α−1) is used, as autodp does for GS-WGAN; otherwise
    Opacus' conversion (Balle et al. 2020, Theorem 21), as dp-accounting does. Memoised:
    calibration and plan searches compose the same parts many times."""
    live = tuple((float(p.noise_multiplier), float(p.sample_rate), int(p.steps), p.mechanism)
                 for p in parts if p.steps > 0)
    return _compose_rdp(live, float(delta))


@functools.lru_cache(maxsize=4096)
def _compose_rdp(live: tuple[tuple[float, float, int, str], ...], delta: float) -> float:
    if not live:
        return 0.0
    parts = [PrivacyPart("part", sigma, q, steps, mechanism=mechanism) for sigma, q, steps, mechanism in live]
    if all(p.mechanism == POISSON for p in parts):
        acc = RDPAccountant()
        acc.history = _history(parts)
        with warnings.catch_warnings():  # "optimal order is the largest alpha": only for tiny ε
            warnings.simplefilter("ignore", UserWarning)
            return float(acc.get_epsilon(delta=delta, alphas=_ORDERS))
    rdp = sum(rdp_curve(p, _INT_ORDERS) for p in parts)
    if any(p.mechanism == WOR for p in parts):  # GS-WGAN's own accounting: autodp's classical conversion
        return float(np.min(rdp + math.log(1 / delta) / (_INT_ORDERS - 1)))
    with warnings.catch_warnings():  # the conversion Opacus uses (Balle et al. 2020), as dp-accounting does
        warnings.simplefilter("ignore", UserWarning)
        return float(get_privacy_spent(orders=_INT_ORDERS, rdp=rdp, delta=delta)[0])


PROFILE_DELTAS = tuple(10.0 ** (-k / 2) for k in range(2, 29))  # 1e-1 ... 1e-14, half-decades


def privacy_profile(parts: Sequence[PrivacyPart], delta: float,
                    deltas: Sequence[float] = PROFILE_DELTAS) -> list[tuple[float, float]]:
    """The (ε, δ') pairs the accountant certifies for ``parts`` composed (``compose_rdp`` at each
    δ' of ``deltas`` and at the run's ``delta``): the privacy profile an audit tests as a whole
    trade-off curve (``audit_bounds.profile_rejected``). Pairs with ε = ∞ are dropped; the
    conversion's ε can come out negative at a large δ' (Balle et al.'s formula), which certifies
    (0, δ'): clipped to 0."""
    pairs = [(max(0.0, compose_rdp(parts, d)), float(d)) for d in sorted(set(deltas) | {float(delta)})]
    return [(e, d) for e, d in pairs if math.isfinite(e)]


def part_epsilon(part: PrivacyPart, delta: float) -> float:
    return compose_rdp([part], delta)


def fmt_eps(x: float, spec: str = ".3g") -> str:
    """An ε for tables and summaries: ∞ when non-private, "n/a" when not computable (PRV
    where prv-accountant fails, see ``compose_prv``)."""
    if math.isnan(x):
        return "n/a"
    return "∞" if not math.isfinite(x) else format(x, spec)


PRV_MAX_GRID_POINTS = 20_000_000  # measured ~200 B per point at peak (4.1e7 points: 8.4 GB, 212 s), so ≤ ~4 GB


# The orders prv-accountant 0.2's ``compute_safe_domain_size`` asks its mechanisms for
# (``other_accountants.RDP``'s defaults).
_PRV_DOMAIN_ORDERS = tuple([1.0 + x / 10.0 for x in range(1, 100)] + [float(a) for a in range(12, 64)])


@functools.lru_cache(maxsize=256)
def _prv_domain_rdp(q: float, sigma: float) -> dict[float, float]:
    from .rdp_orders import rdp_orders

    return dict(zip(_PRV_DOMAIN_ORDERS, rdp_orders(q, sigma, _PRV_DOMAIN_ORDERS).tolist()))


def poisson_gaussian_prv(sample_rate: float, noise_multiplier: float):
    """prv-accountant's ``PoissonSubsampledGaussianMechanism`` (its PRV: pdf, cdf, all of it)
    whose ``rdp(α)``, which prv-accountant uses only to size the discretisation domain
    (``compute_safe_domain_size``: RDP at 150 orders, twice per ``compose_prv``), comes from
    ``rdp_orders``, all orders at once. It is the same series as prv-accountant's own
    (TF Privacy's ``_compute_log_a``, signed terms, stopping at e⁻³⁰; at the same double
    precision q and σ), so the domain, the grid and ε are unchanged (measured ~1e-12 relative,
    tested to 1e-10 in tests/unit/test_accounting.py); prv-accountant's own loop was ~60 % of a
    short run's PRV ε."""
    return _prv_mechanism_class()(sampling_probability=sample_rate, noise_multiplier=noise_multiplier)


@functools.cache
def _prv_mechanism_class():
    from prv_accountant import PoissonSubsampledGaussianMechanism  # imported when PRV is first asked for

    class PoissonGaussianPRV(PoissonSubsampledGaussianMechanism):
        def rdp(self, alpha: float) -> float:
            table = _prv_domain_rdp(float(self.p), float(self.sigma))
            a = float(alpha)
            return table[a] if a in table else super().rdp(alpha)

    return PoissonGaussianPRV


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

    For some plans scipy warns "The integral is probably divergent, or slowly convergent"
    from the accountant's mean of a truncated PRV (one ``quad`` over a sub-interval where the
    CDF steps sharply; dpaf's paper plan on FFHQ at δ = 1e-6, ε = 2 and 10). Measured there
    against the same mean integrated over 120 log-spaced sub-intervals (no warning): the mean
    moves by up to 2e-4 of itself and the ε upper bound by 7e-6 at ε = 10 (8.858345 vs 8.858338)
    and 1.2e-6 at ε = 2, the library's the larger both times: far inside ``eps_error``. The
    warning is left visible.
    """
    from prv_accountant import PRVAccountant

    if any(p.mechanism != POISSON for p in parts if p.steps > 0):
        logging.getLogger("dpgen_bench").debug("PRV n/a: prv-accountant has no sampling without replacement")
        return float("nan")
    history = _history(parts)
    if not history:
        return 0.0
    prvs = [poisson_gaussian_prv(q, s) for s, q, _ in history]
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


_REACHABILITY_ONLY = contextvars.ContextVar("reachability_only", default=False)


@contextlib.contextmanager
def reachability_only() -> Iterator[None]:
    """Inside this block ``calibrate_noise`` only checks that its target is reachable: it
    raises ``BudgetTooLow`` exactly when it would otherwise, and returns the largest noise
    multiplier its search tries at once, without searching for the smallest one. For asking
    "can this plan be calibrated at ε?" many times (the smallest feasible ε) at the cost of
    one composition per part."""
    token = _REACHABILITY_ONLY.set(True)
    try:
        yield
    finally:
        _REACHABILITY_ONLY.reset(token)


def calibrate_noise(*, epsilon: float, delta: float, sample_rate: float, steps: int,
                    mechanism: str = POISSON) -> float:
    """Smallest noise multiplier (to ~0.5% of ε) whose RDP ε after ``steps`` is ≤ target."""
    _check_target(epsilon, delta)
    check_plan_inputs(sample_rate=sample_rate, steps=steps)
    tolerance = max(1e-4, 0.005 * epsilon)
    aim = _aim(epsilon, mechanism)

    def eps(sigma: float) -> float:
        return compose_rdp([PrivacyPart("check", sigma, sample_rate, steps, mechanism=mechanism)], delta)

    last = _LAST_SIGMA.get(mechanism, MAX_NOISE_MULTIPLIER)
    too_low = BudgetTooLow(f"the privacy budget is too low: no noise multiplier up to {last:g} gives ε ≤ {epsilon:g} "
                           f"at δ={delta:g} over {steps} steps at sample rate {sample_rate:.4g}")
    if eps(last) > aim:  # out of reach: what the search below would find after doubling σ up to the limit
        raise too_low
    if _REACHABILITY_ONLY.get():
        return float(last)
    if mechanism == POISSON:
        sigma = _opacus_search(eps, aim, tolerance, too_low)
    else:
        sigma = _bisect_sigma(eps, aim, tolerance, too_low)
    spent = eps(sigma)
    if spent > aim:  # never trust a calibration blindly
        raise AssertionError(f"noise calibration overshot: ε={spent} > {aim}")
    return float(sigma)


# Opacus' search halves σ's bracket each time: ~60 halvings reach a float's resolution, so more
# would mean an ε that jumps past the tolerance between neighbouring floats (the σ found stands).
_MAX_BISECTIONS = 200


def _opacus_search(eps, aim: float, tolerance: float, too_low: Exception) -> float:
    """Opacus' ``get_noise_multiplier``, step for step, so the same σ: σ = 20, doubled until
    eps(σ) ≤ aim (``too_low`` past ``MAX_NOISE_MULTIPLIER``, its MAX_SIGMA), then bisection of
    [0, σ] until eps(σ) is within ``tolerance`` under aim; ``eps`` is ``compose_rdp``, the
    accountant's own ε. Its bisection is bounded here (``_MAX_BISECTIONS``), Opacus' is not."""
    lo, hi, eps_hi = 0.0, 10.0, math.inf
    while eps_hi > aim:
        hi *= 2
        eps_hi = eps(hi)
        if hi > MAX_NOISE_MULTIPLIER:
            raise too_low
    for _ in range(_MAX_BISECTIONS):
        if aim - eps_hi <= tolerance:
            break
        mid = (lo + hi) / 2
        eps_mid = eps(mid)
        if eps_mid < aim:
            hi, eps_hi = mid, eps_mid
        else:
            lo = mid
    return hi


def calibrate_beside(fixed: Sequence[PrivacyPart], *, epsilon: float, delta: float, sample_rate: float,
                     steps: int) -> float:
    """Smallest noise multiplier (to ~0.5 % of ε) of a Poisson subsampled Gaussian part
    (``sample_rate``, ``steps``) whose RDP composition with the ``fixed`` parts is ≤ target: the
    budget left after parts whose noise is set (DP-FETA's central images before DPDM's DP-SGD).
    Bisection on σ (ε of the composition decreases in σ); ``BudgetTooLow`` when the fixed
    parts alone leave nothing, or no σ up to the limit fits."""
    _check_target(epsilon, delta)
    check_plan_inputs(sample_rate=sample_rate, steps=steps)
    for p in fixed:
        check_plan_inputs(sample_rate=p.sample_rate, noise_multiplier=p.noise_multiplier, part=p.name)
    if not fixed:
        return calibrate_noise(epsilon=epsilon, delta=delta, sample_rate=sample_rate, steps=steps)
    tolerance = max(1e-4, 0.005 * epsilon)
    aim = min(_aim(epsilon, p.mechanism) for p in fixed)

    def eps(sigma: float) -> float:
        return compose_rdp([*fixed, PrivacyPart("check", sigma, sample_rate, steps)], delta)

    if compose_rdp(list(fixed), delta) >= aim or eps(MAX_NOISE_MULTIPLIER) > aim:
        raise BudgetTooLow(f"the privacy budget is too low: the fixed parts ({', '.join(p.name for p in fixed)}) "
                           f"leave no room for {steps} steps at sample rate {sample_rate:.4g} within ε = {epsilon:g} "
                           f"at δ={delta:g}")
    sigma = _bisect_sigma(eps, aim, tolerance, BudgetTooLow("the privacy budget is too low"))
    if eps(sigma) > aim:  # never trust a calibration blindly
        raise AssertionError(f"noise calibration overshot: ε={eps(sigma)} > {aim}")
    return float(sigma)


def _bisect_sigma(eps, aim: float, tolerance: float, too_low: Exception) -> float:
    """The smallest σ (within ``tolerance`` of ``aim`` in ε) with eps(σ) ≤ aim, ε decreasing in
    σ: doubling from 1 to bracket it, then bisection. Invariant: eps(hi) = eps_hi ≤ aim <
    eps(lo). ``too_low`` is raised when σ would pass ``MAX_NOISE_MULTIPLIER``."""
    lo, hi = 0.0, 1.0
    eps_hi = eps(hi)
    while eps_hi > aim:
        lo, hi = hi, 2 * hi
        if hi > MAX_NOISE_MULTIPLIER:
            raise too_low
        eps_hi = eps(hi)
    while aim - eps_hi > tolerance and hi - lo >= 1e-9:
        mid = (lo + hi) / 2
        eps_mid = eps(mid)
        if eps_mid > aim:
            lo = mid
        else:
            hi, eps_hi = mid, eps_mid
    return hi


def steps_and_noise(*, method: str, epsilon: float, delta: float, sample_rate: float, steps: int | None,
                    noise_multiplier: float | None, compositions_per_step: int = 1, cap: int | None = None,
                    mechanism: str = POISSON) -> tuple[float, int]:
    """(σ, T) of a method that fixes its steps T (σ calibrated for the target), or its noise
    σ (T: as many steps as the target allows, at most ``cap``), or both (the ledger then
    refuses a pair that exceeds the target). Each of the T steps is
    ``compositions_per_step`` mechanisms in the accounting; T counts method steps. A noise
    multiplier, step count or rate no plan can use is refused first (``check_plan_inputs``)."""
    check_plan_inputs(sample_rate=sample_rate, steps=steps, noise_multiplier=noise_multiplier)
    per = compositions_per_step
    if steps is not None and noise_multiplier is None:
        sigma = calibrate_noise(epsilon=epsilon, delta=delta, sample_rate=sample_rate, steps=steps * per,
                                mechanism=mechanism)
        return sigma, steps
    if noise_multiplier is not None and steps is None:
        t = steps_for_budget(epsilon=epsilon, delta=delta, sample_rate=sample_rate,
                             noise_multiplier=noise_multiplier, mechanism=mechanism) // per
        if cap is not None:
            t = min(t, cap)
        if t == 0:
            raise UserError(f"noise multiplier {noise_multiplier} allows no step at ε={epsilon}; raise the noise")
        return noise_multiplier, t
    if noise_multiplier is not None and steps is not None:
        return noise_multiplier, steps
    raise UserError(f"'{method}' needs either steps or noise_multiplier set (--set steps=N)")


def release_shares(weights: str, what: str = "two numbers", unused: int | None = None) -> tuple[float, ...]:
    """A setting "w1,w2,…" of release weights as shares summing to 1 (as given when they sum
    to 0: the caller refuses them); an unparsable one is a ValueError that names ``what``.
    ``unused``: the index of a release the run does not make (its weight 0 before the sum),
    when the setting has it."""
    try:
        w = [float(x) for x in weights.split(",")]
    except ValueError:
        raise ValueError(f"weights must be {what}, got {weights!r}") from None
    if unused is not None and unused < len(w):
        w[unused] = 0.0
    return tuple(x / sum(w) for x in w) if sum(w) > 0 else tuple(w)


def gaussian_releases(*, epsilon: float, delta: float, shares: dict[str, float]) -> list[PrivacyPart]:
    """One-shot Gaussian releases on the whole dataset (sample rate 1, one step each) that
    share one calibrated noise: the RDP of a release is α/(2σ_k²), so parts with
    1/σ_k² = w_k/σ² (Σ w_k = 1) compose exactly to the single release at σ calibrated for
    the target. Parts with share 0 are left out."""
    total = sum(shares.values())
    sigma = calibrate_noise(epsilon=epsilon, delta=delta, sample_rate=1.0, steps=1)
    # (1 + 1e-9): the parts' RDP sums to the calibrated one up to rounding, never above it
    return [PrivacyPart(name, sigma / math.sqrt(w / total) * (1 + 1e-9), 1.0, 1) for name, w in shares.items() if w > 0]


def steps_for_budget(*, epsilon: float, delta: float, sample_rate: float, noise_multiplier: float,
                     max_steps: int = 10_000_000, mechanism: str = POISSON) -> int:
    """Largest number of steps whose RDP ε at this noise is ≤ target ("train until the
    budget is spent"). 0 when even one step exceeds it."""
    _check_target(epsilon, delta)
    check_plan_inputs(sample_rate=sample_rate, noise_multiplier=noise_multiplier)
    aim = _aim(epsilon, mechanism)

    def eps(t: int) -> float:
        return compose_rdp([PrivacyPart("check", noise_multiplier, sample_rate, t, mechanism=mechanism)],
                           delta)

    if eps(1) > aim:
        return 0
    lo, hi = 1, 2
    while hi <= max_steps and eps(hi) <= aim:
        lo, hi = hi, hi * 2
    hi = min(hi, max_steps + 1)
    while hi - lo > 1:  # invariant: eps(lo) <= target < eps(hi)
        mid = (lo + hi) // 2
        if eps(mid) <= aim:
            lo = mid
        else:
            hi = mid
    return lo


def check_plan_inputs(*, sample_rate: float | None = None, steps: int | None = None,
                      noise_multiplier: float | None = None, part: str | None = None) -> None:
    """Refuse, before any search, what no plan can use: a sample rate outside (0, 1], fewer
    than one step, a noise multiplier that is not a positive finite number (a negative σ
    sends the RDP series past any number of terms). One line each (``UserError``)."""
    of = f" of part '{part}'" if part else ""
    if sample_rate is not None and not 0 < sample_rate <= 1:
        raise UserError(f"the sample rate{of} must be in (0, 1], got {sample_rate}")
    if steps is not None and not (steps >= 1 and math.isfinite(steps)):
        raise UserError(f"the number of steps{of} must be ≥ 1, got {steps}")
    if noise_multiplier is not None and not (noise_multiplier > 0 and math.isfinite(noise_multiplier)):
        raise UserError(f"the noise multiplier{of} must be a positive finite number, got {noise_multiplier}")


def _check_target(epsilon: float, delta: float) -> None:
    if not (epsilon > 0) or not math.isfinite(epsilon):
        raise UserError(f"epsilon must be a positive finite number, got {epsilon}")
    if not (0 < delta < 1):
        raise UserError(f"delta must be in (0, 1), got {delta}")
