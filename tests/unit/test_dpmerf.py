"""DP-MERF against the math: unit-norm features (sensitivity 1 of the embedding sum), the
two releases composing to the target, the release's noise std, and a generator that
matches a noiseless embedding."""

import math

import pytest
import torch
from fake_context import FakeContext

from dpgen_bench.api import Budget, DataInfo, Split
from dpgen_bench.privacy import PrivacyLedger, calibrate_noise, compose_rdp
from dpgen_bench.errors import UserError
from methods.dpmerf import COUNT, SUM, DPMERF, AuthorsGenerator, DPMERFHparams, label_embedding, random_features

SHAPE = (1, 16, 16)
INFO = DataInfo("toy", SHAPE, 3, 30)


def test_features_have_unit_norm_so_one_record_moves_the_sum_by_one():
    freqs = torch.randn(50, 256, generator=torch.Generator().manual_seed(0)) / math.sqrt(5.0)
    x = torch.rand(20, *SHAPE)
    phi = random_features(x, freqs)
    assert phi.shape == (20, 100) and torch.allclose(phi.norm(dim=1), torch.ones(20), atol=1e-5)
    y = torch.randint(0, 3, (20,))
    with_all = label_embedding(phi, y, 3)
    without_last = label_embedding(phi[:-1], y[:-1], 3)
    assert (with_all - without_last).norm().item() == pytest.approx(1.0, abs=1e-5)


def test_kernel_of_the_features_is_the_gaussian_kernel():
    # E[φ(x)·φ(x')] = exp(-‖x − x'‖² / (2·rff_sigma)) with frequencies ~ N(0, I / rff_sigma)
    sig, d = 4.0, 16
    freqs = torch.randn(20_000, d, generator=torch.Generator().manual_seed(1), dtype=torch.float64) / math.sqrt(sig)
    x, xp = torch.rand(1, d, dtype=torch.float64), torch.rand(1, d, dtype=torch.float64)
    approx = (random_features(x, freqs) * random_features(xp, freqs)).sum().item()
    assert approx == pytest.approx(math.exp(-((x - xp) ** 2).sum().item() / (2 * sig)), abs=0.02)


@pytest.mark.parametrize("eps", [0.5, 1.0, 10.0])
def test_two_releases_compose_to_the_target(eps):
    parts = DPMERF(DPMERFHparams(num_features=20), INFO).plan(Budget(eps))
    assert [p.name for p in parts] == [SUM, COUNT] and all(p.steps == 1 and p.sample_rate == 1 for p in parts)
    sigma = calibrate_noise(epsilon=eps, delta=1e-5, sample_rate=1.0, steps=1)
    assert sum(1 / p.noise_multiplier ** 2 for p in parts) == pytest.approx(1 / sigma ** 2, rel=1e-6)
    assert 0.99 * eps <= compose_rdp(parts, 1e-5) <= eps


def _data(n=30, seed=0):
    g = torch.Generator().manual_seed(seed)
    return Split(torch.rand(n, *SHAPE, generator=g) * 2 - 1, torch.arange(3).repeat(n // 3))


def test_fit_counts_both_releases_and_trains_the_generator():
    h = DPMERFHparams(num_features=64, epochs=3, batch_size=10, g_width=4, log_every=1)
    m = DPMERF(h, INFO)
    budget = Budget(5.0)
    ctx = FakeContext(PrivacyLedger(budget, m.plan(budget)))
    m.fit(_data(36), budget, ctx)  # the noisy count n̂ ≈ 36 ± 2: ⌊n̂ / B⌋ = 3 steps an epoch
    assert ctx.ledger.taken == {SUM: 1, COUNT: 1}
    assert len([r for r in ctx.records if "mmd2" in r]) == 3 * 3
    x, y = m.sample(6, torch.tensor([0, 1, 2, 0, 1, 2]), torch.Generator().manual_seed(0))
    assert x.shape == (6, *SHAPE) and x.min() >= -1 and x.max() <= 1 and y.tolist() == [0, 1, 2, 0, 1, 2]


def test_the_releases_have_the_calibrated_std_around_the_true_values():
    h = DPMERFHparams(num_features=40)
    budget, train = Budget(2.0), _data()
    x = (train.images + 1) / 2
    errors, counts = [], []
    for seed in range(200):
        m = DPMERF(h, INFO)
        ctx = FakeContext(PrivacyLedger(budget, m.plan(budget)), seed=seed)
        s_hat, n_hat = m.release(train, ctx)
        true_sum = label_embedding(random_features(x, m.freqs), train.labels, 3)  # the run's own features
        errors.append((s_hat - true_sum).flatten())
        counts.append(n_hat.item() - len(train))
        assert ctx.ledger.taken == {SUM: 1, COUNT: 1}
    s_part, c_part = DPMERF(h, INFO).plan(budget)
    errors = torch.cat(errors)
    assert errors.std().item() == pytest.approx(s_part.noise_multiplier, rel=0.05)
    assert abs(errors.mean().item()) < 0.05 * s_part.noise_multiplier
    assert torch.tensor(counts).std().item() == pytest.approx(c_part.noise_multiplier, rel=0.15)


def test_the_authors_generator_trains_and_samples_in_range():
    """``generator="authors"`` (their ConvCondGen): the same releases and loop; batch norm is
    in training mode while fitting and uses its running statistics when sampling."""
    h = DPMERFHparams(num_features=64, epochs=2, batch_size=10, generator="authors", log_every=1)
    m = DPMERF(h, INFO)
    assert isinstance(m.G, AuthorsGenerator)
    budget = Budget(5.0)
    ctx = FakeContext(PrivacyLedger(budget, m.plan(budget)))
    before = {k: v.clone() for k, v in m.G.state_dict().items()}
    m.fit(_data(36), budget, ctx)
    assert ctx.ledger.taken == {SUM: 1, COUNT: 1} and not m.G.training
    assert not torch.equal(before["bn1.running_mean"], m.G.bn1.running_mean)  # trained in training mode
    assert not torch.equal(before["fc1.weight"], m.G.fc1.weight)
    labels = torch.tensor([0, 1, 2, 0])
    x, y = m.sample(4, labels, torch.Generator().manual_seed(0))
    assert x.shape == (4, *SHAPE) and x.min() >= -1 and x.max() <= 1 and y.tolist() == labels.tolist()
    z = torch.randn(4, h.latent_dim, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():  # eval mode: an image does not depend on the rest of its batch
        assert torch.allclose(m.G(z, labels)[:1], m.G(z[:1], labels[:1]), atol=1e-6)


def test_the_authors_generator_needs_a_side_divisible_by_four():
    with pytest.raises(UserError, match="divisible by 4"):
        DPMERF(DPMERFHparams(generator="authors"), DataInfo("toy", (1, 18, 18), 3, 30))
    with pytest.raises(ValueError, match="generator must be one of"):
        DPMERFHparams(generator="fc")
