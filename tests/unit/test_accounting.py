"""Accounting against the accountants and against the paper's published step counts."""

import math

import pytest
from opacus.accountants import RDPAccountant

from dpgen_bench.api import Budget, PrivacyPart
from dpgen_bench.errors import PrivacyViolation, UserError
from dpgen_bench.privacy import PrivacyLedger, calibrate_noise, compose_prv, compose_rdp, steps_for_budget
from dpgen_bench.privacy.accounting import _ORDERS

Q = 64 / 1437


@pytest.mark.parametrize("eps", [0.2, 1.0, 2.0, 10.0])
@pytest.mark.parametrize("delta", [1e-5, 1e-6])
def test_calibrated_noise_spends_at_most_and_close_to_target(eps, delta):
    sigma = calibrate_noise(epsilon=eps, delta=delta, sample_rate=Q, steps=500)
    spent = compose_rdp([PrivacyPart("d", sigma, Q, 500)], delta)
    assert spent <= eps
    assert spent >= 0.95 * eps


def test_known_value_measured_with_opacus():
    # measured with Opacus 1.6 and prv-accountant 0.2: digits, q=64/1437, 500 steps, δ=1e-5 → σ≈4.18 for ε=1,
    # PRV ε≈0.91
    sigma = calibrate_noise(epsilon=1.0, delta=1e-5, sample_rate=Q, steps=500)
    assert sigma == pytest.approx(4.18, abs=0.02)
    prv = compose_prv([PrivacyPart("d", sigma, Q, 500)], 1e-5)
    assert 0.88 < prv < 0.95


def test_composition_of_two_parts_equals_the_accountants():
    a = PrivacyPart("a", 1.1, 0.01, 3000)
    b = PrivacyPart("b", 3.0, 0.05, 700)
    acc = RDPAccountant()
    acc.history = [(1.1, 0.01, 3000), (3.0, 0.05, 700)]
    assert compose_rdp([a, b], 1e-5) == pytest.approx(acc.get_epsilon(1e-5, alphas=_ORDERS), rel=1e-12)
    # composition is worse than either part alone and better than their sum
    ea, eb = compose_rdp([a], 1e-5), compose_rdp([b], 1e-5)
    assert max(ea, eb) < compose_rdp([a, b], 1e-5) < ea + eb


def test_prv_is_tighter_than_rdp_on_a_known_config():
    parts = [PrivacyPart("d", 1.0, 128 / 60000, 450_000)]  # Private GANs §4.1 setting
    rdp, prv = compose_rdp(parts, 1e-5), compose_prv(parts, 1e-5)
    assert rdp <= 10.0
    assert prv < rdp


def test_prv_error_scales_with_small_epsilon():
    # dpaf's MNIST plan at ε = 0.2 (10/40/50 % split): 42.5K steps would get an absolute
    # eps_error of 0.05, and the PRV "upper bound" came out at 0.155, above RDP's 0.123.
    parts = [PrivacyPart("conv1", 8.4375, 0.0004, 20_000), PrivacyPart("conv2", 6.875, 0.0032, 2500),
             PrivacyPart("dpagg", 2.51953125, 0.0004, 20_000)]
    rdp, prv = compose_rdp(parts, 1e-5), compose_prv(parts, 1e-5)
    assert rdp == pytest.approx(0.1235, abs=1e-3)
    assert 0.1045 < prv <= rdp  # estimate 0.1045 (eps_error 0.001 agrees) + at most 0.1·RDP


def test_prv_failure_is_nan_not_a_crash(caplog):
    # prv-accountant raises "Discrete mean differs ..." for σ = 0.5 at q = 0.13 (dpaf's
    # conv2* at ε = 50 on digits); the run must still be recorded on its RDP ε.
    parts = [PrivacyPart("conv2", 0.5023193359375, 0.1336116910229645, 125)]
    assert math.isnan(compose_prv(parts, 1e-5))
    assert "PRV accountant failed" in caplog.text
    assert math.isfinite(compose_rdp(parts, 1e-5))


