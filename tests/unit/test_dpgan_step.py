"""The DPSGD discriminator step against the math of Algorithm 1, and adaptive n_D."""

import pytest
import torch
import torch.nn.functional as F

from dpgen_bench.nets.dcgan import ConditionalDiscriminator, ConditionalGenerator
from dpgen_bench.privacy.dpsgd import make_private
from fake_context import PartContext
from methods.dpgan import N_D_SCHEDULE, AdaptiveNd

SHAPE = (1, 16, 16)


def _batch(n_real=6, n_fake=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n_real + n_fake, *SHAPE, generator=g) * 2 - 1
    y = torch.randint(0, 10, (n_real + n_fake,), generator=g)
    t = torch.cat([torch.ones(n_real), torch.zeros(n_fake)])
    return x, y, t


def _per_example_grads(D, x, y, t):
    grads = []
    for i in range(len(x)):
        D.zero_grad()
        loss = F.binary_cross_entropy_with_logits(D(x[i:i + 1], y[i:i + 1]), t[i:i + 1])
        loss.backward()
        grads.append([p.grad.detach().clone() for p in D.parameters()])
    return grads


@pytest.mark.parametrize("mode", ["hooks", "functorch"])
def test_per_example_gradients_are_clipped_to_C_and_averaged_over_2B(mode):
    torch.manual_seed(0)
    D = ConditionalDiscriminator(SHAPE, 10, width=8)
    ref = ConditionalDiscriminator(SHAPE, 10, width=8)
    ref.load_state_dict(D.state_dict())
    x, y, t = _batch()
    C, B = 0.05, 6  # small C so that every example is clipped
    expected = _per_example_grads(ref, x, y, t)
    norms = [torch.sqrt(sum((g ** 2).sum() for g in gs)) for gs in expected]
    assert min(norms) > C
    clipped_sum = [sum(gs[k] * min(1.0, C / n) for gs, n in zip(expected, norms)) for k in range(len(expected[0]))]

    opt = torch.optim.SGD(D.parameters(), lr=0.0)
    gsm, dp_opt = make_private(D, opt, ctx=PartContext(0.0), part="d", max_grad_norm=C, expected_batch_size=2 * B,
                               grad_sample_mode=mode)
    loss = F.binary_cross_entropy_with_logits(gsm(x, y), t)
    loss.backward()
    # Opacus' per-example gradients are those of the per-example losses
    for p, k in zip(D.parameters(), range(len(expected[0]))):
        for i in (0, 5, 11):
            torch.testing.assert_close(p.grad_sample[i], expected[i][k], rtol=1e-4, atol=1e-6)
    dp_opt.step()
    for p, s in zip(D.parameters(), clipped_sum):
        torch.testing.assert_close(p.grad, s / (2 * B), rtol=1e-4, atol=1e-7)


def test_noise_std_is_sigma_C_over_expected_batch_size():
    torch.manual_seed(0)
    D = ConditionalDiscriminator(SHAPE, 10, width=48)
    sigma, C, ebs = 1.3, 0.7, 64
    gen = torch.Generator().manual_seed(123)
    opt = torch.optim.SGD(D.parameters(), lr=0.0)
    gsm, dp_opt = make_private(D, opt, ctx=PartContext(sigma), part="d", max_grad_norm=C, expected_batch_size=ebs,
                               noise_generator=gen)
    x, y, t = _batch()
    loss = 0.0 * F.binary_cross_entropy_with_logits(gsm(x, y), t)  # zero gradient: pure noise remains
    loss.backward()
    dp_opt.step()
    noise = torch.cat([p.grad.flatten() for p in D.parameters()])
    assert noise.numel() > 50_000
    expected = sigma * C / ebs
    # std of a sample std with n ≈ 1e5 is ≈ expected/sqrt(2n): 1% is > 4 standard errors
    assert noise.std().item() == pytest.approx(expected, rel=0.01)
    assert abs(noise.mean().item()) < 4 * expected / noise.numel() ** 0.5


