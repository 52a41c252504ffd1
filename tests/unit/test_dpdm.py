"""DPDM: EDM's preconditioning and loss, the Heun sampler, noise
multiplicity through the book-keeping DP-SGD path, the EMA and the ledger."""

import math

import pytest
import torch
from fake_context import FakeContext

import methods.dpdm as dpdm
from dpgen_bench.api import Budget, DataInfo, Split
from dpgen_bench.privacy import PrivacyLedger, compose_rdp
from methods.dpdm import DPDM, DPDMHparams, denoise, edm_loss, edm_sample, precondition, sigma_schedule

INFO = DataInfo("digits", (1, 16, 16), 10, 200)


def _tiny(**extra) -> DPDMHparams:
    h = {k: v for k, v in DPDM.presets["tiny"]["*"].items() if k != "samples_per_class"}
    return DPDMHparams(**(h | extra))


def _train(n=200, seed=0) -> Split:
    g = torch.Generator().manual_seed(seed)
    return Split(torch.rand(n, 1, 16, 16, generator=g) * 2 - 1, torch.randint(0, 10, (n,), generator=g))


def test_preconditioning_is_edms():
    sigma = torch.tensor([0.002, 0.5, 1.0, 80.0])
    c_skip, c_out, c_in, c_noise = precondition(sigma)
    sd = dpdm.SIGMA_DATA
    torch.testing.assert_close(c_skip, sd**2 / (sigma**2 + sd**2))
    torch.testing.assert_close(c_in, 1 / (sigma**2 + sd**2).sqrt())
    torch.testing.assert_close(c_noise, sigma.log() / 4)
    weight = (sigma**2 + sd**2) / (sigma * sd) ** 2
    torch.testing.assert_close(weight * c_out**2, torch.ones(4))  # the network's target has unit variance
    # D(x; σ) → x as σ → 0 (c_skip → 1, c_out → 0), whatever the network says
    net = lambda x, c, y: torch.full_like(x, 123.0)  # noqa: E731
    x = torch.randn(2, 1, 4, 4)
    torch.testing.assert_close(denoise(net, x, torch.full((2,), 1e-8), torch.zeros(2, dtype=torch.long)), x,
                               atol=1e-5, rtol=0)


def test_edm_loss_is_the_weighted_denoising_error():
    net = lambda x, c, y: torch.zeros_like(x)  # noqa: E731  D = c_skip·(x + σn)
    x, n = torch.randn(3, 1, 4, 4), torch.randn(3, 1, 4, 4)
    sigma = torch.tensor([0.1, 1.0, 10.0])
    c_skip = precondition(sigma)[0].view(-1, 1, 1, 1)
    weight = (sigma**2 + 0.25) / (sigma * 0.5) ** 2
    expect = weight * (c_skip * (x + sigma.view(-1, 1, 1, 1) * n) - x).pow(2).flatten(1).mean(1)
    torch.testing.assert_close(edm_loss(net, x, torch.zeros(3, dtype=torch.long), sigma, n), expect)


def test_schedule_runs_from_sigma_max_to_sigma_min_then_zero():
    h = _tiny(sampler_steps=18)
    t = sigma_schedule(h)
    assert len(t) == 19 and t[0].item() == pytest.approx(80.0) and t[-2].item() == pytest.approx(0.002)
    assert t[-1].item() == 0 and bool((t[1:] < t[:-1]).all())


@pytest.mark.parametrize("churn", [0.0, 40.0])
def test_heun_sampler_lands_on_the_data_for_a_perfect_denoiser(churn):
    """A one-image data set c: the ideal denoiser is D ≡ c at every σ, and the ODE (and the
    churned SDE) ends exactly at c from any start."""
    c = torch.linspace(-1, 1, 16).view(1, 1, 4, 4)

    class Perfect(torch.nn.Module):
        def forward(self, x_in, c_noise, y):  # F such that c_skip·x + c_out·F = c
            sigma = (4 * c_noise).exp().view(-1, 1, 1, 1)
            c_skip, c_out, c_in, _ = [v.view(-1, 1, 1, 1) for v in precondition(sigma.flatten())]
            return (c - c_skip * (x_in / c_in)) / c_out

    out = edm_sample(Perfect(), torch.zeros(5, dtype=torch.long), (1, 4, 4), _tiny(sampler_steps=10, s_churn=churn),
                     torch.Generator().manual_seed(0))
    torch.testing.assert_close(out, c.expand(5, -1, -1, -1), atol=1e-4, rtol=0)


