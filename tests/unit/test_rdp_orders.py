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
    import dpgen_bench.privacy.accounting  # noqa: F401 - installs ours, keeps Opacus' own beside it
    from opacus.accountants.analysis.rdp import opacus_compute_rdp

    from dpgen_bench.privacy.rdp_orders import compute_rdp, rdp_orders

    orders = [1.5, 2.0, 32.0, math.inf]
    for q, sigma in ((0.0, 1.0), (0.3, 0.0), (1.0, 1.7), (0.3, 1.7)):
        got = rdp_orders(q, sigma, orders)
        want = _opacus(q, sigma, orders)
        _assert_matches(got, want)
    assert rdp_orders(1.0, 2.0, [3.0])[0] == 3.0 / 8.0
    for one in ([3.0], [2.5], [700.0]):  # one order alone: one table, one block
        _assert_matches(rdp_orders(0.3, 1.7, one), _opacus(0.3, 1.7, one))
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


def test_orders_that_stop_at_different_terms_and_the_cap(monkeypatch):
    """Two fractional orders, one stopping within the first block and one thousands of terms
    later (each order's own rows of the term tables once the other has left), and a
    series that does not stop within the cap: one clear error, never a truncated sum."""
    from dpgen_bench.privacy import rdp_orders as ro

    orders = [1.1, 10.5]
    _assert_matches(ro.rdp_orders(0.016, 1.1, orders), _opacus(0.016, 1.1, orders))
    monkeypatch.setattr(ro, "_MAX_TERMS", 64)
    with pytest.raises(ValueError, match=r"q=0.016, σ=1.1 does not fall below e\^-30 within 64 terms"):
        ro.rdp_orders(0.016, 1.1, orders)


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


def test_signed_sums_carry_across_blocks_whose_maximum_grows():
    """The running sum rescales what it holds when a later block has larger terms (the
    series' terms peak early, so no RDP test reaches this): the same value as one
    log-sum-exp over all terms, for rows that join late or leave early."""
    from dpgen_bench.privacy.rdp_orders import _SignedSum

    g = np.random.default_rng(0)
    blocks = [g.normal(-5, 2, (3, 8)), g.normal(3, 2, (3, 8)), g.normal(-40, 1, (3, 8))]
    signs = [np.where(g.random((3, 8)) < 0.2, -1.0, 1.0) for _ in blocks]
    signs[1][:] = 1.0  # the largest terms positive: the sum is too
    s = _SignedSum(3)
    for b, sg in zip(blocks, signs):
        s.add(np.arange(3), b, sg)
    want = np.log((np.concatenate(signs, 1) * np.exp(np.concatenate(blocks, 1))).sum(1))
    np.testing.assert_allclose(s.log(), want, rtol=1e-12)
    empty = _SignedSum(2)  # a row that never got a term sums to 0: log −∞
    empty.add(np.array([0]), blocks[0][:1], np.ones((1, 8)))
    assert empty.log()[1] == -np.inf
    late = _SignedSum(2)  # row 1 joins in the second block, row 0 leaves after it
    late.add(np.array([0]), blocks[0][:1], np.ones((1, 8)))
    late.add(np.array([0, 1]), blocks[1][:2], np.ones((2, 8)))
    late.add(np.array([1]), blocks[2][1:2], np.ones((1, 8)))
    np.testing.assert_allclose(late.log(), [np.logaddexp.reduce(np.r_[blocks[0][0], blocks[1][0]]),
                                            np.logaddexp.reduce(np.r_[blocks[1][1], blocks[2][1]])], rtol=1e-12)


def test_a_negative_series_sum_is_an_error_as_in_opacus():
    """Opacus' ``_log_sub`` refuses a sum that would go negative; so does ours."""
    from dpgen_bench.privacy.rdp_orders import _SignedSum

    s = _SignedSum(1)
    s.add(np.array([0]), np.array([[0.0, 0.5]]), np.array([[1.0, -1.0]]))
    with pytest.raises(ValueError, match="^The result of subtraction must be non-negative.$"):
        s.log()
    half = _SignedSum(1)  # a sum below its largest term is fine: 1 − 1/2
    half.add(np.array([0]), np.array([[0.0, math.log(0.5)]]), np.array([[1.0, -1.0]]))
    assert half.log()[0] == pytest.approx(math.log(0.5), rel=1e-12)


def test_fractional_orders_are_the_divergence_itself():
    """Independent of both series: A_α = E_{z~N(0,σ²)}[(μ(z)/μ₀(z))^α] integrated numerically
    (mpmath, 30 digits; μ = (1−q)·N(0,σ²) + q·N(1,σ²)) equals our fractional-order RDP, and
    dp-accounting's (0.6) is above it: its series adds |C(α, i)|-weighted terms where the
    exact series subtracts those with C(α, i) < 0, an upper bound, not the value (its ε is
    the same where the best order is an integer, larger where it is fractional; see
    docs/privacy.md)."""
    mp = pytest.importorskip("mpmath")
    from dpgen_bench.privacy.rdp_orders import rdp_orders

    mp.mp.dps = 30
    for q, sigma, alpha in ((0.05, 0.4773, 1.6), (0.016, 1.1, 1.1), (0.3, 1.0, 2.5)):
        q_, s_, a_ = mp.mpf(q), mp.mpf(sigma), mp.mpf(alpha)

        def integrand(z):
            mu0 = mp.npdf(z, 0, s_)
            return mu0 * (((1 - q_) * mu0 + q_ * mp.npdf(z, 1, s_)) / mu0) ** a_

        exact = float(mp.log(mp.quad(integrand, [-mp.inf, -10, 0, 0.5, 1, 10, mp.inf])) / (a_ - 1))
        ours = rdp_orders(q, sigma, [alpha])[0]
        assert ours == pytest.approx(exact, rel=1e-9)
        dpa = pytest.importorskip("dp_accounting.rdp.rdp_privacy_accountant")
        assert dpa._compute_rdp_poisson_subsampled_gaussian(q, sigma, [alpha])[0] > exact * (1 + 1e-3)


@pytest.mark.parametrize("eps,q,steps", [(1, 64 / 1437, 1500), (10, 64 / 1437, 1500), (50, 0.05, 500)])
def test_calibrated_epsilon_against_dp_accounting(eps, q, steps):
    """dp-accounting's RDP accountant on the same part and orders: the same ε where its best
    order is an integer (ε = 1: order 18), a larger one by its fractional-order bound where
    it is not (ε = 10: +2e-4 relative at order 3.2; ε = 50: +7 % at order 1.6); never
    below ours by more than rounding."""
    dpa = pytest.importorskip("dp_accounting")
    from dpgen_bench.api import PrivacyPart
    from dpgen_bench.privacy.accounting import _ORDERS, calibrate_noise, compose_rdp

    sigma = calibrate_noise(epsilon=eps, delta=1e-5, sample_rate=q, steps=steps)
    ours = compose_rdp([PrivacyPart("p", sigma, q, steps)], 1e-5)
    acc = dpa.rdp.RdpAccountant(orders=list(_ORDERS))
    acc.compose(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(sigma)), steps)
    theirs, order = acc.get_epsilon_and_optimal_order(1e-5)
    assert ours <= eps and theirs >= ours * (1 - 1e-9)
    if float(order).is_integer():
        assert theirs == pytest.approx(ours, rel=1e-9)
    else:
        assert theirs <= ours * 1.1
