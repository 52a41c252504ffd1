"""The statistics of an empirical privacy audit: lower bounds on ε from what an attacker
achieved. Pure functions of counts and scores (no training, no torch).

Three kinds of evidence:

1. **One-run auditing** -- T. Steinke, M. Nasr, M. Jagielski, "Privacy Auditing with One (1)
   Training Run", NeurIPS 2023 (arXiv:2305.08846). m canaries, each included independently
   with probability 1/2 (S_i uniform on {-1, +1}); one training run; the auditor guesses "in"
   for the k+ highest scores and "out" for the k- lowest and abstains on the rest: r = k+ + k-
   guesses, v of them correct. The paper's main theorem (its "Main Theorem", Theorem 3 in the
   arXiv version as we number it; the introduction states the δ = 0 case) says that if the
   mechanism is (ε, δ)-DP with respect to changing one S_i, then for every v

       P[W >= v] <= f(v) + 2·m·δ · max_{i = 1..m} (f(v - i) - f(v)) / i,            (★)
       f(v) := P[Binomial(r, e^ε / (1 + e^ε)) >= v],

   W the number of correct guesses. The formula is pinned down by the authors' own reference
   code in the paper's Appendix D, which we follow: (★) is evaluated as its
   ``p_value_DP_audit`` does (β-term = binomial tail, α-term = the running maximum over
   i = 1..v of P[v - i <= Binomial < v] / i; terms with i > v are smaller than the i = v term
   since f(v - i) = 1 there) and inverted in ε as its ``get_eps_audit`` does:
   ε_lb = the largest ε at which the observed v has p-value < β = 1 - confidence. For δ = 0
   (★) is the plain binomial tail, continuous and increasing in ε, and ε_lb has a closed form:
   logit of the one-sided Clopper-Pearson lower bound on the guessing accuracy (equal to the
   paper's bisection up to its tolerance). For δ > 0 we bisect, like the paper. Two details
   keep the test a proper one without ever making it less conservative than (★):
   - the p-value is min over v' <= v of (★)(v') (each is a valid bound, P[W >= v] <=
     P[W >= v']), so it is non-increasing in v, which the "reject when p < β" rule needs.
     (★) is itself non-increasing in v when 2mδ <= 1 and, for any δ, above the mode of the
     binomial (proof in ``_p_value``), so only a handful of v' are ever checked, and at the
     usual sizes (2mδ << 1) this is exactly the paper's number;
   - (ε, δ)-DP implies (ε', δ)-DP for ε' > ε, so a test that rejects at some ε rejects every
     smaller one, and the reported value, being a rejected ε, is a valid bound whether or not
     (★) is monotone in ε. For δ > 0 we report the *first* ε at which the test stops rejecting
     (a 64-point scan before the bisection), so the value is also monotone in v even if the
     δ-term made (★) non-monotone in ε (we never saw it happen).

   Searching over (k+, k-) and reporting the best is a multiple comparison: ``best_one_run_bound``
   pays for it with a union bound (each of the G grid points tested at β / G), the grid being a
   function of m only, fixed before the scores are seen.

2. **One-run auditing of a trade-off curve** -- S. Mahloujifar, L. Melis, K. Chaudhuri,
   "Auditing f-Differential Privacy in One Run", ICML 2025 (arXiv:2410.22235). The same game
   (m canaries, coin flips, r guesses, v correct) tested against a whole trade-off curve f
   (f-DP, Dong, Roth, Su 2022) instead of one (ε, δ) pair. Their Algorithm 3 ("audit with
   abstention"), as we use it: for a symmetric trade-off function f let
   g(y) = f(1 - y) (the least probability an f-DP mechanism can give "guess wrong" on a canary
   when it gives "guess right" probability y: the inverse of the curve's blow-up function);
   start from r_v = β·v/m, h_v = β·(r - v)/m and for i = v-1, ..., 0

       h_i = max(h_{i+1}, g(r_{i+1})),   r_i = r_{i+1} + i/(r - i)·(h_i - h_{i+1});

   "the mechanism is f-DP" is rejected at level β when r_0 + h_0 > r/m (the probability that
   v of the r guesses are right would be below β under f). The recursion is monotone in g (a
   larger g, i.e. a stronger privacy claim, gives larger r_i and h_i), so along a family of
   nested curves the rejected claims form an interval and bisection finds its end. We read
   the algorithm from DeepMind's jax_privacy auditing library, which implements it
   (``_epsilon_one_run_fdp``, Gaussian curves); the code here is ours. Two families:
   - Gaussian curves G_μ (μ-GDP): g(y) = Φ(Φ⁻¹(y) - μ). ``fdp_gaussian_bound`` returns the
     largest rejected μ and the ε at δ of G_μ (Opacus' ``eps_from_mu``): the paper's
     "empirical ε". It is a lower bound on ε *if the mechanism's curve is Gaussian* (DP-SGD's
     is close to one after many steps, Dong et al.'s central limit theorem), not for an
     arbitrary mechanism, so it never raises a violation on its own;
   - an accountant's privacy profile {(ε_j, δ_j)}: every pair it certifies gives the curve
     f_{ε,δ}(α) = max(0, 1 - δ - e^ε·α, e^{-ε}(1 - δ - α)), so the mechanism is f-DP for their
     pointwise max and g(y) = max_j max(0, e^{-ε_j}(y - δ_j), 1 - δ_j - e^{ε_j}(1 - y)).
     ``profile_rejected`` tests exactly what the accountant claims, with the whole curve, so
     a rejection is a violation (used by ``bench audit`` beside the ε-bound of 1.).
   Checked by simulation (tests/unit/test_audit_bounds.py): Gaussian scores of known μ and
   randomised response of known ε are never over-reported beyond the test's level.

3. **A ROC curve as a bound** (membership inference, e.g. GAN-Leaks: D. Chen, N. Yu, Y. Zhang,
   M. Fritz, "GAN-Leaks: A Taxonomy of Membership Inference Attacks against Generative Models",
   CCS 2020). By the hypothesis-testing characterisation of DP (P. Kairouz, S. Oh, P. Viswanath,
   "The Composition Theorem for Differential Privacy", ICML 2015) every test of "member" vs
   "non-member" of an (ε, δ)-DP mechanism has FPR + e^ε·FNR >= 1 - δ and FNR + e^ε·FPR >= 1 - δ,
   i.e. ε >= log((TPR - δ)/FPR) and ε >= log((1 - FPR - δ)/(1 - TPR)). With exact one-sided
   Clopper-Pearson bounds (C. J. Clopper, E. S. Pearson, "The use of confidence or fiducial
   limits illustrated in the case of the binomial", Biometrika 1934) on TPR (lower) and FPR
   (upper), as in M. Jagielski, J. Ullman, A. Oprea, "Auditing Differentially Private Machine
   Learning: How Private is Private SGD?", NeurIPS 2020. The bounds hold *simultaneously for
   every threshold* (see ``roc_epsilon_lower_bound``), so the max over thresholds is valid.
   Caveat: this reads each member / non-member score as an independent trial of the DP test.
   That is exact when every trial is its own training run (the classical multi-run audit); for
   many members of *one* trained model the scores are not independent trials and the number is
   a heuristic, not a certificate -- the one-run bound above is the certified single-run audit.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Sequence

import numpy as np
from scipy import stats
from scipy.special import expit, ndtr, ndtri

from ..auc import as_scores

__all__ = [
    "best_one_run_bound",
    "fdp_gaussian_bound",
    "fdp_rejects",
    "profile_rejected",
    "clopper_pearson",
    "one_run_epsilon_lower_bound",
    "roc_epsilon_lower_bound",
]

_BISECTION_STEPS = 48
_SCAN_POINTS = 64


# ---------------------------------------------------------------------------- validation


def _check_confidence(confidence: float) -> float:
    try:
        c = float(confidence)
    except (TypeError, ValueError):
        raise ValueError(f"confidence must be a number in (0, 1), got {confidence!r}") from None
    if not (math.isfinite(c) and 0.0 < c < 1.0):
        raise ValueError(f"confidence must be in (0, 1) (e.g. 0.95), got {confidence!r}")
    return c


def _check_delta(delta: float) -> float:
    try:
        d = float(delta)
    except (TypeError, ValueError):
        raise ValueError(f"delta must be a number in [0, 1), got {delta!r}") from None
    if not (math.isfinite(d) and 0.0 <= d < 1.0):
        raise ValueError(f"delta must be in [0, 1), got {delta!r}")
    return d


def _check_count(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        if isinstance(value, numbers.Real) and float(value).is_integer():
            value = int(value)
        else:
            raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    value = int(value)
    if value < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value}")
    return value


def _as_included(x, m: int) -> np.ndarray:
    a = np.asarray(x)
    if a.ndim != 1:
        raise ValueError(f"included must be 1-D, got shape {a.shape}")
    if a.size != m:
        raise ValueError(f"scores and included have different lengths ({m} and {a.size})")
    if a.dtype == bool:
        return a
    try:
        values = set(np.unique(a).tolist())
    except TypeError:
        raise ValueError("included must be booleans, 0/1 or -1/+1") from None
    if values <= {0, 1} or values <= {-1, 1}:
        return a == 1
    raise ValueError(f"included must be booleans, 0/1 or -1/+1; found values {sorted(values)[:5]}")


# ---------------------------------------------------------------------------- one-run audit


def _paper_bound(r: int, v: int, q: np.ndarray, c: float) -> np.ndarray:
    """(★) at one v for an array of q = e^ε/(1+e^ε): the paper's Appendix D ``p_value_DP_audit``,
    vectorised over q. c = 2·m·δ."""
    q = np.atleast_1d(np.asarray(q, dtype=float))
    tail = stats.binom.sf(v - 1, r, q)  # f(v) = P[Binomial(r, q) >= v]
    if c == 0.0 or v == 0:
        return np.minimum(tail, 1.0)
    k = np.arange(v - 1, -1, -1)  # v-1, v-2, ..., 0
    pmf = stats.binom.pmf(k[None, :], r, q[:, None])
    # running sum_i = P[v - i <= Binomial < v] = f(v - i) - f(v); alpha = max_i sum_i / i
    alpha = np.max(np.cumsum(pmf, axis=1) / np.arange(1, v + 1)[None, :], axis=1)
    return np.minimum(tail + c * alpha, 1.0)


def _p_value(r: int, v: int, eps: float, c: float, beta: float) -> float:
    """min over v' <= v of (★)(v'); exact whenever it is below ``beta``, else some value >= beta.

    Why few v' need checking: write α(v) = max_i (F(v-1) - F(v-1-i))/i (F the binomial CDF, pmf
    p). Splitting the window ending at v into p(v) and a window ending at v-1 gives
    α(v+1) <= α(v) + max_i (p(v) - α(v))/i. If p(v) <= α(v) then α(v+1) <= α(v); otherwise
    α(v+1) - α(v) <= p(v) = f(v) - f(v+1). So (★)(v+1) <= (★)(v) whenever c = 2mδ <= 1, and for
    any c whenever p(v) <= p(v-1) (as α(v) >= p(v-1)), i.e. for v above the mode
    M = floor((r+1)q). Hence only v' <= M+1 with f(v') < beta can beat (★)(v)."""
    q = float(expit(eps))
    p = float(_paper_bound(r, v, q, c)[0])
    if p < beta or c <= 1.0:
        return p
    hi = min(v - 1, int(math.floor((r + 1) * q)) + 1)
    if hi < 1:
        return p
    vs = np.arange(1, hi + 1)
    for v2 in vs[stats.binom.sf(vs - 1, r, q) < beta]:
        p = min(p, float(_paper_bound(r, int(v2), q, c)[0]))
        if p < beta:
            break
    return p


def _p_values(r: int, v: int, eps: np.ndarray, c: float, beta: float) -> np.ndarray:
    base = _paper_bound(r, v, expit(eps), c)
    if c > 1.0:
        for j in np.flatnonzero(base >= beta):
            base[j] = _p_value(r, v, float(eps[j]), c, beta)
    return base


def _epsilon_lower_bound(r: int, v: int, c: float, beta: float) -> float:
    """sup of the ε in [0, ε_first), ε_first = the first ε whose p-value is >= beta (c = 2mδ).

    δ = 0: the p-value is f(v) = P[Binomial(r, q) >= v], continuous and increasing in q, so
    ε_first = logit(L) with L the q where f(v) = beta, i.e. the one-sided Clopper-Pearson lower
    bound beta.ppf(beta, v, r - v + 1) (0 when L <= 1/2). δ > 0: (★) >= f(v), so ε_first lies
    in [0, that value]; a 64-point scan finds the first grid cell where the test stops
    rejecting (the δ-term need not be monotone in ε), then bisection inside it."""
    if v == 0:
        return 0.0
    q0 = float(stats.beta.ppf(beta, v, r - v + 1))
    if not q0 > 0.5:
        return 0.0
    eps0 = float(math.log(q0) - math.log1p(-q0))
    if c == 0.0:
        return eps0
    if _p_value(r, v, 0.0, c, beta) >= beta:
        return 0.0
    grid = np.linspace(0.0, eps0, _SCAN_POINTS + 1)
    stop = np.flatnonzero(_p_values(r, v, grid, c, beta) >= beta)
    if stop.size == 0:  # only by rounding at eps0, where f(v) == beta
        return eps0
    j = int(stop[0])  # >= 1: grid[0] = 0 rejects (checked above)
    lo, hi = float(grid[j - 1]), float(grid[j])
    for _ in range(_BISECTION_STEPS):
        if hi - lo <= 1e-10 * max(1.0, hi):
            break
        mid = 0.5 * (lo + hi)
        if _p_value(r, v, mid, c, beta) < beta:
            lo = mid
        else:
            hi = mid
    return lo


def one_run_epsilon_lower_bound(
    guesses: int,
    correct: int,
    *,
    delta: float,
    confidence: float = 0.95,
    canaries: int | None = None,
) -> float:
    """Lower bound on ε from one run (Steinke, Nasr, Jagielski 2023). Guarantee: if the
    mechanism is (ε, δ)-DP with respect to each canary's inclusion, the returned value exceeds
    ε with probability at most 1 - confidence (over the canaries' coin flips and the
    mechanism). 0.0 when nothing can be concluded.

    ``guesses`` r (the auditor's non-abstentions), ``correct`` v <= r, ``canaries`` m >= r (all
    randomised canaries, including those abstained on). The p-value of "the mechanism is
    (ε, δ)-DP" is the paper's bound (★) (module docstring; their main theorem, computed as in
    their Appendix D), made non-increasing in v by taking min over v' <= v; the bound is the
    first ε where that p-value reaches β = 1 - confidence (δ = 0: closed form through the
    Clopper-Pearson lower bound; δ > 0: 64-point scan, then bisection to ~1e-10).

    The δ-term is 2·m·δ·(...): it needs m, so ``canaries`` is required when delta > 0 (there is
    no safe default: r would understate it). For delta == 0 it is not used. Monotone: more
    correct guesses never give a smaller bound."""
    r = _check_count(guesses, "guesses")
    v = _check_count(correct, "correct")
    d = _check_delta(delta)
    conf = _check_confidence(confidence)
    if v > r:
        raise ValueError(f"correct ({v}) cannot exceed guesses ({r})")
    if canaries is None:
        if d > 0.0:
            raise ValueError("canaries (m, the number of randomised canaries) is required when delta > 0: "
                             "the δ-term of the bound is 2·m·δ·(...)")
        m = r
    else:
        m = _check_count(canaries, "canaries")
        if m < r:
            raise ValueError(f"guesses ({r}) cannot exceed canaries ({m})")
    if r == 0:
        return 0.0
    return float(_epsilon_lower_bound(r, v, 2.0 * m * d, 1.0 - conf))


def _default_k_grid(m: int) -> list[tuple[int, int]]:
    """k+ = k- = k with 2k/m (the fraction of canaries guessed on) in {1, 2, 5, 10, 20, 40, 60,
    100} %: at most 8 points, a function of m only."""
    ks = []
    for frac in (0.01, 0.02, 0.05, 0.1, 0.2, 0.4, 0.6, 1.0):
        k = max(1, int(round(frac * m / 2)))
        if 2 * k <= m and k not in ks:
            ks.append(k)
    if not ks:  # m == 1: one guess, "in" on the only canary
        return [(1, 0)]
    return [(k, k) for k in ks]


def _parse_k_grid(k_grid, m: int) -> list[tuple[int, int]]:
    if k_grid is None:
        return _default_k_grid(m)
    if isinstance(k_grid, (str, bytes)) or not isinstance(k_grid, Iterable):
        raise ValueError("k_grid must be a list of k (k+ = k- = k) or of (k+, k-) pairs")
    out: list[tuple[int, int]] = []
    for item in k_grid:
        if isinstance(item, Sequence) and not isinstance(item, (str, bytes)):
            if len(item) != 2:
                raise ValueError(f"k_grid entries must be k or (k+, k-), got {item!r}")
            kp, km = _check_count(item[0], "k+"), _check_count(item[1], "k-")
        else:
            kp = km = _check_count(item, "k")
        if kp + km == 0:
            raise ValueError("a k_grid entry makes no guess (k+ = k- = 0)")
        if kp + km > m:
            raise ValueError(f"k_grid entry ({kp}, {km}) guesses on more than the {m} canaries")
        if (kp, km) not in out:
            out.append((kp, km))
    if not out:
        raise ValueError("k_grid is empty")
    return out


def _guess_counts(scores, included, k_grid) -> tuple[int, list[tuple[int, int, int, int]]]:
    """m and, for each (k+, k-) of the grid: (k+, k-, guesses, correct), guessing "in" on the
    k+ highest scores and "out" on the k- lowest (stable sort: ties by index)."""
    s = as_scores(scores, "scores")
    m = s.size
    inc = _as_included(included, m)
    inc_sorted = inc[np.argsort(-s, kind="stable")]
    counts = []
    for kp, km in _parse_k_grid(k_grid, m):
        v = int(inc_sorted[:kp].sum()) + int((~inc_sorted[m - km:]).sum())  # km == 0: empty tail
        counts.append((kp, km, kp + km, v))
    return m, counts


def best_one_run_bound(scores, included, *, delta: float, confidence: float = 0.95, k_grid=None) -> dict:
    """The one-run bound for the best (k+, k-) of a grid, valid at ``confidence`` overall.

    ``scores``: one per randomised canary (all m of them: m enters the δ-term), higher = "more
    likely included"; ``included``: the canaries' coin flips (bool, 0/1 or -1/+1). Canaries are
    sorted by score (stable: ties broken by index, which is independent of the coin flips); the
    k+ highest are guessed "in", the k- lowest "out".

    Multiple comparisons: reporting the max over G grid points is sound only if each is tested
    at β/G (union bound: P[some point over-reports] <= G·β/G = β), and that is what is done,
    each point at confidence 1 - β/G. The grid must not depend on the scores: the default
    (``_default_k_grid``) depends on m only: k+ = k- = k with 2k/m in {1, 2, 5, 10, 20, 40, 60,
    100} %. ``k_grid`` may give ks (k+ = k- = k) or (k+, k-) pairs; choose it before looking.

    Returns ``epsilon_lower_bound, guesses, correct, k_plus, k_minus, confidence`` (the overall
    level) and ``grid_size`` (G)."""
    m, counts = _guess_counts(scores, included, k_grid)
    d = _check_delta(delta)
    conf = _check_confidence(confidence)
    per_point = 1.0 - (1.0 - conf) / len(counts)
    best = None
    for kp, km, r, v in counts:
        eps = one_run_epsilon_lower_bound(r, v, delta=d, confidence=per_point, canaries=m)
        if best is None or eps > best["epsilon_lower_bound"]:
            best = {"epsilon_lower_bound": eps, "guesses": r, "correct": v, "k_plus": kp, "k_minus": km}
    best.update(confidence=conf, grid_size=len(counts))
    return best


# ---------------------------------------------------------------------------- f-DP one-run audit


def fdp_rejects(g, canaries: int, guesses: int, correct: int, beta: float) -> bool:
    """Mahloujifar, Melis, Chaudhuri's Algorithm 3 (module docstring, 2.): True when ``correct``
    right guesses out of ``guesses`` among ``canaries`` randomised canaries reject, at level
    ``beta``, "the mechanism is f-DP", f given by g(y) = f(1 - y) (increasing, g(0) = 0)."""
    m, k, v = int(canaries), int(guesses), int(correct)
    if not 0 <= v <= k <= m or k == 0:
        raise ValueError(f"need 0 <= correct <= guesses <= canaries and guesses > 0, got {v}, {k}, {m}")
    r = beta * v / m
    h = beta * (k - v) / m
    for i in range(v - 1, -1, -1):
        h_new = max(h, g(r))
        if h_new == h:  # then r and h never change again
            break
        r = min(r + i / (k - i) * (h_new - h), 1.0)
        h = h_new
    return r + h > k / m


def _gaussian_g(mu: float):
    def g(y: float) -> float:
        return float(ndtr(ndtri(y) - mu)) if y > 0.0 else 0.0
    return g


def _profile_g(pairs: Sequence[tuple[float, float]]):
    eps = np.array([min(float(e), 700.0) for e, _ in pairs])
    dlt = np.array([float(d) for _, d in pairs])
    down, up = np.exp(-eps), np.exp(eps)

    def g(y: float) -> float:
        return float(max(0.0, np.max(np.maximum(down * (y - dlt), 1.0 - dlt - up * (1.0 - y)))))
    return g


def fdp_gaussian_bound(scores, included, *, delta: float, confidence: float = 0.95, k_grid=None,
                       mu_max: float = 20.0) -> dict:
    """The largest μ whose μ-GDP claim the guesses reject (Mahloujifar et al.'s audit with
    Gaussian curves), best over the (k+, k-) grid with a union bound (each point at β/G, as
    ``best_one_run_bound``), and ``epsilon`` = the ε at ``delta`` of G_μ (the paper's
    "empirical ε"; a lower bound on ε only for mechanisms with a Gaussian trade-off curve:
    module docstring). Returns ``mu_lower_bound, epsilon, guesses, correct, k_plus, k_minus,
    confidence, grid_size``."""
    from opacus.accountants.analysis.gdp import delta_eps_mu, eps_from_mu

    d = _check_delta(delta)
    conf = _check_confidence(confidence)
    m, counts = _guess_counts(scores, included, k_grid)
    beta = (1.0 - conf) / len(counts)
    best = None
    for kp, km, k, v in counts:
        mu = 0.0
        if fdp_rejects(_gaussian_g(0.0), m, k, v, beta):
            lo, hi = 0.0, float(mu_max)
            if fdp_rejects(_gaussian_g(hi), m, k, v, beta):
                lo = hi
            else:
                for _ in range(_BISECTION_STEPS):
                    if hi - lo <= 1e-9 * max(1.0, hi):
                        break
                    mid = 0.5 * (lo + hi)
                    lo, hi = (mid, hi) if fdp_rejects(_gaussian_g(mid), m, k, v, beta) else (lo, mid)
            mu = lo
        if best is None or mu > best["mu_lower_bound"]:
            best = {"mu_lower_bound": mu, "guesses": k, "correct": v, "k_plus": kp, "k_minus": km}
    mu = best["mu_lower_bound"]
    if mu <= 0.0 or d == 0.0:
        eps = 0.0 if mu <= 0.0 else float("inf")  # μ-GDP with μ > 0 is (ε, 0)-DP for no finite ε
    elif float(delta_eps_mu(eps=0.0, mu=mu)) <= d:
        eps = 0.0
    else:
        eps = float(eps_from_mu(mu=mu, delta=d))
    best.update(epsilon=eps, confidence=conf, grid_size=len(counts))
    return best


def profile_rejected(scores, included, *, profile: Sequence[tuple[float, float]], confidence: float = 0.95,
                     k_grid=None) -> dict:
    """Do the guesses reject the trade-off curve of an accountant's privacy profile (the pairs
    (ε_j, δ_j) it certifies; module docstring, 2.)? Tested at every (k+, k-) of the grid at
    β/G (union bound). Returns ``rejected`` and the first grid point that rejects (or the
    grid's last), with ``confidence`` and ``grid_size``."""
    conf = _check_confidence(confidence)
    pairs = [(float(e), _check_delta(dl)) for e, dl in profile]
    if not pairs or any(math.isnan(e) or e < 0 for e, _ in pairs):
        raise ValueError("profile must be a non-empty list of (ε >= 0, δ) pairs")
    m, counts = _guess_counts(scores, included, k_grid)
    beta = (1.0 - conf) / len(counts)
    g = _profile_g(pairs)
    out = None
    for kp, km, k, v in counts:
        out = {"rejected": fdp_rejects(g, m, k, v, beta), "guesses": k, "correct": v, "k_plus": kp, "k_minus": km}
        if out["rejected"]:
            break
    out.update(confidence=conf, grid_size=len(counts))
    return out


# ---------------------------------------------------------------------------- ROC audit


def _cp_lower(k: np.ndarray, n: int, confidence: float) -> np.ndarray:
    k = np.asarray(k)
    out = stats.beta.ppf(1.0 - confidence, np.maximum(k, 1), n - k + 1)
    return np.where(k == 0, 0.0, out)


def _cp_upper(k: np.ndarray, n: int, confidence: float) -> np.ndarray:
    k = np.asarray(k)
    out = stats.beta.ppf(confidence, k + 1, np.maximum(n - k, 1))
    return np.where(k == n, 1.0, out)


def clopper_pearson(successes: int, trials: int, *, confidence: float, side: str) -> float:
    """Exact one-sided Clopper-Pearson bound on a binomial proportion.

    ``side="lower"``: the L with P[Binomial(trials, L) >= successes] = 1 - confidence (0 when
    successes == 0); ``side="upper"``: the U with P[Binomial(trials, U) <= successes] =
    1 - confidence (1 when successes == trials). Each holds with probability >= confidence."""
    k = _check_count(successes, "successes")
    n = _check_count(trials, "trials")
    conf = _check_confidence(confidence)
    if k > n:
        raise ValueError(f"successes ({k}) cannot exceed trials ({n})")
    if side == "lower":
        return float(_cp_lower(np.array(k), n, conf))
    if side == "upper":
        return float(_cp_upper(np.array(k), n, conf))
    raise ValueError(f"side must be 'upper' or 'lower', got {side!r}")


def roc_epsilon_lower_bound(member_scores, nonmember_scores, *, delta: float, confidence: float = 0.95) -> dict:
    """Lower bound on ε from a membership-inference ROC curve (higher score = "member").

    For a threshold t the test says "member" when score >= t; TPR(t), FPR(t) its true rates.
    Any (ε, δ)-DP mechanism has ε >= log((TPR - δ)/FPR) and ε >= log((1 - FPR - δ)/(1 - TPR))
    at every t; we plug in a lower Clopper-Pearson bound on TPR and an upper one on FPR and
    report the max over all thresholds (every distinct observed score), or 0 when no threshold
    gives a positive value.

    Soundness of the max over data-chosen thresholds: the bounds hold *simultaneously* for all
    t. For members (n1 of them) the count #{score >= t} takes values k = 1..n1 where the lower
    bound is non-trivial; for each k the event "some t has count >= k but TPR(t) < L(k)" is
    contained in "count >= k at the one (distribution-determined) t* where TPR crosses L(k)",
    of probability <= α1. A union bound over the n1 levels, α1 = β/(2·n1), and likewise over
    the n0 levels of the non-member count (upper bounds, α0 = β/(2·n0)), gives simultaneous
    coverage 1 - β, β = 1 - confidence, for every threshold at once.

    The scores must be independent trials of the DP test (see the module docstring's caveat).

    Returns ``epsilon_lower_bound, threshold, tpr_lower, fpr_upper, confidence`` (the threshold
    achieving the max and its two bounds)."""
    members = as_scores(member_scores, "member_scores")
    nonmembers = as_scores(nonmember_scores, "nonmember_scores")
    d = _check_delta(delta)
    conf = _check_confidence(confidence)
    beta = 1.0 - conf
    n1, n0 = members.size, nonmembers.size

    thresholds = np.unique(np.concatenate([members, nonmembers]))
    k1 = n1 - np.searchsorted(np.sort(members), thresholds, side="left")  # members with score >= t
    k0 = n0 - np.searchsorted(np.sort(nonmembers), thresholds, side="left")
    tpr_lo = _cp_lower(k1, n1, 1.0 - beta / (2 * n1))
    fpr_hi = _cp_upper(k0, n0, 1.0 - beta / (2 * n0))  # > 0 always; and tpr_lo < 1 always

    with np.errstate(divide="ignore", invalid="ignore"):
        e1 = np.where(tpr_lo > d, np.log(np.maximum(tpr_lo - d, 1e-300) / fpr_hi), -np.inf)
        e2 = np.where(1.0 - fpr_hi > d, np.log(np.maximum(1.0 - fpr_hi - d, 1e-300) / (1.0 - tpr_lo)), -np.inf)
    eps = np.maximum(e1, e2)
    j = int(np.argmax(eps))
    return {
        "epsilon_lower_bound": float(max(0.0, eps[j])),
        "threshold": float(thresholds[j]),
        "tpr_lower": float(tpr_lo[j]),
        "fpr_upper": float(fpr_hi[j]),
        "confidence": conf,
    }
