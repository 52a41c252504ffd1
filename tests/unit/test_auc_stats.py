"""``tests/auc_stats.auc_sd`` against simulated AUCs (the MIA sanity test's bands rest on it)."""

import math

import numpy as np
import pytest

from auc_stats import auc_sd


def test_null_value_is_the_mann_whitney_spread():
    assert auc_sd(0.5, 64, 64) == pytest.approx(math.sqrt((64 + 64 + 1) / (12 * 64 * 64)), rel=1e-12)
    assert auc_sd(0.5, 30, 70) == pytest.approx(math.sqrt((30 + 70 + 1) / (12 * 30 * 70)), rel=1e-12)


@pytest.mark.parametrize("auc", [0.5, 0.75, 0.9])
def test_matches_the_spread_of_simulated_aucs(auc):
    """Hanley & McNeil's Q1, Q2 are exact for exponentially distributed scores: draw 64 + 64
    such scores with P(positive > negative) = auc, 4,000 times; the AUCs' standard deviation
    is auc_sd (the estimate's own relative error is ~1.1 %, the tolerance 5 %). The AUC is the
    Mann–Whitney statistic (no ties with continuous scores)."""
    rng = np.random.default_rng(0)
    rate = auc / (1 - auc)  # X ~ Exp(1), Y ~ Exp(rate): P(X > Y) = rate / (1 + rate) = auc
    pos = rng.exponential(1.0, (4000, 64, 1))
    neg = rng.exponential(1.0 / rate, (4000, 1, 64))
    aucs = (pos > neg).mean(axis=(1, 2))
    assert aucs.mean() == pytest.approx(auc, abs=0.003)
    assert aucs.std() == pytest.approx(auc_sd(auc, 64, 64), rel=0.05)
    # the tolerance tells a wrong formula apart: the binomial √(A(1 − A)/n) is 22–32 % off
    assert abs(aucs.std() / math.sqrt(auc * (1 - auc) / 64) - 1) > 0.15

