"""``benchmarks/gswgan_eps.py``: the ε of GS-WGAN's published setting with a step's B rows
accounted jointly, against independent accountants and closed forms; the numbers
references.csv stores from it; the dominating pair docs/privacy.md uses for the sound mode's
step, checked by quadrature."""

import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy.optimize import brentq
from scipy.stats import norm

from dpgen_bench.api import PrivacyPart
from dpgen_bench.privacy.accounting import compose_prv
from dpgen_bench.report.references import PATH

pytest.importorskip("dp_accounting")
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import gswgan_eps as G  # noqa: E402


def analytic_gaussian_epsilon(multiplier: float, delta: float) -> float:
    """The exact ε of the Gaussian mechanism (Balle and Wang 2018, Theorem 8):
    δ(ε) = Φ(μ/2 − ε/μ) − e^ε Φ(−μ/2 − ε/μ), μ = 1/multiplier."""
    mu = 1 / multiplier
    return brentq(lambda e: norm.cdf(mu / 2 - e / mu) - math.exp(e + norm.logcdf(-mu / 2 - e / mu)) - delta, 0, 500)


@pytest.mark.parametrize("sigma,batch,steps", [(4.0, 4, 4), (1.07, 32, 3)])
def test_joint_epsilon_without_subsampling_is_the_gaussian_mechanisms_closed_form(sigma, batch, steps):
    """K = 1: T steps of one Gaussian of multiplier σ/√B are one Gaussian of multiplier σ/√(BT);
    the PLD's upper and lower estimates bracket its exact ε, within 1e-3 relative."""
    exact = analytic_gaussian_epsilon(sigma / math.sqrt(batch * steps), 1e-5)
    upper = G.joint_epsilon_pld(sigma, 1, steps, batch)
    lower = G.joint_epsilon_pld(sigma, 1, steps, batch, lower=True)
    assert lower <= exact * (1 + 1e-9) and exact <= upper * (1 + 1e-9)
    assert upper == pytest.approx(exact, rel=1e-3) and lower == pytest.approx(exact, rel=1e-3)


def test_joint_epsilon_with_subsampling_agrees_with_prv_accountant():
    """Subsampled: the PLD (dp-accounting) against prv-accountant (Gopi et al.), an independent
    implementation, on the same Poisson-subsampled Gaussian; RDP (Opacus, looser) is above both."""
    sigma, k, batch, steps = 2.0, 50, 4, 500
    upper = G.joint_epsilon_pld(sigma, k, steps, batch)
    lower = G.joint_epsilon_pld(sigma, k, steps, batch, lower=True)
    prv = compose_prv([PrivacyPart("joint", sigma / math.sqrt(batch), 1 / k, steps)], 1e-5)
    assert lower <= upper and upper == pytest.approx(prv, rel=0.02) and lower == pytest.approx(upper, rel=0.05)
    assert G.joint_epsilon_rdp(sigma, k, steps, batch) > upper


def test_the_published_setting_is_ten_per_row_and_hundreds_jointly():
    """σ = 1.07, K = 1,000, B = 32, T = 20,000: GS-WGAN's accounting gives 9.99 (autodp's number
    too, where installed); the B rows jointly ≈ 329, the number references.csv stores."""
    args = (1.07, 1000, 20_000, 32)
    assert G.per_row_epsilon(*args) == pytest.approx(9.99, abs=0.005)
    theirs = G.autodp_per_row_epsilon(*args)
    if theirs is not None:
        assert theirs == pytest.approx(G.per_row_epsilon(*args), rel=1e-5)
    joint = G.joint_epsilon_pld(*args)
    assert 300 < joint < G.joint_epsilon_rdp(*args)
    stored = pd.read_csv(PATH)
    gswgan = stored[(stored["method"] == "gswgan") & (stored["paper"] == "private-gans-revisited-tmlr2023") &
                    (stored["dataset"] == "mnist") & (stored["epsilon"] == 10)]
    assert (gswgan["eps_sound"] == float(f"{joint:.3g}")).all() and len(gswgan) == 2


