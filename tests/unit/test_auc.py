"""``dpgen_bench.auc``: the spread of a membership-inference AUC, against the math and
against simulated AUCs (the MIA evaluators' standard errors and the MIA sanity test's
bands rest on it)."""

import math

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from dpgen_bench.auc import auc_summary, delong, hanley_mcneil_sd, null_sd, placements


def test_null_sd_is_the_mann_whitney_spread_and_hanley_mcneil_at_one_half():
    assert null_sd(64, 64) == pytest.approx(math.sqrt((64 + 64 + 1) / (12 * 64 * 64)), rel=1e-12)
    assert null_sd(30, 70) == pytest.approx(math.sqrt((30 + 70 + 1) / (12 * 30 * 70)), rel=1e-12)
    assert hanley_mcneil_sd(0.5, 64, 64) == pytest.approx(null_sd(64, 64), rel=1e-12)
    assert hanley_mcneil_sd(0.5, 30, 70) == pytest.approx(null_sd(30, 70), rel=1e-12)


def test_placements_are_the_pairwise_comparisons_ties_counted_half():
    """V10_i = mean_j ψ(x_i, y_j), V01_j = mean_i ψ(x_i, y_j), ψ = 1 / ½ / 0 for > / = / <:
    the rank formula against the O(mn) definition, on rounded scores (many ties) and
    unequal sizes (a swapped m and n would show)."""
    rng = np.random.default_rng(1)
    x, y = rng.normal(0.5, 1, 30).round(1), rng.normal(0, 1, 70).round(1)
    psi = (x[:, None] > y[None]) + 0.5 * (x[:, None] == y[None])
    v10, v01 = placements(x, y)
    np.testing.assert_allclose(v10, psi.mean(1), atol=1e-12)
    np.testing.assert_allclose(v01, psi.mean(0), atol=1e-12)
    auc, se = delong(x, y)
    assert auc == pytest.approx(roc_auc_score(np.r_[np.ones(30), np.zeros(70)], np.r_[x, y]), abs=1e-12)
    # DeLong's variance, written out from the definition
    var = ((psi.mean(1) - auc) ** 2).sum() / 29 / 30 + ((psi.mean(0) - auc) ** 2).sum() / 69 / 70
    assert se == pytest.approx(math.sqrt(var), rel=1e-12)


def _exponential_aucs(auc: float, m: int, n: int, reps: int, seed: int = 0):
    """``reps`` draws of m positive and n negative exponential scores with P(pos > neg) = auc."""
    rng = np.random.default_rng(seed)
    rate = auc / (1 - auc)  # X ~ Exp(1), Y ~ Exp(rate): P(X > Y) = rate / (1 + rate) = auc
    return rng.exponential(1.0, (reps, m)), rng.exponential(1.0 / rate, (reps, n))


@pytest.mark.parametrize("auc", [0.5, 0.75, 0.9])
def test_hanley_mcneil_matches_the_spread_of_simulated_aucs(auc):
    """Hanley & McNeil's Q1, Q2 are exact for exponentially distributed scores: 4,000 draws
    of 64 + 64 scores; the AUCs' standard deviation is hanley_mcneil_sd (the estimate's own
    relative error is ~1.1 %, the tolerance 5 %)."""
    pos, neg = _exponential_aucs(auc, 64, 64, 4000)
    aucs = (pos[:, :, None] > neg[:, None, :]).mean(axis=(1, 2))
    assert aucs.mean() == pytest.approx(auc, abs=0.003)
    assert aucs.std() == pytest.approx(hanley_mcneil_sd(auc, 64, 64), rel=0.05)
    # the tolerance tells a wrong formula apart: the binomial √(A(1 − A)/n) is 22–32 % off
    assert abs(aucs.std() / math.sqrt(auc * (1 - auc) / 64) - 1) > 0.15


@pytest.mark.parametrize("shape", ["exponential", "normal"])
@pytest.mark.parametrize("auc", [0.5, 0.8])
def test_delong_se_matches_the_spread_of_simulated_aucs(auc, shape):
    """DeLong's SE is nonparametric: over 2,000 draws of 40 members against 90 non-members,
    its root mean square is the AUCs' standard deviation (within 6 %; the Monte Carlo error
    of the s.d. is ~1.6 %), for exponential scores and for a normal shift alike; and the
    nominal 95 % interval AUC ± 1.96·SE covers the true AUC in 93-97 % of the draws."""
    reps, m, n = 2000, 40, 90
    if shape == "exponential":
        pos, neg = _exponential_aucs(auc, m, n, reps, seed=3)
    else:  # X ~ N(μ, 1), Y ~ N(0, 1): P(X > Y) = Φ(μ/√2)
        from scipy.stats import norm

        rng = np.random.default_rng(3)
        pos, neg = rng.normal(math.sqrt(2) * norm.ppf(auc), 1, (reps, m)), rng.normal(0, 1, (reps, n))
    aucs, ses = np.array([delong(p, q) for p, q in zip(pos, neg)]).T
    assert aucs.mean() == pytest.approx(auc, abs=0.005)
    assert math.sqrt((ses**2).mean()) == pytest.approx(aucs.std(), rel=0.06)
    covered = np.mean(np.abs(aucs - auc) <= 1.959964 * ses)
    assert 0.93 <= covered <= 0.97
    lo, hi = auc_summary(pos[0], neg[0])["ci"]  # auc_summary's interval is that one
    assert (lo, hi) == pytest.approx((aucs[0] - 1.959964 * ses[0], aucs[0] + 1.959964 * ses[0]), abs=1e-6)


def test_p_value_is_uniform_under_the_null_and_small_under_a_leak():
    rng = np.random.default_rng(5)
    p_null = np.array([auc_summary(rng.normal(size=64), rng.normal(size=64))["p_value"] for _ in range(1000)])
    assert 0.035 <= (p_null < 0.05).mean() <= 0.065  # a level-5 % test rejects 5 % of nulls
    leak = auc_summary(rng.normal(1.0, 1, 64), rng.normal(size=64))
    assert leak["p_value"] < 1e-4 and leak["ci"][0] > 0.5
    # "members score higher" is one-sided: members scoring lower is no evidence of a leak
    assert auc_summary(rng.normal(-1.0, 1, 64), rng.normal(size=64))["p_value"] > 0.99


def test_summary_refuses_what_has_no_standard_error():
    with pytest.raises(ValueError, match="at least 2"):
        auc_summary([1.0], [0.0, 1.0])
    with pytest.raises(ValueError, match="finite"):
        auc_summary([1.0, np.nan], [0.0, 1.0])
    with pytest.raises(ValueError, match="confidence"):
        auc_summary([1.0, 2.0], [0.0, 1.0], confidence=1.0)