def test_generator_step_leaves_discriminator_gradients_alone():
    from methods.dpgan import DPGAN, DPGANHparams
    from dpgen_bench.api import DataInfo

    m = DPGAN(DPGANHparams(d_width=8, g_width=8, latent_dim=8, batch_size=8), DataInfo("t", SHAPE, 10, 100))
    opt_d = torch.optim.Adam(m.D.parameters())
    gsm, _ = make_private(m.D, opt_d, ctx=PartContext(1.0), part="d", max_grad_norm=1.0, expected_batch_size=16)
    opt_g = torch.optim.Adam(m.G.parameters())
    before = [p.detach().clone() for p in m.G.parameters()]
    m._g_step(gsm, opt_g, torch.device("cpu"))
    assert all(p.grad is None for p in m.D.parameters())
    assert all(getattr(p, "grad_sample", None) is None for p in m.D.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, m.G.parameters()))


def test_adaptive_n_d_follows_schedule_with_grace():
    s = AdaptiveNd(beta=0.9, threshold=0.6, grace=None)
    assert s.grace == 20 and s.n_d == 1
    history = []
    for _ in range(25):  # accuracy 0.9: EMA above the threshold, stays at 1
        s.observe(0.9)
        history.append(s.n_d)
    assert set(history) == {1}
    changes = []
    for k in range(400):  # accuracy 0.3: EMA drops below 0.6, then moves every `grace` steps
        if s.observe(0.3):
            changes.append((k, s.n_d))
    assert [n for _, n in changes][:4] == list(N_D_SCHEDULE[1:5])
    gaps = [b[0] - a[0] for a, b in zip(changes, changes[1:])]
    assert all(g == 20 for g in gaps)
    # EMA after k observations of 0.3 from 0.9 is 0.3 + 0.6·0.9^k ≤ 0.6 first at k = 7 (index 6);
    # the grace period (20) had already passed during the 25 high-accuracy steps.
    assert changes[0][0] == 6


def test_adaptive_schedule_saturates_at_the_last_value():
    s = AdaptiveNd(beta=0.5, threshold=0.6, grace=1)
    for _ in range(100):
        s.observe(0.0)
    assert s.n_d == N_D_SCHEDULE[-1]


def test_generator_and_discriminator_shapes():
    for shape in [(1, 16, 16), (1, 28, 28), (3, 32, 32)]:
        G = ConditionalGenerator(shape, 10, 16, 8)
        D = ConditionalDiscriminator(shape, 10, 16)
        x = G(torch.randn(3, 8), torch.tensor([0, 1, 2]))
        assert x.shape == (3, *shape) and x.abs().max() <= 1
        assert D(x, torch.tensor([0, 1, 2])).shape == (3,)


def test_paper_parameter_counts():
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert count(ConditionalDiscriminator((1, 28, 28), 10, 128)) == pytest.approx(1.72e6, rel=0.01)
    assert count(ConditionalGenerator((1, 28, 28), 10, 128, 128)) == pytest.approx(2.27e6, rel=0.01)
    assert count(ConditionalDiscriminator((3, 32, 32), 2, 128)) == pytest.approx(2.64e6, rel=0.01)
    assert count(ConditionalGenerator((3, 32, 32), 2, 128, 128)) == pytest.approx(3.16e6, rel=0.01)