def test_prv_grid_too_large_for_memory_is_nan_before_allocating(caplog, monkeypatch):
    """dpaf on digits at ε = 1e5 (σ ≈ 0.05): prv-accountant asked for a 34 GB array after
    training had finished, and the run was lost. The grid is sized first and refused."""
    import time

    import dpgen_bench.privacy.accounting as A
    from prv_accountant import PoissonSubsampledGaussianMechanism

    parts = [PrivacyPart("conv1", 0.05, 0.0167, 100), PrivacyPart("conv2", 0.05, 0.1336, 125),
             PrivacyPart("dpagg", 0.05, 0.0167, 1000)]
    t = time.perf_counter()
    assert math.isnan(compose_prv(parts, 1e-5))
    assert time.perf_counter() - t < 10 and "grid would have" in caplog.text
    # the estimate is the accountant's own grid: with the limit lifted, it is what gets built
    prvs = [PoissonSubsampledGaussianMechanism(noise_multiplier=1.0, sampling_probability=0.1)]
    points = A.prv_grid_points(prvs, [50], 0.01, 1e-8)
    built = []
    from prv_accountant import accountant as acc_mod

    orig = acc_mod.Domain.create_aligned

    def spy(t_min, t_max, dt):
        d = orig(t_min, t_max, dt)
        built.append(d._size)
        return d

    monkeypatch.setattr(acc_mod.Domain, "create_aligned", staticmethod(spy))
    acc_mod.PRVAccountant(prvs=prvs, max_self_compositions=[50], eps_error=0.01, delta_error=1e-8)
    assert built and built[0] == pytest.approx(points, rel=0.01)
    # typical runs stay far below the limit (dpgan quick at ε = 1: ~1e5 points)
    quick = [PoissonSubsampledGaussianMechanism(noise_multiplier=4.18, sampling_probability=0.0445)]
    assert A.prv_grid_points(quick, [1500], 0.01, 1e-8) < A.PRV_MAX_GRID_POINTS / 20


# (q, σ): where the series cancels (A_α ≈ 1), tiny and large rates, the runs' usual range
@pytest.mark.parametrize("q, sigma", [(1e-5, 0.5), (1e-5, 50.0), (1e-3, 2.0), (0.0445, 4.18), (0.13, 0.9),
                                      (0.3, 2.0), (0.9, 0.5)])
def test_prv_domain_rdp_is_prv_accountants_own(q, sigma):
    """``compose_prv``'s mechanism answers prv-accountant's ``rdp(α)`` (which sizes its
    domain) from the vectorised series: prv-accountant's own values at every order it asks
    for, and the same domain. Where the series cancels (A_α ≈ 1) both round differently at
    ~1e-14 absolute."""
    import dpgen_bench.privacy.accounting as A
    from prv_accountant import PoissonSubsampledGaussianMechanism
    from prv_accountant.accountant import compute_safe_domain_size

    ours, theirs = A.poisson_gaussian_prv(q, sigma), PoissonSubsampledGaussianMechanism(q, sigma)
    assert isinstance(ours, PoissonSubsampledGaussianMechanism)
    assert (ours.p, ours.sigma) == (theirs.p, theirs.sigma)
    for a in A._PRV_DOMAIN_ORDERS:
        assert ours.rdp(a) == pytest.approx(theirs.rdp(a), rel=1e-8, abs=1e-12), a
    assert ours.rdp(7.25) == theirs.rdp(7.25)  # an order outside the table: prv-accountant's own
    assert compute_safe_domain_size([ours], [1500], 0.01, 1e-8) == pytest.approx(
        compute_safe_domain_size([theirs], [1500], 0.01, 1e-8), rel=1e-10)


def test_prv_epsilon_is_unchanged_by_the_vectorised_domain(monkeypatch):
    import dpgen_bench.privacy.accounting as A
    from prv_accountant import PoissonSubsampledGaussianMechanism

    parts = [PrivacyPart("a", 1.2, 0.02, 100), PrivacyPart("b", 2.0, 0.05, 50)]
    ours = compose_prv(parts, 1e-5)
    monkeypatch.setattr(A, "poisson_gaussian_prv", lambda q, s: PoissonSubsampledGaussianMechanism(q, s))
    assert ours == pytest.approx(compose_prv(parts, 1e-5), rel=1e-10)


def test_steps_for_budget_is_the_largest_admissible():
    t = steps_for_budget(epsilon=2.0, delta=1e-5, sample_rate=Q, noise_multiplier=1.5)
    eps = lambda n: compose_rdp([PrivacyPart("d", 1.5, Q, n)], 1e-5)  # noqa: E731
    assert eps(t) <= 2.0 < eps(t + 1)