def test_fit_clips_k_rows_per_example_as_one_and_counts_every_step(monkeypatch):
    seen = []
    from dpgen_bench.privacy import dpsgd

    real = dpsgd.private_backward

    def spy(module, opt, loss, *, also=(), group=1):
        seen.append((len(loss), group))
        return real(module, opt, loss, also=also, group=group)

    monkeypatch.setattr(dpsgd, "private_backward", spy)  # what dpdm's private_chunk calls
    h = _tiny(noise_multiplicity=3, steps=5)
    m = DPDM(h, INFO)
    budget = Budget(10.0)
    plan = m.plan(budget)
    ctx = FakeContext(PrivacyLedger(budget, plan), seed=0)
    m.fit(_train(), budget, ctx)
    assert ctx.ledger.taken == {"denoiser": 5} and compose_rdp(plan, budget.delta) <= 10.0
    assert seen and all(g == 3 and rows % 3 == 0 for rows, g in seen)
    assert plan[0].sample_rate == pytest.approx(16 / 200)


def test_ema_follows_the_iterates():
    m = DPDM(_tiny(ema_decay=0.0, steps=2), INFO)  # decay 0: the EMA is the last iterate
    budget = Budget(10.0)
    m.fit(_train(), budget, FakeContext(PrivacyLedger(budget, m.plan(budget)), seed=1))
    for pe, p in zip(m.ema.parameters(), m.net.parameters()):
        torch.testing.assert_close(pe, p)