@pytest.mark.parametrize("method,mode", [("dpgan", "hooks"), ("dpgan", "bk"), ("dpgan", "ghost"), ("gan", None)])
@pytest.mark.parametrize("cap", [None, 5, 7, 24])
def test_d_step_in_physical_chunks_is_the_same_update(method, mode, cap):
    """``max_physical_batch`` changes memory, not the update: chunks of clipped per-example
    gradients summed by Opacus (skipped steps) with one noise draw at the end, or weighted
    chunk losses without privacy, give the whole batch's step."""
    from dpgen_bench.api import DataInfo, Split
    from methods.dpgan import DPGAN, DPGANHparams
    from methods.gan import GAN

    cls = DPGAN if method == "dpgan" else GAN
    x, y, t = _batch(n_real=9, n_fake=8, seed=3)  # 17 rows: uneven chunks, one all-real, one mixed
    real, fake_x, fake_y = Split(x[:9], y[:9]), x[9:], y[9:]

    def one_step(max_physical_batch):
        torch.manual_seed(0)
        m = cls(DPGANHparams(d_width=8, g_width=8, latent_dim=8, batch_size=8, max_physical_batch=max_physical_batch),
                DataInfo("t", SHAPE, 10, 100))
        opt = torch.optim.SGD(m.D.parameters(), lr=1.0)
        D = m.D
        if m.private:
            D, opt = make_private(m.D, opt, ctx=PartContext(0.5), part="d", max_grad_norm=0.05, expected_batch_size=16,
                                  noise_generator=torch.Generator().manual_seed(11), grad_sample_mode=mode)
        loss = m._d_step(D, opt, real, fake_x, fake_y)
        return loss, [p.detach().clone() for p in m.D.parameters()]

    loss_whole, whole = one_step(None)
    loss_chunked, chunked = one_step(cap)
    assert loss_chunked == pytest.approx(loss_whole, rel=1e-5)
    for a, b in zip(whole, chunked):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    # and the step did move D (by the noisy clipped mean, not by nothing)
    torch.manual_seed(0)
    fresh = cls(DPGANHparams(d_width=8, g_width=8, latent_dim=8, batch_size=8), DataInfo("t", SHAPE, 10, 100))
    assert any(not torch.equal(a, p) for a, p in zip(chunked, fresh.D.parameters()))


def test_max_physical_batch_must_hold_two_rows():
    from methods.dpgan import DPGANHparams

    with pytest.raises(ValueError, match="max_physical_batch"):
        DPGANHparams(max_physical_batch=1)


@pytest.mark.parametrize("eps,threshold", [(1.0, 0.7), (10.0, 0.6)])
def test_threshold_by_epsilon_reaches_the_scheduler(eps, threshold):
    from fake_context import FakeContext

    from dpgen_bench.api import Budget, DataInfo, Split
    from dpgen_bench.privacy.ledger import PrivacyLedger

    from methods.dpgan import DPGAN, DPGANHparams

    h = DPGANHparams(d_width=8, g_width=8, latent_dim=8, batch_size=8, steps=4, n_d="adaptive",
                     threshold_by_epsilon="1:0.7,10:0.6")
    m = DPGAN(h, DataInfo("t", SHAPE, 10, 100))
    budget = Budget(eps)
    ctx = FakeContext(PrivacyLedger(budget, m.plan(budget)))
    m.fit(Split(torch.rand(100, *SHAPE) * 2 - 1, torch.randint(0, 10, (100,))), budget, ctx)
    assert m.scheduler.threshold == threshold


def _ema_gan(ema_decay: float, steps: int = 6, ema_warmup: str = "bias-corrected"):
    from dpgen_bench.api import Budget, DataInfo, Split
    from dpgen_bench.privacy import PrivacyLedger
    from fake_context import FakeContext
    from methods.dpgan import DPGAN, DPGANHparams

    g = torch.Generator().manual_seed(0)
    train = Split(torch.rand(64, *SHAPE, generator=g) * 2 - 1, torch.randint(0, 10, (64,), generator=g))
    m = DPGAN(DPGANHparams(d_width=8, g_width=8, latent_dim=8, batch_size=8, steps=steps, ema_decay=ema_decay,
                            ema_warmup=ema_warmup),
              DataInfo("t", SHAPE, 10, 64))
    budget = Budget(10.0)
    return m, train, budget, FakeContext(PrivacyLedger(budget, m.plan(budget)), seed=0)


