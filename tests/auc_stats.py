"""The spread of an AUC, for tests that hold a measured attack AUC to a band."""

import math


def auc_sd(auc: float, n_pos: int, n_neg: int) -> float:
    """Standard error of an AUC from n_pos positives and n_neg negatives (Hanley & McNeil
    1982, "The meaning and use of the area under a receiver operating characteristic (ROC)
    curve"): the variance of the Mann–Whitney statistic with their Q1 = A/(2 − A), Q2 =
    2A²/(1 + A), exact for exponentially distributed scores. At AUC = 0.5 it is
    √((n_pos + n_neg + 1) / (12·n_pos·n_neg)), the null spread."""
    q1, q2 = auc / (2 - auc), 2 * auc**2 / (1 + auc)
    var = auc * (1 - auc) + (n_pos - 1) * (q1 - auc**2) + (n_neg - 1) * (q2 - auc**2)
    return math.sqrt(var / (n_pos * n_neg))
