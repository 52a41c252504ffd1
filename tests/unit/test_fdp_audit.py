"""The one-run f-DP audit (Mahloujifar, Melis, Chaudhuri, ICML 2025) in
dpgen_bench.privacy.audit_bounds: its recursion checked in the one case with a closed form, against
the binomial bound of Steinke et al. on pure-DP curves, and by simulation against mechanisms of
known trade-off curve (Gaussian scores: exactly μ-GDP; randomised response: exactly ε-DP)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from opacus.accountants.analysis.gdp import delta_eps_mu, eps_from_mu
from scipy import stats

from dpgen_bench.privacy.accounting import privacy_profile
from dpgen_bench.api import PrivacyPart
from dpgen_bench.privacy.audit_bounds import (
    _profile_g,
    best_one_run_bound,
    fdp_gaussian_bound,
    fdp_rejects,
    one_run_epsilon_lower_bound,
    profile_rejected,
)

TRIALS = 400


def _too_many(count: int, trials: int = TRIALS, level: float = 0.05) -> bool:
    """More rejections of a true claim than a level-5 % test makes in ``trials`` runs with
    probability 0.999 (the seeds are fixed: slack for the discreteness, not for flakiness)."""
    return count > stats.binom.ppf(0.999, trials, level)


def _pure_dp_bound(m: int, k: int, v: int, beta: float, delta: float = 0.0) -> float:
    """The largest ε whose (ε, δ) curve the recursion rejects (bisection)."""
    if not fdp_rejects(_profile_g([(0.0, delta)]), m, k, v, beta):
        return 0.0
    lo, hi = 0.0, 30.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if fdp_rejects(_profile_g([(mid, delta)]), m, k, v, beta) else (lo, mid)
    return lo


def _gaussian_scores(rng, m: int, mu: float):
    """Each canary's score N(μ·included, 1): changing one coin flip moves one coordinate's mean
    by μ, so the release is exactly μ-GDP with respect to each canary."""
    included = rng.random(m) < 0.5
    return mu * included + rng.standard_normal(m), included


def _randomised_response(rng, m: int, eps: float):
    included = rng.random(m) < 0.5
    flipped = rng.random(m) < 1 / (1 + math.exp(eps))
    # tiny jitter: ties broken by a score independent of the coin flips
    return np.where(included ^ flipped, 1.0, -1.0) + 1e-9 * rng.standard_normal(m), included


def _gdp_profile(mu: float) -> list[tuple[float, float]]:
    """(ε, δ(ε)) pairs of G_μ (Dong, Roth, Su, Corollary 2.13, as Opacus computes it)."""
    return [(e, float(delta_eps_mu(eps=e, mu=mu))) for e in np.linspace(0.0, 6 * mu + 4, 200)]


# ------------------------------------------------------------------ exact values


@pytest.mark.parametrize("m,k", [(50, 50), (1000, 10), (1000, 200), (5000, 500)])
def test_all_guesses_right_under_pure_dp_is_the_closed_form(m, k):
    # v = k: an ε-DP mechanism makes k right guesses with probability at most (e^ε/(1+e^ε))^k,
    # so the bound is logit(β^(1/k)) -- Steinke et al.'s number too
    beta = 0.05
    q = beta ** (1 / k)
    assert _pure_dp_bound(m, k, k, beta) == pytest.approx(math.log(q / (1 - q)), abs=1e-6)
    assert one_run_epsilon_lower_bound(k, k, delta=0.0) == pytest.approx(math.log(q / (1 - q)), abs=1e-6)


@pytest.mark.parametrize("m,k,v", [(100, 100, 90), (1000, 1000, 600), (1000, 200, 190), (5000, 500, 331)])
def test_one_pair_curve_is_within_two_percent_of_the_binomial_bound(m, k, v):
    # on the curve of one (ε, 0) pair the f-DP analysis is Steinke et al.'s game with a different
    # proof; the two bounds agree closely (the f-DP one 0.2-2 % lower here): the gain of the f-DP
    # audit is in testing whole curves, not one pair
    fdp = _pure_dp_bound(m, k, v, 0.05)
    binomial = one_run_epsilon_lower_bound(k, v, delta=0.0, confidence=0.95)
    assert 0.98 * binomial <= fdp <= binomial + 1e-9


def test_recursion_is_monotone_in_the_claim_and_in_the_evidence():
    g = lambda e: _profile_g([(e, 1e-5)])  # noqa: E731
    m, k = 2000, 400
    for v in (220, 260, 300, 380):
        rejected = [fdp_rejects(g(e), m, k, v, 0.05) for e in np.linspace(0, 4, 81)]
        # a weaker claim (larger ε) is never rejected when a stronger one is not
        assert rejected == sorted(rejected, reverse=True)
    for e in (0.2, 0.8, 1.5):
        rejected = [fdp_rejects(g(e), m, k, v, 0.05) for v in range(k // 2, k + 1)]
        assert rejected == sorted(rejected)  # more right guesses never un-reject
    assert not fdp_rejects(g(0.0), m, k, 0, 0.05)
    with pytest.raises(ValueError):
        fdp_rejects(g(1.0), m, 0, 0, 0.05)
    with pytest.raises(ValueError):
        fdp_rejects(g(1.0), 10, 20, 5, 0.05)


# ------------------------------------------------------------------ simulations


@pytest.mark.parametrize("eps,m,k", [(2.0, 1000, 500), (2.0, 1000, 1000), (1.0, 1000, 200), (4.0, 300, 300)])
def test_true_pure_dp_claim_is_rejected_at_most_at_the_level(eps, m, k):
    # randomised response is exactly ε-DP; guessing half "in", half "out" at the extremes. At
    # these sizes the test is close to its level (2-4 % of the runs), so a recursion that asks a
    # little too much of f (g(y) = f(y) instead of f(1 - y), a wrong i/(k - i)) fails here
    rng = np.random.default_rng(int(eps * 1000 + k))
    g = _profile_g([(eps, 0.0)])
    rejected = 0
    for _ in range(TRIALS):
        scores, included = _randomised_response(rng, m, eps)
        s = included[np.argsort(-scores, kind="stable")]
        v = int(s[: k // 2].sum()) + int((~s[m - k // 2:]).sum())
        rejected += fdp_rejects(g, m, k, v, 0.05)
    assert not _too_many(rejected), rejected


def test_gaussian_bound_is_sound_and_beats_the_binomial_bound():
    # exactly μ-GDP scores: the reported μ exceeds the true one in at most ~5 % of the runs; and
    # with the curve's shape it finds more than the one-pair bound of Steinke et al.
    rng = np.random.default_rng(2024)
    for mu, m in ((0.5, 2000), (2.0, 500)):
        over, mus, eps_gdp, eps_binomial = 0, [], [], []
        for _ in range(60):
            scores, included = _gaussian_scores(rng, m, mu)
            b = fdp_gaussian_bound(scores, included, delta=1e-5)
            over += b["mu_lower_bound"] > mu
            mus.append(b["mu_lower_bound"])
            eps_gdp.append(b["epsilon"])
            eps_binomial.append(best_one_run_bound(scores, included, delta=1e-5)["epsilon_lower_bound"])
        assert not _too_many(over, 60), over
        assert 0.35 * mu < np.mean(mus) < mu
        assert np.mean(eps_gdp) > 1.15 * np.mean(eps_binomial)
        assert np.mean(eps_gdp) < eps_from_mu(mu=mu, delta=1e-5)


def test_gaussian_bound_reports_epsilon_at_delta_and_validates():
    rng = np.random.default_rng(9)
    scores, included = _gaussian_scores(rng, 1000, 3.0)
    b = fdp_gaussian_bound(scores, included, delta=1e-5, confidence=0.9)
    assert b["mu_lower_bound"] > 1
    assert b["epsilon"] == pytest.approx(eps_from_mu(mu=b["mu_lower_bound"], delta=1e-5))
    assert b["confidence"] == 0.9 and b["grid_size"] >= 1 and b["correct"] <= b["guesses"]
    null = fdp_gaussian_bound(rng.standard_normal(1000), included, delta=1e-5)
    assert null["mu_lower_bound"] < 0.3
    with pytest.raises(ValueError, match="confidence"):
        fdp_gaussian_bound(scores, included, delta=1e-5, confidence=1.0)
    with pytest.raises(ValueError, match="lengths"):
        fdp_gaussian_bound(scores[:-1], included, delta=1e-5)


def test_a_whole_curve_is_a_sharper_test_than_one_pair_of_it():
    # G_1 scores, 2,000 canaries. The claim "G_0.5" (ε = 1.99 at δ = 1e-5) is false. One pair
    # of its profile, (1.99, 1e-5), is too weak a claim to reject; the whole curve is rejected in
    # most runs. The true curve G_1 is rejected at most at the level
    rng = np.random.default_rng(11)
    false_claim, true_claim = _gdp_profile(0.5), _gdp_profile(1.0)
    one_pair = [(eps_from_mu(mu=0.5, delta=1e-5), 1e-5)]
    rejected_curve = rejected_pair = rejected_true = 0
    for _ in range(40):
        scores, included = _gaussian_scores(rng, 2000, 1.0)
        rejected_curve += profile_rejected(scores, included, profile=false_claim)["rejected"]
        rejected_pair += profile_rejected(scores, included, profile=one_pair)["rejected"]
        rejected_true += profile_rejected(scores, included, profile=true_claim)["rejected"]
    assert rejected_curve >= 30
    assert rejected_pair <= 4
    assert not _too_many(rejected_true, 40)


def test_accountant_profile_certifies_the_runs_epsilon():
    part = PrivacyPart("D", noise_multiplier=1.1, sample_rate=0.01, steps=1000)
    prof = privacy_profile([part], 1e-5)
    eps = dict((d, e) for e, d in prof)
    assert 1e-5 in eps and len(prof) >= 20
    # smaller δ', larger ε: a privacy profile
    ds = sorted(eps)
    assert all(eps[a] >= eps[b] for a, b in zip(ds, ds[1:]))
    with pytest.raises(ValueError, match="profile"):
        profile_rejected([1.0, 2.0], [True, False], profile=[])


def test_g_is_the_trade_off_function_at_one_minus_y():
    """g(y) = f(1 − y) for the curves the audit tests, written from their definitions: the
    (ε, δ) curve f(α) = max(0, 1 − δ − e^ε·α, e^{−ε}(1 − δ − α)) (Dong, Roth, Su, Prop. 2.5;
    the max over several pairs for a profile) and the Gaussian G_μ(α) = Φ(Φ⁻¹(1 − α) − μ),
    over the whole range of y, including near 1 where the first branch binds."""
    from dpgen_bench.privacy.audit_bounds import _gaussian_g

    def f_pair(eps, delta, a):
        return max(0.0, 1 - delta - math.exp(eps) * a, math.exp(-eps) * (1 - delta - a))

    pairs = [(0.5, 1e-3), (2.0, 1e-6), (1.0, 0.0)]
    g = _profile_g(pairs)
    for y in (1e-6, 0.01, 0.2, 0.5, 0.8, 0.97, 0.999, 1.0):
        assert g(y) == pytest.approx(max(f_pair(e, d, 1 - y) for e, d in pairs), abs=1e-12)
        for mu in (0.3, 1.0, 3.0):
            want = stats.norm.cdf(stats.norm.ppf(1 - (1 - y)) - mu) if y < 1 else 1.0
            assert _gaussian_g(mu)(y) == pytest.approx(want, abs=1e-12)
    assert g(0.999) > g(0.5) > g(0.01)  # the first branch binds near 1
    assert g(0.999) == pytest.approx(1 - 1e-3 - math.exp(0.5) * 0.001, abs=1e-12)