@pytest.mark.parametrize("eps,sigma,paper_steps", [(10, 2.0, 174_000), (1, 14.0, 165_000)])
def test_paper_step_counts(eps, sigma, paper_steps):
    # Private GANs Table 7: MNIST, B=512 → T=174K (σ=2, ε=10) and 165K (σ=14, ε=1).
    t = steps_for_budget(epsilon=eps, delta=1e-5, sample_rate=512 / 60000, noise_multiplier=sigma)
    assert t == pytest.approx(paper_steps, rel=0.03)


def test_ledger_refuses_overspending_and_undeclared_parts():
    budget = Budget(1.0, 1e-5)
    sigma = calibrate_noise(epsilon=1.0, delta=1e-5, sample_rate=Q, steps=10)
    ledger = PrivacyLedger(budget, [PrivacyPart("d", sigma, Q, 10)])
    ledger.spend("d", 10)
    with pytest.raises(PrivacyViolation):
        ledger.spend("d")
    with pytest.raises(PrivacyViolation):
        ledger.spend("other")
    rep = ledger.report()
    assert rep.parts[0].steps == 10 and rep.epsilon_rdp <= 1.0


def test_ledger_refuses_a_plan_over_target():
    with pytest.raises(PrivacyViolation):
        PrivacyLedger(Budget(1.0, 1e-5), [PrivacyPart("d", 0.5, Q, 1000)])


def test_report_counts_steps_actually_taken():
    sigma = calibrate_noise(epsilon=1.0, delta=1e-5, sample_rate=Q, steps=100)
    ledger = PrivacyLedger(Budget(1.0, 1e-5), [PrivacyPart("d", sigma, Q, 100)])
    ledger.spend("d", 40)
    partial = ledger.report()
    full = PrivacyLedger(Budget(1.0, 1e-5), [PrivacyPart("d", sigma, Q, 100)]).planned_report()
    assert partial.parts[0].steps == 40
    assert partial.epsilon_rdp < full.epsilon_rdp <= 1.0


@pytest.mark.parametrize("eps,delta", [(0, 1e-5), (-1, 1e-5), (math.inf, 1e-5), (1, 0), (1, 1.0)])
def test_invalid_targets_are_user_errors(eps, delta):
    with pytest.raises(UserError):
        calibrate_noise(epsilon=eps, delta=delta, sample_rate=Q, steps=10)


# ----------------------------------------------------------- an ε out of reach


def test_an_unreachable_epsilon_is_budget_too_low_a_user_error():
    from dpgen_bench.errors import BudgetTooLow, UserError

    for mechanism in ("subsampled_gaussian", "subsampled_gaussian_wor"):
        with pytest.raises(BudgetTooLow, match="privacy budget is too low") as e:
            calibrate_noise(epsilon=1e-3, delta=1e-5, sample_rate=Q, steps=1500, mechanism=mechanism)
        assert isinstance(e.value, UserError) and isinstance(e.value, ValueError)


@pytest.mark.parametrize("mechanism,q", [("subsampled_gaussian", Q), ("subsampled_gaussian_wor", 1 / 16)])
def test_reachability_only_answers_as_the_full_calibration(mechanism, q):
    """Around the smallest reachable ε, the shortcut raises exactly when the calibration does."""
    from dpgen_bench.errors import BudgetTooLow
    from dpgen_bench.privacy.accounting import reachability_only

    def reachable(eps, shortcut):
        try:
            if shortcut:
                with reachability_only():
                    calibrate_noise(epsilon=eps, delta=1e-5, sample_rate=q, steps=600, mechanism=mechanism)
            else:
                calibrate_noise(epsilon=eps, delta=1e-5, sample_rate=q, steps=600, mechanism=mechanism)
        except BudgetTooLow:
            return False
        return True

    grid = [1e-3 * 1.25 ** k for k in range(12)]
    answers = [reachable(e, True) for e in grid]
    assert answers[0] is False and answers[-1] is True
    edge = answers.index(True)
    for e in grid[max(0, edge - 1):edge + 1]:  # the two ε beside the edge, fully calibrated
        assert reachable(e, False) == reachable(e, True), e


