"""dpmean against the math: the parts compose to the target, each release has the noise
std σ_k·Δ_k, clipping bounds the sensitivities, and labels stay private (noisy counts)."""

import math

import pytest
import torch
from fake_context import FakeContext

from dpgen_bench.api import Budget, DataInfo, Split
from dpgen_bench.privacy import PrivacyLedger, calibrate_noise, compose_rdp
from methods.dpmean import COUNTS, SQUARES, SUMS, DPMean, DPMeanHparams

SHAPE = (1, 4, 4)
INFO = DataInfo("toy", SHAPE, 2, 6)


@pytest.mark.parametrize("eps", [0.5, 1.0, 10.0])
@pytest.mark.parametrize("variance", [True, False])
def test_parts_compose_to_the_target_as_one_calibrated_gaussian(eps, variance):
    m = DPMean(DPMeanHparams(variance=variance), INFO)
    parts = m.plan(Budget(eps))
    assert [p.name for p in parts] == ([SUMS, COUNTS, SQUARES] if variance else [SUMS, COUNTS])
    sigma = calibrate_noise(epsilon=eps, delta=1e-5, sample_rate=1.0, steps=1)
    # Σ 1/σ_k² = 1/σ²: the three Gaussian releases are one release at σ
    assert sum(1 / p.noise_multiplier ** 2 for p in parts) == pytest.approx(1 / sigma ** 2, rel=1e-6)
    assert 0.99 * eps <= compose_rdp(parts, 1e-5) <= eps
    PrivacyLedger(Budget(eps), parts)  # the ledger accepts the plan


def test_shares_follow_the_weights():
    m = DPMean(DPMeanHparams(weights="0.5,0.25,0.25"), INFO)
    s, c, q = m.plan(Budget(1.0))
    assert (s.noise_multiplier / c.noise_multiplier) ** 2 == pytest.approx(0.25 / 0.5)
    assert q.noise_multiplier == pytest.approx(c.noise_multiplier)


def _train(n_per_class=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(2 * n_per_class, *SHAPE, generator=g) * 2 - 1
    return Split(x, torch.arange(2).repeat_interleave(n_per_class))


def _fit(h, train, seed, eps=1.0):
    m = DPMean(h, INFO)
    budget = Budget(eps)
    ctx = FakeContext(PrivacyLedger(budget, m.plan(budget)), seed=seed)
    m.fit(train, budget, ctx)
    return m, ctx


def test_each_release_has_the_calibrated_std_and_every_release_is_counted():
    # with variance=False, min_std = 0: mean·n̂ = S + noise; compare the empirical std of the
    # released sums over seeds with σ_sums·clip (the noisy count is recovered from the record);
    # clip ≠ 1, so that a std that forgot the clip (or squared it) is visible
    h = DPMeanHparams(max_grad_norm=0.7, variance=False, min_std=0.0)
    train = _train()
    x = ((train.images.flatten(1) + 1) / 2).clamp(0, 1)
    x = x * (h.max_grad_norm / x.norm(dim=1, keepdim=True).clamp(min=h.max_grad_norm))
    true_sum = x[train.labels == 0].sum(0)
    sums, counts = [], []
    for seed in range(400):
        m, ctx = _fit(h, train, seed, eps=50.0)  # small noise: the [0, 1] clamp of the mean stays inactive
        n_hat = ctx.records[-1]["noisy_counts"][0]
        sums.append(m.mean[0].flatten() * n_hat)
        counts.append(n_hat)
        assert ctx.ledger.taken == {SUMS: 1, COUNTS: 1}
    parts = {p.name: p for p in DPMean(h, INFO).plan(Budget(50.0))}
    released = torch.stack(sums) - true_sum
    assert released.std().item() == pytest.approx(parts[SUMS].noise_multiplier * h.max_grad_norm, rel=0.1)
    assert torch.tensor(counts).std().item() == pytest.approx(parts[COUNTS].noise_multiplier, rel=0.15)
    assert released.mean().abs().item() < 0.1 * parts[SUMS].noise_multiplier


def test_clipping_bounds_both_sensitivities():
    h = DPMeanHparams(max_grad_norm=0.7)
    x = ((torch.rand(50, 16) * 2 - 1 + 1) / 2)
    x = x * (h.max_grad_norm / x.norm(dim=1, keepdim=True).clamp(min=h.max_grad_norm))
    assert (x.norm(dim=1) <= h.max_grad_norm + 1e-6).all() and ((x * x).norm(dim=1) <= h.max_grad_norm + 1e-6).all()


def test_samples_are_images_of_the_requested_classes():
    m, _ = _fit(DPMeanHparams(), _train(), seed=0, eps=10.0)
    x, y = m.sample(7, torch.tensor([0, 1, 1, 0, 1, 0, 0]), torch.Generator().manual_seed(0))
    assert x.shape == (7, *SHAPE) and x.min() >= -1 and x.max() <= 1 and y.tolist() == [0, 1, 1, 0, 1, 0, 0]
    assert m.std.min() >= m.hparams.min_std - 1e-7


def test_invalid_settings_are_refused():
    for bad in (dict(max_grad_norm=0), dict(weights="1,0,1"), dict(weights="a,b,c"), dict(min_std=-1)):
        with pytest.raises(ValueError):
            DPMeanHparams(**bad)
    assert math.isclose(sum(DPMeanHparams(weights="2,1,1").shares()), 1.0)
