"""Opacus' RDP of the Poisson subsampled Gaussian mechanism at many orders at once.

Opacus (``opacus.accountants.analysis.rdp``) computes the RDP of one step at one order
``α`` with a pure-Python series (Mironov, Talwar, Zhang, "Rényi Differential Privacy of
the Sampled Gaussian Mechanism", 2019, §3.3): for an integer α the sum over i = 0 … α of
C(α, i) qⁱ (1−q)^(α−i) exp((i² − i)/(2σ²)); for a fractional α two series of terms with
log-erfc factors, summed until both terms fall below e⁻³⁰. Every calibration evaluates
it at ~150 orders for each σ its search tries, one Python loop iteration per term: DPAF's
plan on mnist-5k (27 calibrations) spent ~15 of its ~19 s there.

This module evaluates **the same series** (the same terms, formulas and stopping rule,
term for term) as NumPy arrays over all orders and terms at once; the only difference is
the order of the floating-point additions (one log-sum-exp instead of Opacus' running
``_log_add`` / ``_log_sub``), so the values agree with Opacus' to ~1e-13 relative
(tests/unit/test_rdp_orders.py checks a grid of (q, σ, α) against Opacus' own functions,
and that the calibrated noise of every preset is unchanged). ``dpgen_bench.privacy.accounting``
installs :func:`compute_rdp` where Opacus' accountant looks it up, so Opacus' RDP
accountant, its RDP → (ε, δ) conversion and its noise search run as they are, on these
values.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np
from opacus.accountants.analysis.rdp import _log_erfc  # log erfc(x) by log_ndtr: takes arrays as they are
from scipy import special

_STOP = -30.0  # Opacus' stopping rule of the fractional series: both terms below e⁻³⁰
_FIRST_TERMS = 64
_MAX_TERMS = 1 << 24  # Opacus has no cap; q = 1/2 with a large σ needs ~10⁶ terms at α = 1.1


def compute_rdp(*, q: float, noise_multiplier: float, steps: int, orders: float | Sequence[float]):
    """Drop-in for ``opacus.accountants.analysis.rdp.compute_rdp``: the RDP of ``steps``
    Poisson subsampled Gaussian steps at each order (a float in, a float out)."""
    if isinstance(orders, float):
        return float(rdp_orders(q, noise_multiplier, [orders])[0]) * steps
    return rdp_orders(q, noise_multiplier, orders) * steps


def rdp_orders(q: float, sigma: float, orders: Sequence[float]) -> np.ndarray:
    """RDP of one step at each of ``orders`` (Opacus' ``_compute_rdp`` order by order). A rate
    outside [0, 1] or a negative or NaN σ is a ValueError: the series would not converge."""
    if not (0 <= q <= 1 and sigma >= 0):
        raise ValueError(f"the RDP of the subsampled Gaussian needs q in [0, 1] and σ ≥ 0, got q={q}, σ={sigma}")
    alphas = np.asarray(orders, dtype=float).reshape(-1)
    if q == 0:
        return np.zeros(len(alphas))
    if sigma == 0:
        return np.full(len(alphas), np.inf)
    if q == 1.0:
        return alphas / (2 * sigma**2)
    out = np.full(len(alphas), np.inf)  # α = ∞ stays ∞
    finite = np.isfinite(alphas)
    integer = finite & (alphas == np.floor(alphas))
    frac = finite & ~integer
    if integer.any():
        out[integer] = _log_a_int(q, sigma, alphas[integer].astype(np.int64)) / (alphas[integer] - 1)
    if frac.any():
        out[frac] = _log_a_frac(q, sigma, alphas[frac]) / (alphas[frac] - 1)
    return out


def _log_a_int(q: float, sigma: float, alphas: np.ndarray) -> np.ndarray:
    """log A_α for integer orders (Opacus' ``_compute_log_a_for_int_alpha``)."""
    out = np.empty(len(alphas))
    groups = np.ceil(np.log2(alphas)).astype(int)  # orders of similar size share a table (i ≤ max α)
    for g in np.unique(groups):
        rows = np.flatnonzero(groups == g)
        log_binom, i, a = _int_table(tuple(int(x) for x in alphas[rows]))
        s = log_binom + i * math.log(q) + (a - i) * math.log(1 - q) + (i * i - i) / (2 * (sigma**2))
        out[rows] = _logsumexp_rows(s)  # the terms i > α are −∞ in log_binom
    return out


@functools.lru_cache(maxsize=64)
def _int_table(alphas: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """log C(α, i) for i = 0 … max α (−∞ past α), i and α as float arrays: independent of q, σ."""
    i = np.arange(max(alphas) + 1, dtype=float)[None, :]
    a = np.asarray(alphas, dtype=float)[:, None]
    with np.errstate(divide="ignore"):  # C(α, i) = 0 for i > α
        log_binom = np.log(special.binom(a, i))
    for arr in (log_binom, i, a):
        arr.flags.writeable = False
    return log_binom, i, a


def _log_a_frac(q: float, sigma: float, alphas: np.ndarray) -> np.ndarray:
    """log A_α for fractional orders (Opacus' ``_compute_log_a_for_frac_alpha``): terms
    i = 0, 1, … up to and including the first whose two parts are both below e⁻³⁰.

    Terms come in blocks (64, 128, 256, … of them); an order leaves once its stopping term
    is found (large orders stop within a few terms, α near 1 may need thousands), and the
    signed sums are carried from block to block with a running maximum."""
    z0 = sigma**2 * math.log(1 / q - 1) + 0.5
    log_q, log_1q = math.log(q), math.log(1 - q)
    key = tuple(alphas.tolist())
    sums = [_SignedSum(len(alphas)), _SignedSum(len(alphas))]
    rows = np.arange(len(alphas))  # the orders still summing
    start, size = 0, _FIRST_TERMS
    while rows.size:
        if start >= _MAX_TERMS:  # Opacus would loop on; so many terms mean σ or q far outside any use
            raise ValueError(f"RDP series for q={q}, σ={sigma} does not fall below e^{_STOP:g} within "
                             f"{start} terms")
        log_coef, sign, i = (t[rows] if t.shape[0] > 1 else t for t in _frac_block(key, start, size))
        a = alphas[rows][:, None]
        j = a - i
        log_t0 = log_coef + i * log_q + j * log_1q
        log_t1 = log_coef + j * log_q + i * log_1q
        log_e0 = math.log(0.5) + _log_erfc((i - z0) / (math.sqrt(2) * sigma))
        log_e1 = math.log(0.5) + _log_erfc((z0 - j) / (math.sqrt(2) * sigma))
        log_s0 = log_t0 + (i * i - i) / (2 * (sigma**2)) + log_e0
        log_s1 = log_t1 + (j * j - j) / (2 * (sigma**2)) + log_e1
        stop = np.maximum(log_s0, log_s1) < _STOP
        done = stop.any(axis=1)
        first = np.where(done, stop.argmax(axis=1), size)  # the stopping term is included (do … until)
        used = np.arange(size)[None, :] <= first[:, None]
        sums[0].add(rows, np.where(used, log_s0, -np.inf), sign)
        sums[1].add(rows, np.where(used, log_s1, -np.inf), sign)
        rows = rows[~done]
        start, size = start + size, min(2 * size, 1 << 16)
    return np.logaddexp(sums[0].log(), sums[1].log())


class _SignedSum:
    """Per row, Σ sign·exp(log_s) over blocks of terms, as max · (scaled sum)."""

    def __init__(self, n: int):
        self.m = np.full(n, -np.inf)
        self.total = np.zeros(n)

    def add(self, rows: np.ndarray, log_s: np.ndarray, sign: np.ndarray) -> None:
        m_old = self.m[rows]
        m = np.maximum(m_old, log_s.max(axis=1))
        safe = np.where(np.isfinite(m), m, 0.0)
        with np.errstate(invalid="ignore"):
            kept = np.where(np.isfinite(m_old), self.total[rows] * np.exp(m_old - safe), 0.0)
        self.total[rows] = kept + (sign * np.exp(log_s - safe[:, None])).sum(axis=1)
        self.m[rows] = m

    def log(self) -> np.ndarray:
        if (self.total < 0).any():  # as Opacus' _log_sub: the series' sum cannot be negative
            raise ValueError("The result of subtraction must be non-negative.")
        with np.errstate(divide="ignore"):
            return np.where(np.isfinite(self.m), self.m + np.log(self.total), -np.inf)


@functools.lru_cache(maxsize=256)
def _frac_block(alphas: tuple[float, ...], start: int, size: int) -> tuple[np.ndarray, ...]:
    """log |C(α, i)|, its sign (Opacus adds a term with C(α, i) > 0, else subtracts it) and i
    for i = start … start + size − 1, every order a row: independent of q, σ."""
    i = np.arange(start, start + size, dtype=float)[None, :]
    coef = special.binom(np.asarray(alphas, dtype=float)[:, None], i)
    with np.errstate(divide="ignore"):
        log_coef = np.log(np.abs(coef))
    sign = np.where(coef > 0, 1.0, -1.0)
    for arr in (log_coef, sign, i):
        arr.flags.writeable = False
    return log_coef, sign, i


def _logsumexp_rows(s: np.ndarray) -> np.ndarray:
    """``scipy.special.logsumexp(s, axis=1)`` for rows whose first term is finite (i = 0 always
    is here), without its argument checks: those were a third of the integer orders' time."""
    m = s.max(axis=1, keepdims=True)
    return m[:, 0] + np.log(np.exp(s - m).sum(axis=1))