def test_smallest_feasible_epsilon_is_feasible_and_one_percent_less_is_not():
    from dpgen_bench import registry
    from dpgen_bench.api import Budget, DataInfo
    from dpgen_bench.errors import BudgetTooLow
    from dpgen_bench.runner import smallest_feasible_epsilon

    cls = registry.methods.get("dummy")
    method = cls(cls.Hparams(steps=50), DataInfo("digits", (1, 16, 16), 10, 1437))
    smallest = smallest_feasible_epsilon(method, Budget(1e-4, 1e-5))
    method.plan(Budget(smallest, 1e-5))
    with pytest.raises(BudgetTooLow):
        method.plan(Budget(smallest * 0.99, 1e-5))


def test_gaussian_releases_split_one_calibrated_noise_by_share():
    """dpmean / dpmerf's budget split (found by make mutate: a share read as w·total instead
    of w/total, twice the noise, or a second step all passed every test): shares that do not
    sum to 1, each part's 1/σ² proportional to its share, zero shares left out, and the parts
    compose to the one release calibrated for the target (within 0.1 %, never above)."""
    from dpgen_bench.privacy.accounting import calibrate_noise, compose_rdp, gaussian_releases

    eps, delta = 2.0, 1e-5
    parts = gaussian_releases(epsilon=eps, delta=delta, shares={"means": 3.0, "counts": 1.0, "unused": 0.0})
    assert [p.name for p in parts] == ["means", "counts"]
    assert all(p.sample_rate == 1.0 and p.steps == 1 for p in parts)
    means, counts = parts
    assert counts.noise_multiplier ** 2 / means.noise_multiplier ** 2 == pytest.approx(3.0, rel=1e-9)
    sigma = calibrate_noise(epsilon=eps, delta=delta, sample_rate=1.0, steps=1)
    assert means.noise_multiplier == pytest.approx(sigma / math.sqrt(0.75), rel=1e-6)
    composed = compose_rdp(parts, delta)
    assert compose_rdp([PrivacyPart("one", sigma, 1.0, 1)], delta) * (1 - 1e-3) <= composed <= eps


@pytest.mark.parametrize("mechanism", ["subsampled_gaussian", "subsampled_gaussian_wor"])
def test_steps_for_budget_is_the_largest_count_within_the_target(mechanism):
    """Train-until-spent (found by make mutate: returning 1 when not even one step fits, the
    WOR margin dropped, or an off-by-one at max_steps all passed): T steps fit, T + 1 do not,
    for WOR within the calibration margin; 0 when one step is already too many; max_steps caps
    it exactly."""
    from dpgen_bench.privacy.accounting import WOR, _WOR_MARGIN

    eps, delta, q, sigma = 3.0, 1e-5, 0.05, 1.2
    aim = eps * (1 - _WOR_MARGIN) if mechanism == WOR else eps

    def spent(t):
        return compose_rdp([PrivacyPart("p", sigma, q, t, mechanism=mechanism)], delta)

    t = steps_for_budget(epsilon=eps, delta=delta, sample_rate=q, noise_multiplier=sigma, mechanism=mechanism)
    assert t > 1 and spent(t) <= aim < spent(t + 1)
    assert steps_for_budget(epsilon=eps, delta=delta, sample_rate=q, noise_multiplier=sigma, mechanism=mechanism,
                            max_steps=t - 1) == t - 1
    assert steps_for_budget(epsilon=eps, delta=delta, sample_rate=q, noise_multiplier=sigma, mechanism=mechanism,
                            max_steps=t) == t
    one = spent(1)
    assert steps_for_budget(epsilon=one * 0.99, delta=delta, sample_rate=q, noise_multiplier=sigma,
                            mechanism=mechanism) == 0
    # exactly one step fits
    assert steps_for_budget(epsilon=(one + spent(2)) / 2 / (1 - _WOR_MARGIN), delta=delta, sample_rate=q,
                            noise_multiplier=sigma, mechanism=mechanism) == 1


# ------------------------------------------------ found by make mutate (accounting.py)


