"""How far one ROC AUC is from "no leak": standard errors, a confidence interval and a
p-value for a membership-inference AUC computed from m member and n non-member scores.

A GAN-Leaks AUC on 64 members spreads by ±0.05 (one s.d.) when nothing leaks at all, so
an AUC of 0.58 alone says little; these numbers say how much.

- ``null_sd(m, n)``: the exact standard deviation of the Mann–Whitney AUC when members and
  non-members score alike (continuous scores, no ties): √((m + n + 1) / (12·m·n)).
- ``delong(member, nonmember)``: the AUC and its standard error by DeLong, DeLong and
  Clarke-Pearson (1988, "Comparing the areas under two or more correlated receiver
  operating characteristic curves: a nonparametric approach"), the nonparametric variance
  of the U-statistic: placement values V10_i (the share of non-members below member i,
  ties counted ½) and V01_j (the share of members above non-member j), variance
  s²(V10)/m + s²(V01)/n. Computed from midranks (Sun and Xu 2014, "Fast implementation of
  DeLong's algorithm"), O((m + n) log(m + n)). The same estimator as R's ``pROC``
  (``var(roc, method="delong")``).
- ``hanley_mcneil_sd(auc, m, n)``: the parametric standard error of Hanley and McNeil
  (1982), from the AUC alone (exact for exponentially distributed scores); for a bound
  when only AUCs, not scores, are at hand.
- ``p_value`` (in ``auc_summary``): the one-sided Mann–Whitney test of "members score
  higher than non-members" (``scipy.stats.mannwhitneyu``, its default method: the normal
  approximation with tie and continuity corrections when both sides have more than 8
  scores, as GAN-Leaks' 64 and 128 do; exact below that when there are no ties).

The interval is AUC ± z·SE (normal, clipped to [0, 1]), as pROC's DeLong interval.
"""

from __future__ import annotations

import math

import numpy as np

# scipy.stats is imported where it is used: it costs ~0.8 s, and ``bench report`` imports
# this module for ``null_sd`` alone


def as_scores(x, name: str) -> np.ndarray:
    """``x`` as a 1-D float array of finite scores, or a ValueError naming ``name`` (shared
    with the audit's bounds, ``dpgen_bench.privacy.audit_bounds``)."""
    try:
        a = np.asarray(x, dtype=float)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a 1-D array of numbers") from None
    if a.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {a.shape}")
    if a.size == 0:
        raise ValueError(f"{name} is empty")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name} has NaN or infinite values")
    return a


def _scores(x, name: str) -> np.ndarray:
    a = as_scores(x, name)
    if a.size < 2:
        raise ValueError(f"{name}: at least 2 scores are needed for a standard error, got {a.size}")
    return a


def null_sd(m: int, n: int) -> float:
    """Standard deviation of the AUC of m positives against n negatives when both score
    alike (the Mann–Whitney null; continuous scores)."""
    if m < 1 or n < 1:
        raise ValueError("m and n must be ≥ 1")
    return math.sqrt((m + n + 1) / (12 * m * n))


def hanley_mcneil_sd(auc: float, m: int, n: int) -> float:
    """Standard error of an AUC of m positives against n negatives from the AUC alone
    (Hanley and McNeil 1982): Q1 = A/(2 − A), Q2 = 2A²/(1 + A); exact for exponentially
    distributed scores. At A = 0.5 it is ``null_sd(m, n)``."""
    if not 0 <= auc <= 1:
        raise ValueError("auc must be in [0, 1]")
    q1, q2 = auc / (2 - auc), 2 * auc**2 / (1 + auc)
    var = auc * (1 - auc) + (m - 1) * (q1 - auc**2) + (n - 1) * (q2 - auc**2)
    return math.sqrt(max(var, 0.0) / (m * n))


def placements(member, nonmember) -> tuple[np.ndarray, np.ndarray]:
    """DeLong's placement values: V10 (per member, the share of non-members it outscores,
    ties ½) and V01 (per non-member, the share of members that outscore it, ties ½)."""
    x, y = _scores(member, "member scores"), _scores(nonmember, "non-member scores")
    from scipy import stats

    m, n = len(x), len(y)
    tz = stats.rankdata(np.concatenate([x, y]))
    v10 = (tz[:m] - stats.rankdata(x)) / n
    v01 = 1.0 - (tz[m:] - stats.rankdata(y)) / m
    return v10, v01


def delong(member, nonmember) -> tuple[float, float]:
    """(AUC, DeLong standard error) of member against non-member scores (higher: member)."""
    v10, v01 = placements(member, nonmember)
    var = v10.var(ddof=1) / len(v10) + v01.var(ddof=1) / len(v01)
    return float(v10.mean()), math.sqrt(max(var, 0.0))


def auc_summary(member, nonmember, *, confidence: float = 0.95) -> dict:
    """AUC, DeLong SE, a two-sided normal interval at ``confidence``, the null s.d. at these
    sizes and the one-sided Mann–Whitney p-value of "members score higher"."""
    from scipy import stats

    if not 0 < confidence < 1:
        raise ValueError("confidence must be in (0, 1)")
    x, y = _scores(member, "member scores"), _scores(nonmember, "non-member scores")
    auc, se = delong(x, y)
    z = float(stats.norm.ppf(0.5 + confidence / 2))
    p = float(stats.mannwhitneyu(x, y, alternative="greater").pvalue)
    return {"auc": auc, "se_delong": se, "ci": [max(0.0, auc - z * se), min(1.0, auc + z * se)],
            "confidence": confidence, "null_sd": null_sd(len(x), len(y)), "p_value": p,
            "test": "one-sided Mann-Whitney U (members score higher), scipy.stats.mannwhitneyu, method auto"}