def test_samples_are_images_of_the_requested_labels():
    m = DPDM(_tiny(), INFO)
    x, y = m.sample(7, torch.tensor([3] * 7), torch.Generator().manual_seed(0))
    assert x.shape == (7, 1, 16, 16) and x.dtype == torch.float32 and (y == 3).all()
    assert x.min() >= -1 and x.max() <= 1 and math.isfinite(x.sum().item())


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("sampler", ["euler", "heun"])
def test_sampling_runs_on_the_fit_device_and_the_weights_rest_on_the_cpu(device, sampler):
    """The U-Net's N evaluations per image run where fit trained (a GPU's job: the paper
    preset samples 60,000 images × 50 evaluations); the noise comes from the CPU generator,
    so CUDA draws the same ODE starts as the CPU and lands within float32 error of it."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from dpgen_bench.numerics import exact_float32

    h = _tiny(steps=2, sampler=sampler, sampler_steps=6, s_churn=10.0 if sampler == "heun" else 0.0)
    m = DPDM(h, INFO)
    budget = Budget(10.0)
    m.fit(_train(), budget, FakeContext(PrivacyLedger(budget, m.plan(budget)), seed=1, device=device))
    assert m.sample_device == torch.device(device)
    seen = []
    hook = m.ema.register_forward_pre_hook(lambda mod, args: seen.append(args[0].device))
    labels = torch.arange(10).repeat_interleave(2)
    with exact_float32(device):
        x, y = m.sample(20, labels, torch.Generator().manual_seed(3))
    hook.remove()
    assert seen and {d.type for d in seen} == {device}
    assert x.device.type == "cpu" and torch.equal(y, labels)
    assert {p.device.type for p in m.ema.parameters()} == {"cpu"}  # resting where checkpoints are written
    m.sample_device = torch.device("cpu")
    x_cpu, _ = m.sample(20, labels, torch.Generator().manual_seed(3))
    if device == "cpu":
        assert torch.equal(x, x_cpu)  # the CPU path is bit for bit what it was
    else:
        torch.testing.assert_close(x, x_cpu, atol=1e-3, rtol=1e-3)


def test_heun_sampler_solves_the_probability_flow_ode_of_gaussian_data():
    """Data N(0, s²) per pixel: the ideal denoiser is s²/(s²+σ²)·x and the ODE maps x(σ_max)
    to x(σ_max)·s/√(s²+σ_max²). Heun's global error is second order: +6.5 % at 18 steps,
    +1.1 % at 40, +0.27 % at 80 (Euler on the same schedule: −16 %, −7.5 %, −3.8 %, first
    order), computed by hand for s = 0.3; the sampler must reproduce the 80-step one. The
    start is x(σ_max) = σ_max·z, drawn as EDM draws it."""
    s = 0.3

    class Ideal(torch.nn.Module):
        def forward(self, x_in, c_noise, y):
            sigma = (4 * c_noise).exp().view(-1, 1, 1, 1)
            c_skip, c_out, c_in, _ = [v.view(-1, 1, 1, 1) for v in precondition(sigma.flatten())]
            x = x_in / c_in
            return (s**2 / (s**2 + sigma**2) * x - c_skip * x) / c_out

    h = _tiny(sampler_steps=80)
    gen = torch.Generator().manual_seed(0)
    out = edm_sample(Ideal(), torch.zeros(6, dtype=torch.long), (1, 4, 4), h, gen)
    z = torch.randn(6, 1, 4, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    exact = (z * 80.0 * s / math.sqrt(s**2 + 80.0**2)).float()
    torch.testing.assert_close(out, exact * (1 + 0.002666), rtol=2e-4, atol=1e-5)


def test_euler_sampler_is_the_authors_ddim_and_first_order():
    """The authors' "ddim" sampler (their MNIST / CelebA configs): Euler on the ρ schedule
    t_0 … t_{N−1}, output D(x; σ_min). For data N(0, s²) the ODE's exact end point is
    x(σ_max)·s/√(s²+σ_max²); Euler's error is first order (halving as N doubles), from below
    (hand computation in the Heun test above: −3.8 % at 80 steps), and it evaluates the
    network N times."""
    from methods.dpdm import euler_sample

    s = 0.3
    calls = []

    class Ideal(torch.nn.Module):
        def forward(self, x_in, c_noise, y):
            calls.append(1)
            sigma = (4 * c_noise).exp().view(-1, 1, 1, 1)
            c_skip, c_out, c_in, _ = [v.view(-1, 1, 1, 1) for v in precondition(sigma.flatten())]
            x = x_in / c_in
            return (s**2 / (s**2 + sigma**2) * x - c_skip * x) / c_out

    z = torch.randn(6, 1, 4, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    exact = (z * 80.0 * s / math.sqrt(s**2 + 80.0**2)).float()
    errors = []
    for n in (40, 80, 160):
        calls.clear()
        out = euler_sample(Ideal(), torch.zeros(6, dtype=torch.long), (1, 4, 4), _tiny(sampler_steps=n, sampler="euler"),
                           torch.Generator().manual_seed(0))
        assert len(calls) == n
        ratio = (out / exact).mean().item()
        errors.append(1 - ratio)
        torch.testing.assert_close(out / exact, torch.full_like(out, ratio), rtol=1e-4, atol=1e-4)  # a pure scale
    assert all(e > 0 for e in errors) and errors[2] < 0.06
    assert errors[0] / errors[1] == pytest.approx(2, rel=0.15) and errors[1] / errors[2] == pytest.approx(2, rel=0.15)


def test_sampler_setting_picks_the_sampler():
    m = DPDM(_tiny(sampler="euler", sampler_steps=4), INFO)
    x, _ = m.sample(3, torch.tensor([1, 2, 3]), torch.Generator().manual_seed(0))
    assert x.shape == (3, 1, 16, 16)
    with pytest.raises(ValueError, match="sampler must be one of heun, euler"):
        _tiny(sampler="ddpm")
    with pytest.raises(ValueError, match="max_physical_batch"):
        _tiny(max_physical_batch=0)


@pytest.mark.parametrize("private", [True, False])
@pytest.mark.parametrize("cap", [1, 3, 5])
def test_step_in_physical_chunks_is_the_same_update(private, cap):
    """``max_physical_batch`` (examples, K rows each) changes memory, not the update: the
    chunks' clipped per-example sums (skipped steps) and one noise draw at the end, or the
    weighted chunk means without privacy, give the whole batch's step."""
    from fake_context import PartContext

    from dpgen_bench.privacy.dpsgd import make_private

    train = _train(n=40, seed=4)
    idx = torch.tensor([0, 3, 5, 8, 13, 21, 34])  # 7 examples: uneven chunks

    def one_step(max_physical_batch):
        torch.manual_seed(0)
        m = DPDM(_tiny(noise_multiplicity=3, max_physical_batch=max_physical_batch), INFO)
        if not private:
            m.private = False
        opt, net = torch.optim.SGD(m.net.parameters(), lr=1.0), m.net
        if private:
            net, opt = make_private(m.net, opt, ctx=PartContext(0.7), part="d", max_grad_norm=0.05,
                                    expected_batch_size=7, grad_sample_mode="bk",
                                    noise_generator=torch.Generator().manual_seed(11))
        opt.zero_grad(set_to_none=True)
        loss = m._step(net, opt, train, idx, torch.Generator().manual_seed(5))
        return loss, [p.detach().clone() for p in m.net.parameters()]

    loss_whole, whole = one_step(None)
    loss_chunked, chunked = one_step(cap)
    assert loss_chunked == pytest.approx(loss_whole, rel=1e-5)
    for a, b in zip(whole, chunked):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    torch.manual_seed(0)
    fresh = DPDM(_tiny(noise_multiplicity=3), INFO)
    assert any(not torch.equal(a, p) for a, p in zip(chunked, fresh.net.parameters()))