def test_steps_for_budget_keeps_the_wor_margin_under_the_target():
    """A without-replacement part aims ``_WOR_MARGIN`` under the target (autodp's order search
    lands within ~1e-6 of ours, either side): at a target equal to ε after t₀ steps, the WOR
    answer is t₀ − 1, the Poisson answer t₀."""
    from dpgen_bench.privacy.accounting import POISSON, WOR

    for mechanism, want in ((WOR, 39), (POISSON, 40)):
        part = PrivacyPart("p", 1.5, 0.02, 40, mechanism=mechanism)
        target = compose_rdp([part], 1e-5)
        got = steps_for_budget(epsilon=target, delta=1e-5, sample_rate=0.02, noise_multiplier=1.5,
                               mechanism=mechanism)
        assert got == want, mechanism


def test_gaussian_releases_never_compose_above_the_single_calibrated_release():
    """The shares of one Gaussian release compose to that release's RDP up to rounding, and the
    (1 + 1e-9) on each σ keeps the rounding on the private side."""
    from dpgen_bench.privacy.accounting import gaussian_releases

    for shares in ({"a": 1, "b": 1}, {"a": 0.1, "b": 0.3, "c": 0.6}, {"a": 1, "b": 0, "c": 2}):
        sigma = calibrate_noise(epsilon=2.0, delta=1e-5, sample_rate=1.0, steps=1)
        parts = gaussian_releases(epsilon=2.0, delta=1e-5, shares=shares)
        assert [p.name for p in parts] == [k for k, w in shares.items() if w > 0]
        single = compose_rdp([PrivacyPart("all", sigma, 1.0, 1)], 1e-5)
        assert compose_rdp(parts, 1e-5) <= single <= 2.0


def test_privacy_profile_keeps_epsilons_below_one():
    """The profile is the accountant's ε at each δ′, clipped at 0 only (a small run's ε < 1 is
    certified as it is)."""
    from dpgen_bench.privacy.accounting import privacy_profile

    parts = (PrivacyPart("p", 3.0, 0.01, 50),)
    profile = privacy_profile(parts, 1e-5, (1e-3, 1e-5))
    assert [d for _, d in profile] == [1e-5, 1e-3]
    for e, d in profile:
        assert e == pytest.approx(compose_rdp(list(parts), d)) and 0 < e < 1


def test_fmt_eps():
    from dpgen_bench.privacy.accounting import fmt_eps

    assert fmt_eps(float("nan")) == "n/a" and fmt_eps(float("inf")) == "∞"
    assert fmt_eps(1.23456) == "1.23" and fmt_eps(0.998, ".2f") == "1.00"


# ------------------------------------------------------- steps_and_noise (make mutate)


def test_steps_and_noise_with_a_fixed_noise_gives_whole_method_steps_within_the_target():
    """A method that fixes σ gets as many whole method steps as the target allows when each
    step is ``per`` mechanisms: T·per compositions fit, (T + 1)·per do not. (``/`` for ``//``
    survived make mutate: a fractional T.)"""
    from dpgen_bench.privacy.accounting import steps_and_noise

    kw = dict(method="m", epsilon=2.0, delta=1e-5, sample_rate=0.02, noise_multiplier=1.3)
    budget_steps = steps_for_budget(epsilon=2.0, delta=1e-5, sample_rate=0.02, noise_multiplier=1.3)
    for per in (1, 3, 7):
        sigma, t = steps_and_noise(steps=None, compositions_per_step=per, **kw)
        assert sigma == 1.3 and isinstance(t, int) and t == budget_steps // per
        assert compose_rdp([PrivacyPart("p", 1.3, 0.02, t * per)], 1e-5) <= 2.0
        assert compose_rdp([PrivacyPart("p", 1.3, 0.02, (t + 1) * per)], 1e-5) > 2.0
    assert steps_and_noise(steps=None, cap=5, **kw) == (1.3, 5)
    assert steps_and_noise(steps=40, **kw) == (1.3, 40)  # both set: the ledger judges the pair


def test_steps_and_noise_refuses_a_noise_that_allows_no_step_and_accepts_one_that_allows_one():
    from dpgen_bench.privacy.accounting import steps_and_noise

    kw = dict(method="m", epsilon=1.0, delta=1e-5, sample_rate=1.0, steps=None)
    with pytest.raises(UserError, match=r"noise multiplier 0.5 allows no step at ε=1.0; raise the noise"):
        steps_and_noise(noise_multiplier=0.5, **kw)
    # the σ of exactly one full-batch step at ε = 1 (a hair above, for the float)
    one = calibrate_noise(epsilon=1.0, delta=1e-5, sample_rate=1.0, steps=1) * 1.001
    sigma, t = steps_and_noise(noise_multiplier=one, **kw)
    assert t >= 1 and compose_rdp([PrivacyPart("p", one, 1.0, t)], 1e-5) <= 1.0
    with pytest.raises(UserError, match="needs either steps or noise_multiplier"):
        steps_and_noise(noise_multiplier=None, **kw)


