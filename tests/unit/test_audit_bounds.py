"""The statistics of an empirical privacy audit (dpgen_bench.privacy.audit_bounds): one-run bounds
(Steinke, Nasr, Jagielski 2023), Clopper-Pearson, and the ROC bound; checked against direct
binomial computations and against simulated mechanisms of known (ε, δ)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import optimize, stats
from scipy.special import expit

from dpgen_bench.privacy.audit_bounds import (
    best_one_run_bound,
    clopper_pearson,
    one_run_epsilon_lower_bound,
    roc_epsilon_lower_bound,
)

TRIALS = 200


def _grid_bound(p_value, beta: float, hi: float = 12.0, step: float = 1e-4) -> float:
    """Brute force: the largest ε on a fine grid whose p-value is below beta (0 if none)."""
    eps = np.arange(0.0, hi, step)
    ok = eps[p_value(eps) < beta]
    return float(ok.max()) if ok.size else 0.0


def _star(m: int, r: int, v: int, delta: float, eps: np.ndarray) -> np.ndarray:
    """(★) of the paper written straight from binomial tails (no cumulative pmf sums):
    f(v) + 2mδ·max_{i=1..m} (f(v-i) - f(v))/i, f(v) = P[Binomial(r, e^ε/(1+e^ε)) >= v].
    i runs to v + 50 (or m): beyond v, f(v-i) = 1 and the terms only shrink."""
    q = expit(np.asarray(eps, dtype=float))[:, None]
    f = lambda k: stats.binom.sf(np.asarray(k) - 1, r, q)  # noqa: E731  (P[B >= k], 1 for k <= 0)
    i = np.arange(1, min(m, v + 50) + 1)[None, :]
    slopes = (f(v - i) - f(v)) / i
    return np.minimum(f(v)[:, 0] + 2 * m * delta * slopes.max(axis=1), 1.0)


# ------------------------------------------------------------------ one-run bound, exact values


@pytest.mark.parametrize("r,v,confidence", [
    (100, 90, 0.95), (100, 100, 0.95), (1000, 600, 0.95), (50, 30, 0.99), (20, 20, 0.9),
    (10, 9, 0.95), (1000, 1000, 0.95), (7, 7, 0.5),
])
def test_delta_zero_bound_is_the_exact_binomial_inversion(r, v, confidence):
    beta = 1 - confidence
    ref = _grid_bound(lambda e: stats.binom.sf(v - 1, r, expit(e)), beta)
    got = one_run_epsilon_lower_bound(r, v, delta=0.0, confidence=confidence)
    assert got == pytest.approx(ref, abs=1e-3)
    if got > 0:  # and it is the exact crossing, not just close to the grid's
        assert stats.binom.sf(v - 1, r, expit(got)) == pytest.approx(beta, rel=1e-6)


@pytest.mark.parametrize("m,r,v,delta", [
    (1000, 100, 90, 1e-5), (1000, 100, 75, 1e-4), (10000, 1000, 900, 1e-5), (1000, 200, 190, 4e-4),
    (300, 40, 40, 1e-3),
])
def test_delta_positive_bound_is_the_inversion_of_the_papers_formula(m, r, v, delta):
    hi = one_run_epsilon_lower_bound(r, v, delta=0.0) + 0.01  # (★) >= its δ = 0 part
    ref = _grid_bound(lambda e: _star(m, r, v, delta, e), 0.05, hi=hi, step=5e-4)
    got = one_run_epsilon_lower_bound(r, v, delta=delta, confidence=0.95, canaries=m)
    assert got == pytest.approx(ref, abs=1e-3)
    assert got > 0
    # δ costs something, and never more than the whole bound
    assert got < one_run_epsilon_lower_bound(r, v, delta=0.0)


def test_worked_numbers():
    # m = 1000 canaries, r = 100 guesses, v = 90 correct, 95 %: the binomial alone gives 1.6308,
    # the δ-term at δ = 1e-5 (2mδ = 0.02) takes it to 1.6261
    assert one_run_epsilon_lower_bound(100, 90, delta=0.0) == pytest.approx(1.63082, abs=1e-4)
    assert one_run_epsilon_lower_bound(100, 90, delta=1e-5, canaries=1000) == pytest.approx(1.62614, abs=1e-4)
    # all r guesses correct: logit(0.05^(1/r)) in closed form
    for r in (5, 20, 100):
        q = 0.05 ** (1 / r)
        assert one_run_epsilon_lower_bound(r, r, delta=0.0) == pytest.approx(math.log(q / (1 - q)), rel=1e-9)


def test_sanity_all_correct_grows_with_r_and_chance_level_gives_zero():
    bounds = [one_run_epsilon_lower_bound(r, r, delta=0.0) for r in (3, 5, 10, 20, 50, 100, 1000)]
    assert bounds[0] == 0.0  # 3 of 3 right happens with probability 1/8 > 5 % at ε = 0
    assert all(a < b for a, b in zip(bounds[1:], bounds[2:])), bounds
    for r in (10, 100, 1000):
        assert one_run_epsilon_lower_bound(r, r // 2, delta=0.0) == 0.0
        assert one_run_epsilon_lower_bound(r, r // 2, delta=1e-6, canaries=10 * r) == 0.0
    assert one_run_epsilon_lower_bound(0, 0, delta=0.0) == 0.0
    # a large δ-term (2mδ = 20) leaves nothing to conclude
    assert one_run_epsilon_lower_bound(20, 20, delta=0.01, canaries=1000) == 0.0


@pytest.mark.parametrize("m,delta", [(1000, 0.0), (1000, 1e-5), (1000, 1e-3), (1000, 2.5e-3)])
def test_more_correct_never_lowers_the_bound(m, delta):
    r = 200  # 2mδ from 0 to 5: both sides of the 2mδ <= 1 line of the monotonicity proof
    bounds = [one_run_epsilon_lower_bound(r, v, delta=delta, canaries=m) for v in range(r + 1)]
    assert all(a <= b for a, b in zip(bounds, bounds[1:])), bounds
    assert bounds[-1] > 0


def test_one_run_validation():
    with pytest.raises(ValueError, match="confidence"):
        one_run_epsilon_lower_bound(10, 9, delta=0.0, confidence=1.0)
    with pytest.raises(ValueError, match="confidence"):
        one_run_epsilon_lower_bound(10, 9, delta=0.0, confidence=0)
    with pytest.raises(ValueError, match="delta"):
        one_run_epsilon_lower_bound(10, 9, delta=1.0, canaries=10)
    with pytest.raises(ValueError, match="delta"):
        one_run_epsilon_lower_bound(10, 9, delta=-1e-9, canaries=10)
    with pytest.raises(ValueError, match="canaries"):
        one_run_epsilon_lower_bound(10, 9, delta=1e-5)  # the δ-term needs m
    with pytest.raises(ValueError, match="exceed"):
        one_run_epsilon_lower_bound(10, 11, delta=0.0)
    with pytest.raises(ValueError, match="exceed"):
        one_run_epsilon_lower_bound(10, 9, delta=1e-5, canaries=5)
    with pytest.raises(ValueError, match="integer"):
        one_run_epsilon_lower_bound(10.5, 9, delta=0.0)


# ------------------------------------------------------------------ one-run bound, simulations


def _randomised_response(rng, m: int, eps: float, reveal: float = 0.0):
    """Scores of m canaries under an (ε, δ = reveal)-DP mechanism: with probability ``reveal`` a
    canary's bit is published as it is (score ±10), otherwise by ε-randomised response (±1,
    flipped with probability 1/(1+e^ε)). Changing one bit moves that canary's output by at most
    e^ε in ratio plus ``reveal`` in mass, the others not at all."""
    included = rng.random(m) < 0.5
    flipped = rng.random(m) < 1 / (1 + math.exp(eps))
    scores = np.where(included ^ flipped, 1.0, -1.0)
    revealed = rng.random(m) < reveal
    return np.where(revealed, np.where(included, 10.0, -10.0), scores), included


def _too_many(count: int) -> int:
    """More exceedances than a 5 %-level procedure produces in TRIALS runs with probability
    0.999 (the seeds are fixed: this is slack for the discreteness, not for flakiness)."""
    return count > stats.binom.ppf(0.999, TRIALS, 0.05)


def test_pure_dp_simulation_is_sound_and_informative():
    eps, m = 2.0, 1000
    rng = np.random.default_rng(12345)
    over_grid = over_fixed = 0
    found = []
    for _ in range(TRIALS):
        scores, included = _randomised_response(rng, m, eps)
        best = best_one_run_bound(scores, included, delta=0.0)
        fixed = best_one_run_bound(scores, included, delta=0.0, k_grid=[m // 2])
        over_grid += best["epsilon_lower_bound"] > eps
        over_fixed += fixed["epsilon_lower_bound"] > eps
        found.append(best["epsilon_lower_bound"])
    assert not _too_many(over_grid), over_grid
    assert not _too_many(over_fixed), over_fixed
    assert np.mean(found) > 1.4  # not sound by saying nothing: close to the true 2


def test_approximate_dp_simulation_needs_the_delta_term():
    # 1 % of the canaries published outright: (0.5, 0.01)-DP. Ignoring δ over-reports ε most of
    # the time; with the δ-term (2mδ = 20) the bound stays below the truth
    eps, m, delta = 0.5, 1000, 0.01
    rng = np.random.default_rng(7)
    over_with = over_without = 0
    for _ in range(TRIALS):
        scores, included = _randomised_response(rng, m, eps, reveal=delta)
        over_with += best_one_run_bound(scores, included, delta=delta, k_grid=[5, 10, 50])["epsilon_lower_bound"] > eps
        over_without += best_one_run_bound(scores, included, delta=0.0, k_grid=[5, 10, 50])["epsilon_lower_bound"] > eps
    assert not _too_many(over_with), over_with
    assert over_without > 0.3 * TRIALS, over_without


def test_approximate_dp_simulation_small_delta_is_sound_and_informative():
    eps, m, delta = 1.0, 1000, 4e-4  # 2mδ = 0.8
    rng = np.random.default_rng(99)
    over, found = 0, []
    for _ in range(TRIALS):
        scores, included = _randomised_response(rng, m, eps, reveal=delta)
        b = best_one_run_bound(scores, included, delta=delta, k_grid=[1, 250])
        over += b["epsilon_lower_bound"] > eps
        found.append(b["epsilon_lower_bound"])
    assert not _too_many(over), over
    assert np.mean(found) > 0.5


# ------------------------------------------------------------------ best_one_run_bound


def test_best_bound_pays_for_the_grid_with_a_union_bound():
    rng = np.random.default_rng(3)
    scores, included = _randomised_response(rng, 400, 3.0)
    grid = [5, 20, (40, 0), (30, 10), 100, 200]
    best = best_one_run_bound(scores, included, delta=1e-5, confidence=0.9, k_grid=grid)
    order = np.argsort(-scores, kind="stable")
    per_point = []
    for k in grid:
        kp, km = (k, k) if isinstance(k, int) else k
        top, bottom = included[order[:kp]], included[order[len(order) - km:]]
        v = int(top.sum() + (~bottom).sum())
        per_point.append(one_run_epsilon_lower_bound(kp + km, v, delta=1e-5, confidence=1 - 0.1 / len(grid),
                                                     canaries=400))
    assert best["epsilon_lower_bound"] == pytest.approx(max(per_point))
    assert best["epsilon_lower_bound"] > 0
    assert best["confidence"] == 0.9 and best["grid_size"] == len(grid)
    assert best["guesses"] == best["k_plus"] + best["k_minus"]
    # the same data at a single point of the grid, tested at the full 0.9, gives more
    i = int(np.argmax(per_point))
    single = best_one_run_bound(scores, included, delta=1e-5, confidence=0.9, k_grid=[grid[i]])
    assert single["epsilon_lower_bound"] > best["epsilon_lower_bound"]


def test_default_grid_is_small_and_depends_on_m_only():
    rng = np.random.default_rng(4)
    for m in (1, 2, 10, 37, 1000):
        scores, included = _randomised_response(rng, m, 1.0)
        b = best_one_run_bound(scores, included, delta=0.0)
        assert 1 <= b["grid_size"] <= 10
        assert b["guesses"] <= m
        b2 = best_one_run_bound(rng.normal(size=m), included, delta=0.0)
        assert b2["grid_size"] == b["grid_size"]


def test_best_bound_accepts_the_usual_encodings_and_validates():
    rng = np.random.default_rng(5)
    scores, included = _randomised_response(rng, 200, 4.0)
    a = best_one_run_bound(scores, included, delta=0.0)
    assert best_one_run_bound(scores, included.astype(int), delta=0.0) == a
    assert best_one_run_bound(scores, np.where(included, 1, -1), delta=0.0) == a
    assert a["epsilon_lower_bound"] > 1
    with pytest.raises(ValueError, match="lengths"):
        best_one_run_bound(scores[:-1], included, delta=0.0)
    with pytest.raises(ValueError, match="included"):
        best_one_run_bound(scores, included.astype(int) * 2, delta=0.0)
    with pytest.raises(ValueError, match="NaN"):
        best_one_run_bound(np.where(included, np.nan, 0.0), included, delta=0.0)
    with pytest.raises(ValueError, match="delta"):
        best_one_run_bound(scores, included, delta=1.5)
    with pytest.raises(ValueError, match="confidence"):
        best_one_run_bound(scores, included, delta=0.0, confidence=95)
    with pytest.raises(ValueError, match="more than"):
        best_one_run_bound(scores, included, delta=0.0, k_grid=[150])
    with pytest.raises(ValueError, match="empty"):
        best_one_run_bound(scores, included, delta=0.0, k_grid=[])


# ------------------------------------------------------------------ Clopper-Pearson


CASES = [(0, 10), (1, 10), (5, 10), (10, 10), (3, 17), (0, 1), (1, 1), (37, 200), (199, 200)]


@pytest.mark.parametrize("k,n", CASES)
@pytest.mark.parametrize("confidence", [0.9, 0.95, 0.999])
def test_clopper_pearson_is_the_binomial_tail_inversion(k, n, confidence):
    beta = 1 - confidence
    lo = clopper_pearson(k, n, confidence=confidence, side="lower")
    hi = clopper_pearson(k, n, confidence=confidence, side="upper")
    if k == 0:
        assert lo == 0.0
    else:  # P[Binomial(n, lo) >= k] = beta, found independently by root finding
        ref = optimize.brentq(lambda p: stats.binom.sf(k - 1, n, p) - beta, 1e-15, 1 - 1e-15, xtol=1e-14)
        assert lo == pytest.approx(ref, abs=1e-9)
    if k == n:
        assert hi == 1.0
    else:  # P[Binomial(n, hi) <= k] = beta
        ref = optimize.brentq(lambda p: stats.binom.cdf(k, n, p) - beta, 1e-15, 1 - 1e-15, xtol=1e-14)
        assert hi == pytest.approx(ref, abs=1e-9)
    assert lo <= k / n <= hi


@pytest.mark.parametrize("n", [10, 57])
def test_clopper_pearson_covers_at_least_the_confidence_exactly(n):
    # exact coverage, summing the binomial pmf over the outcomes whose bound covers p
    lower = np.array([clopper_pearson(k, n, confidence=0.95, side="lower") for k in range(n + 1)])
    upper = np.array([clopper_pearson(k, n, confidence=0.95, side="upper") for k in range(n + 1)])
    for p in np.linspace(0.001, 0.999, 97):
        pmf = stats.binom.pmf(np.arange(n + 1), n, p)
        assert pmf[lower <= p].sum() >= 0.95 - 1e-12
        assert pmf[upper >= p].sum() >= 0.95 - 1e-12


@pytest.mark.parametrize("k,n", CASES)
def test_clopper_pearson_matches_statsmodels(k, n):
    proportion = pytest.importorskip("statsmodels.stats.proportion")
    # a one-sided bound at level c is one end of the two-sided "beta" interval at alpha = 2(1 - c)
    lo, hi = proportion.proportion_confint(k, n, alpha=0.1, method="beta")
    assert clopper_pearson(k, n, confidence=0.95, side="lower") == pytest.approx(lo, abs=1e-10)
    assert clopper_pearson(k, n, confidence=0.95, side="upper") == pytest.approx(hi, abs=1e-10)


def test_clopper_pearson_validation():
    with pytest.raises(ValueError, match="side"):
        clopper_pearson(1, 2, confidence=0.9, side="two-sided")
    with pytest.raises(ValueError, match="exceed"):
        clopper_pearson(3, 2, confidence=0.9, side="lower")
    with pytest.raises(ValueError, match="confidence"):
        clopper_pearson(1, 2, confidence=1.2, side="lower")
    with pytest.raises(ValueError, match="integer"):
        clopper_pearson(-1, 2, confidence=0.9, side="lower")


# ------------------------------------------------------------------ ROC bound


def test_roc_perfect_separation_is_the_closed_form_and_grows_with_n():
    found = []
    for n in (50, 100, 1000, 10000):
        rng = np.random.default_rng(n)
        b = roc_epsilon_lower_bound(1 + rng.random(n), rng.random(n), delta=0.0)
        a = (0.05 / (2 * n)) ** (1 / n)  # every member above t, no non-member: CP at level β/(2n)
        assert b["epsilon_lower_bound"] == pytest.approx(math.log(a / (1 - a)), rel=1e-9)
        assert b["tpr_lower"] == pytest.approx(a) and b["fpr_upper"] == pytest.approx(1 - a)
        assert b["threshold"] >= 1
        found.append(b["epsilon_lower_bound"])
    assert all(x < y for x, y in zip(found, found[1:])) and found[2] > 4, found


def test_roc_identical_distributions_give_zero():
    positive = 0
    for seed in range(TRIALS):
        rng = np.random.default_rng(seed)
        positive += roc_epsilon_lower_bound(rng.normal(size=200), rng.normal(size=200), delta=0.0)[
            "epsilon_lower_bound"] > 0
    assert positive <= 0.05 * TRIALS, positive


def test_roc_bound_is_sound_on_a_pure_dp_test():
    # scores of an ε-DP randomised response: member says 1 with probability e^ε/(1+e^ε), a
    # non-member with 1/(1+e^ε). Any threshold has TPR/FPR <= e^ε, and the bound must respect it
    eps, n = 1.0, 2000
    q = 1 / (1 + math.exp(-eps))
    over, found = 0, []
    for seed in range(TRIALS):
        rng = np.random.default_rng(seed)
        b = roc_epsilon_lower_bound((rng.random(n) < q).astype(float), (rng.random(n) < 1 - q).astype(float),
                                    delta=0.0)
        over += b["epsilon_lower_bound"] > eps
        found.append(b["epsilon_lower_bound"])
    assert over <= 0.05 * TRIALS, over
    assert np.mean(found) > 0.7  # and close to it


def test_roc_delta_enters_as_expected():
    rng = np.random.default_rng(0)
    members, nonmembers = rng.normal(2.0, 1.0, 500), rng.normal(0.0, 1.0, 500)
    bounds = [roc_epsilon_lower_bound(members, nonmembers, delta=d)["epsilon_lower_bound"]
              for d in (0.0, 1e-5, 1e-3, 0.05, 0.2, 0.5, 0.9)]
    assert all(a >= b for a, b in zip(bounds, bounds[1:])), bounds
    assert bounds[0] > 1 and bounds[-1] == 0.0
    # at the reported threshold, the bound is one of the two (ε, δ)-DP inequalities, solved for ε
    d = 0.05
    b = roc_epsilon_lower_bound(members, nonmembers, delta=d)
    tpr, fpr = b["tpr_lower"], b["fpr_upper"]
    e1 = math.log((tpr - d) / fpr) if tpr > d else -math.inf
    e2 = math.log((1 - fpr - d) / (1 - tpr)) if 1 - fpr > d else -math.inf
    assert b["epsilon_lower_bound"] == pytest.approx(max(e1, e2))


def test_roc_uses_both_directions_of_the_dp_inequality():
    # "member" = score >= t: both inequalities need members above, so an attack whose members
    # score low shows nothing until the caller flips it
    rng = np.random.default_rng(1)
    lo, hi = rng.random(300), 1 + rng.random(300)
    assert roc_epsilon_lower_bound(lo, hi, delta=0.0)["epsilon_lower_bound"] == 0.0
    assert roc_epsilon_lower_bound(-lo, -hi, delta=0.0)["epsilon_lower_bound"] > 3
    # FPR + e^ε·FNR >= 1 - δ is the binding one when the test never misses a member but flags
    # half of the non-members: members all in [1, 2), non-members spread over [0, 2)
    members, nonmembers = 1 + rng.random(2000), 2 * rng.random(2000)
    b = roc_epsilon_lower_bound(members, nonmembers, delta=0.0)
    tpr, fpr = b["tpr_lower"], b["fpr_upper"]
    assert b["epsilon_lower_bound"] == pytest.approx(math.log((1 - fpr) / (1 - tpr)))
    assert math.log((1 - fpr) / (1 - tpr)) > math.log(tpr / fpr) + 2
    # and FNR + e^ε·FPR >= 1 - δ when it is the other way round
    b = roc_epsilon_lower_bound(2 * rng.random(2000), rng.random(2000), delta=0.0)
    tpr, fpr = b["tpr_lower"], b["fpr_upper"]
    assert b["epsilon_lower_bound"] == pytest.approx(math.log(tpr / fpr))
    assert math.log(tpr / fpr) > math.log((1 - fpr) / (1 - tpr)) + 2


def test_roc_validation():
    with pytest.raises(ValueError, match="empty"):
        roc_epsilon_lower_bound([], [1.0], delta=0.0)
    with pytest.raises(ValueError, match="NaN"):
        roc_epsilon_lower_bound([np.nan], [1.0], delta=0.0)
    with pytest.raises(ValueError, match="1-D"):
        roc_epsilon_lower_bound(np.zeros((2, 2)), [1.0], delta=0.0)
    with pytest.raises(ValueError, match="delta"):
        roc_epsilon_lower_bound([1.0], [0.0], delta=1.0)
    with pytest.raises(ValueError, match="confidence"):
        roc_epsilon_lower_bound([1.0], [0.0], delta=0.0, confidence=0.0)