def test_dpimagebench_sigma_and_its_joint_epsilon_at_one():
    """DPImageBench's σ (Opacus at rate 1/K for T steps) meets its ε by Opacus' accounting of T
    steps; accounted jointly at ε = 1 it is the 459 references.csv stores."""
    sigma = G.dpimagebench_sigma(1.0)
    assert 0.98 <= G.opacus_epsilon(sigma, 1000, 20_000) <= 1.0
    stored = pd.read_csv(PATH)
    rows = stored[(stored["paper"] == "dpimagebench") & (stored["method"] == "gswgan") & (stored["epsilon"] == 1) &
                  stored["dataset"].isin(["mnist", "fashion-mnist"])]
    assert (rows["eps_sound"] == float(f"{G.joint_epsilon_pld(sigma, 1000, 20_000, 32):.3g}")).all()


def _hockey_stick_1d(q: float, s: float, gamma: float) -> float:
    """max of H_γ(P‖Q) and H_γ(Q‖P) for P = (1−q)N(0, s²) + qN(1, s²), Q = N(0, s²): the
    Poisson add/remove pair (distance D = 1)."""
    x = np.linspace(-10 * s - 1, 10 * s + 2, 60001)
    p, r = (1 - q) * norm.pdf(x, 0, s) + q * norm.pdf(x, 1, s), norm.pdf(x, 0, s)
    dx = x[1] - x[0]
    return max(np.maximum(p - gamma * r, 0).sum() * dx, np.maximum(r - gamma * p, 0).sum() * dx)


def _hockey_stick_step(q: float, s: float, gamma: float, mu, a, b, n: int = 401) -> float:
    """max of H_γ(P‖Q) and H_γ(Q‖P) for one step of the sound mode's mechanism in the plane of
    its three means: P = (1−q)N(μ) + qN(a), Q = (1−q)N(μ) + qN(b) (the untouched discriminators'
    mixture reduced to one Gaussian by joint convexity), by quadrature."""
    half = 8 * s + 1.5
    xs = np.linspace(-half, half, n)
    gx, gy = np.meshgrid(xs, xs)

    def gauss(c):
        return np.exp(-((gx - c[0]) ** 2 + (gy - c[1]) ** 2) / (2 * s * s)) / (2 * np.pi * s * s)

    p = (1 - q) * gauss(mu) + q * gauss(a)
    r = (1 - q) * gauss(mu) + q * gauss(b)
    area = (xs[1] - xs[0]) ** 2
    return float(max(np.maximum(p - gamma * r, 0).sum(), np.maximum(r - gamma * p, 0).sum()) * area)


def test_the_add_remove_pair_dominates_a_step_whose_three_means_lie_within_d():
    """Any step of the sound mode's mechanism (three means pairwise ≤ D = 1 apart) is dominated by
    the Poisson add/remove pair at distance D: the pair docs/privacy.md's PLD column accounts.
    A pair wider than D (dp-accounting's REPLACE_ONE pair with sensitivity D: means at ±D) is not."""
    rng = np.random.default_rng(0)
    for q in (0.1, 0.5):
        for s in (0.5, 1.0):
            for gamma in (1.0, math.e):
                bound = _hockey_stick_1d(q, s, gamma)
                for _ in range(4):
                    pts = rng.uniform(-1, 1, size=(3, 2))
                    pts /= max(np.linalg.norm(pts[i] - pts[j]) for i, j in ((0, 1), (0, 2), (1, 2)))
                    assert _hockey_stick_step(q, s, gamma, *pts) <= bound + 1e-4
                assert _hockey_stick_step(q, s, gamma, (0, 0), (0, 0), (1, 0)) == pytest.approx(bound, abs=1e-4)
    assert _hockey_stick_step(0.5, 0.5, 1.0, (0, 0), (-1, 0), (1, 0)) > _hockey_stick_1d(0.5, 0.5, 1.0) + 0.01