def test_prv_is_not_reported_when_a_part_that_ran_samples_without_replacement():
    """prv-accountant has no sampling without replacement: a WOR part that took a step, even
    one, makes the PRV ε n/a (NaN); a WOR part that took none does not count. (``> 1`` and
    ``>= 0`` for ``> 0`` survived make mutate.)"""
    from dpgen_bench.privacy.accounting import WOR, WOR_GAUSSIAN

    poisson = PrivacyPart("d", 1.0, 0.01, 200)
    alone = compose_prv([poisson], 1e-5)
    assert 0 < alone < compose_rdp([poisson], 1e-5)
    for mech in (WOR, WOR_GAUSSIAN):
        assert math.isnan(compose_prv([poisson, PrivacyPart("w", 1.0, 0.01, 1, mechanism=mech)], 1e-5))
        assert compose_prv([poisson, PrivacyPart("w", 1.0, 0.01, 0, mechanism=mech)], 1e-5) == pytest.approx(alone)


@pytest.mark.parametrize("epsilon,delta,message", [
    (0.0, 1e-5, "epsilon must be a positive finite number, got 0.0"),
    (-1.0, 1e-5, "epsilon must be a positive finite number, got -1.0"),
    (math.inf, 1e-5, "epsilon must be a positive finite number, got inf"),
    (math.nan, 1e-5, "epsilon must be a positive finite number, got nan"),
    (1.0, 0.0, "delta must be in (0, 1), got 0.0"),
    (1.0, 1.0, "delta must be in (0, 1), got 1.0"),
    (1.0, -1e-5, "delta must be in (0, 1), got -1e-05"),
])
def test_every_calibration_refuses_an_impossible_target_in_one_line(epsilon, delta, message):
    """calibrate_noise, calibrate_beside, steps_for_budget and steps_and_noise check the target
    themselves (a plugin may call them without the CLI's checks): ε > 0 and finite, 0 < δ < 1."""
    from dpgen_bench.privacy.accounting import calibrate_beside, steps_and_noise

    fixed = [PrivacyPart("fixed", 50.0, 1.0, 1)]
    calls = (lambda: calibrate_noise(epsilon=epsilon, delta=delta, sample_rate=0.01, steps=10),
             lambda: calibrate_beside(fixed, epsilon=epsilon, delta=delta, sample_rate=0.01, steps=10),
             lambda: steps_for_budget(epsilon=epsilon, delta=delta, sample_rate=0.01, noise_multiplier=1.0),
             lambda: steps_and_noise(method="m", epsilon=epsilon, delta=delta, sample_rate=0.01, steps=10,
                                     noise_multiplier=None))
    for call in calls:
        with pytest.raises(UserError) as e:
            call()
        assert str(e.value) == message


def test_a_target_just_inside_the_bounds_is_calibrated():
    """ε below 1 and δ near either end of (0, 1) are valid targets (the checks' boundaries)."""
    for epsilon, delta in ((0.5, 1e-5), (2.0, 1e-300), (2.0, 0.5)):
        sigma = calibrate_noise(epsilon=epsilon, delta=delta, sample_rate=0.01, steps=10)
        assert compose_rdp([PrivacyPart("p", sigma, 0.01, 10)], delta) <= epsilon


def test_prv_of_parts_that_took_no_step_is_zero():
    """A run stopped before any private step (or a plan whose parts are all 0-step) spent
    nothing: PRV ε 0, as RDP ("return 1.0" there survived make mutate)."""
    idle = [PrivacyPart("a", 1.0, 0.01, 0), PrivacyPart("b", 2.0, 0.1, 0)]
    assert compose_prv(idle, 1e-5) == 0.0 and compose_prv([], 1e-5) == 0.0
    assert compose_rdp(idle, 1e-5) == 0.0
