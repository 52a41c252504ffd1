"""``dpgen_bench.privacy.rdp_orders``: Opacus' RDP series of the Poisson subsampled Gaussian,
evaluated for all orders at once, against Opacus' own per-order functions (the reference),
and the calibrations built on it against the same calibrations on Opacus' functions."""

import math

import numpy as np
import pytest


def _opacus(q, sigma, orders):
    """Opacus' own value at each order (its per-order function, unchanged)."""
    from opacus.accountants.analysis import rdp as R

    return np.array([R._compute_rdp(q, sigma, a) for a in orders], dtype=float)


def _assert_matches(got, want):
    """Equal infinities; finite values within Opacus' own rounding: its running log-sums
    and our one log-sum-exp differ by ~1e-9 relative where the series cancels (A_α ≈ 1),
    ~1e-14 absolute where the RDP itself is ~0."""
    assert np.array_equal(np.isinf(got), np.isinf(want))
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-8, atol=1e-12)


@pytest.mark.parametrize("q", [1e-5, 1e-3, 0.016, 0.2, 0.45, 0.8, 0.999])
def test_every_order_equals_opacus_series(q):
    """Fractional and integer orders (the accountant's own grid plus the integer orders of
    WOR compositions), small to large noise: the same values as Opacus'."""
    from dpgen_bench.privacy.accounting import _ORDERS
    from dpgen_bench.privacy.rdp_orders import rdp_orders

    orders = [*_ORDERS, 1.01, 1.5, 2.0, 100.0, 700.0]
    for sigma in (0.4, 0.9, 2.0, 7.0, 60.0):
        _assert_matches(rdp_orders(q, sigma, orders), _opacus(q, sigma, orders))


def test_the_special_cases_are_opacus_own():
    """q = 0 (nothing leaks), σ = 0 (no privacy), q = 1 (the Gaussian mechanism α/2σ²), α = ∞,
    a scalar order in and out, and ``steps`` multiplying every order."""
    from opacus.accountants.analysis.rdp import opacus_compute_rdp

    from dpgen_bench.privacy.rdp_orders import compute_rdp, rdp_orders

    orders = [1.5, 2.0, 32.0, math.inf]
    for q, sigma in ((0.0, 1.0), (0.3, 0.0), (1.0, 1.7), (0.3, 1.7)):
        got = rdp_orders(q, sigma, orders)
        want = _opacus(q, sigma, orders)
        _assert_matches(got, want)
    assert rdp_orders(1.0, 2.0, [3.0])[0] == 3.0 / 8.0
    assert isinstance(compute_rdp(q=0.1, noise_multiplier=1.3, steps=7, orders=2.5), float)
    for order in (2.5, [1.5, 4.0, 40.0]):
        np.testing.assert_allclose(compute_rdp(q=0.1, noise_multiplier=1.3, steps=7, orders=order),
                                   opacus_compute_rdp(q=0.1, noise_multiplier=1.3, steps=7, orders=order),
                                   rtol=1e-9)


def test_a_series_that_needs_many_terms_is_summed_to_opacus_stopping_term():
    """q near 1/2 with a large σ: the fractional series decays only as i^−(α+1), and Opacus
    sums thousands of terms before both fall below e⁻³⁰; ours carries its sums across
    blocks of terms to the same stopping term (a block boundary moved or the stopping term
    left out changes the value)."""
    from dpgen_bench.privacy.rdp_orders import rdp_orders

    orders = [1.1, 1.3, 2.5]
    _assert_matches(rdp_orders(0.45, 30.0, orders), _opacus(0.45, 30.0, orders))


def test_opacus_accountant_and_noise_search_run_on_it_unchanged(monkeypatch):
    """accounting.py installs the vectorised series where Opacus' accountant looks it up;
    with Opacus' own series put back, its RDPAccountant gives the same ε and its noise search
    (and ours, for the harness' targets) the same σ."""
    from opacus.accountants import RDPAccountant
    from opacus.accountants.analysis import rdp as R

    from dpgen_bench.privacy import accounting
    from dpgen_bench.privacy.rdp_orders import compute_rdp

    assert R.compute_rdp is compute_rdp and R.opacus_compute_rdp is not compute_rdp

    def run():
        acc = RDPAccountant()
        acc.history = [(1.1, 0.016, 900), (3.0, 0.3, 40)]
        eps = acc.get_epsilon(delta=1e-5, alphas=accounting._ORDERS)
        sigmas = [accounting.calibrate_noise(epsilon=e, delta=1e-5, sample_rate=q, steps=t) for e, q, t in ((1.0, 64 / 1437, 300), (10.0, 0.05, 200), (0.2, 0.3, 30))]
        return eps, sigmas

    ours = run()
    accounting._compose_rdp.cache_clear()
    monkeypatch.setattr(R, "compute_rdp", R.opacus_compute_rdp)
    theirs = run()
    accounting._compose_rdp.cache_clear()
    assert ours[0] == pytest.approx(theirs[0], rel=1e-9)
    assert ours[1] == pytest.approx(theirs[1], rel=1e-9)


def test_a_negative_series_sum_is_an_error_as_in_opacus():
    """Opacus' ``_log_sub`` refuses a sum that would go negative; so does ours."""
    from dpgen_bench.privacy.rdp_orders import _SignedSum

    s = _SignedSum(1)
    s.add(np.array([0]), np.array([[0.0, 0.5]]), np.array([[1.0, -1.0]]))
    with pytest.raises(ValueError, match="non-negative"):
        s.log()