@pytest.mark.parametrize("warmup", ["none", "bias-corrected"])
def test_generator_average_is_the_exponential_moving_average_of_the_iterates(monkeypatch, warmup):
    """ema_decay = β: after each G step G_ema ← β·G_ema + (1 − β)·G, buffers copied; the
    released G is the average ("bias-corrected": divided by 1 − β^T with G_ema starting at 0,
    so none of G's initial weights remain). Checked against the formula over the iterates a spy
    records."""
    from methods.dpgan import DPGAN

    beta = 0.7
    m, train, budget, ctx = _ema_gan(beta, ema_warmup=warmup)
    start = [p.detach().clone() for p in m.G.parameters()]
    iterates = []
    real_g_step = DPGAN._g_step

    def spy(self, *args):
        out = real_g_step(self, *args)
        iterates.append(([p.detach().clone() for p in self.G.parameters()],
                         [b.detach().clone() for b in self.G.buffers()]))
        return out

    monkeypatch.setattr(DPGAN, "_g_step", spy)
    m.fit(train, budget, ctx)
    assert len(iterates) == 6  # n_d = 1: one G step per D step
    expected = start if warmup == "none" else [torch.zeros_like(s) for s in start]
    for params, _ in iterates:
        expected = [beta * e + (1 - beta) * p for e, p in zip(expected, params)]
    if warmup == "bias-corrected":
        expected = [e / (1 - beta ** len(iterates)) for e in expected]
    for got, want in zip(m.G.parameters(), expected):
        torch.testing.assert_close(got, want)
    for got, want in zip(m.G.buffers(), iterates[-1][1]):  # BatchNorm's statistics: the last iterate's
        torch.testing.assert_close(got, want)
    assert not torch.allclose(next(m.G.parameters()), iterates[-1][0][0])  # not the last iterate


def test_without_average_the_released_generator_is_the_last_iterate():
    m, train, budget, ctx = _ema_gan(0.0)
    assert m.G_ema is None
    m.fit(train, budget, ctx)
    assert ctx.ledger.taken == {"discriminator": 6}
    with pytest.raises(ValueError, match="ema_decay"):
        _ema_gan(1.0)


def test_weight_decay_on_d_shrinks_after_the_noised_step():
    """AdamW under the DP optimiser: with a zero gradient and σ = 0 the noised update is 0, so
    a step leaves D's weights × (1 − lr·wd): the decay is applied to the weights, after the
    noise, not mixed into the clipped per-example gradients."""
    torch.manual_seed(0)
    D = ConditionalDiscriminator(SHAPE, 10, width=8)
    start = [p.detach().clone() for p in D.parameters()]
    lr, wd = 0.1, 0.5
    opt = torch.optim.AdamW(D.parameters(), lr=lr, weight_decay=wd)
    gsm, dp_opt = make_private(D, opt, ctx=PartContext(0.0), part="d", max_grad_norm=1.0, expected_batch_size=12)
    x, y, t = _batch()
    (0.0 * F.binary_cross_entropy_with_logits(gsm(x, y), t)).backward()
    dp_opt.step()
    for p, s in zip(D.parameters(), start):
        torch.testing.assert_close(p.detach(), s * (1 - lr * wd))


@pytest.mark.parametrize("wd", [0.0, 0.3])
def test_fit_builds_d_optimiser_from_weight_decay_d(monkeypatch, wd):
    """weight_decay_d reaches D's optimiser; at 0 it stays the paper's Adam (the records before
    the setting: the same update, bit for bit)."""
    import dataclasses

    import methods.dpgan as module

    m, train, budget, ctx = _ema_gan(0.0)
    m.hparams = dataclasses.replace(m.hparams, weight_decay_d=wd)
    seen = []
    real = module.make_private

    def spy(D, opt, **kw):
        seen.append(opt)
        return real(D, opt, **kw)

    monkeypatch.setattr(module, "make_private", spy)
    m.fit(train, budget, ctx)
    (opt,) = seen
    assert type(opt) is (torch.optim.AdamW if wd else torch.optim.Adam)
    assert opt.param_groups[0]["weight_decay"] == wd
