"""DP-Sinkhorn against the math: the log-domain Sinkhorn against plain matrix scaling in
float64 (value and envelope gradient) and, as ε → 0, against the exact assignment; the
debiasing; the batch-level clip and its 2C sensitivity; one training step's released
gradient against a hand computation; the plan within the target; hparam validation."""

import dataclasses
import math

import pytest
import torch
from fake_context import FakeContext
from spies import recording
from scipy.optimize import linear_sum_assignment

from dpgen_bench.api import Budget, DataInfo, Split
from dpgen_bench.errors import UserError
from dpgen_bench.privacy import PrivacyLedger, calibrate_noise, compose_rdp
from dpgen_bench.privacy.accounting import POISSON
from methods import dpsinkhorn
from methods.dpsinkhorn import (PART, BatchGradientSanitizer, DPSinkhorn, DPSinkhornHparams, entropic_ot, make_cost,
                                semi_debiased_loss, sinkhorn_divergence)

SHAPE = (1, 16, 16)
INFO = DataInfo("toy", SHAPE, 3, 30)
TINY = dict(batch_size=8, steps=4, g_width=4, latent_dim=4, sinkhorn_iters=3, lr=1e-3, log_every=2)


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/unit/conftest.py


def _clouds(n, m, d, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g, dtype=torch.float64), torch.randn(m, d, generator=g, dtype=torch.float64)


def _scaling_reference(C, eps, iters=20_000):
    """Plain Sinkhorn matrix scaling (no logs, no annealing) in float64: the plan π and
    the primal value ⟨π, C⟩ + ε·KL(π | a⊗b)."""
    n, m = C.shape
    a, b = torch.full((n,), 1 / n, dtype=C.dtype), torch.full((m,), 1 / m, dtype=C.dtype)
    K = torch.exp(-C / eps)
    u, v = torch.ones_like(a), torch.ones_like(b)
    for _ in range(iters):
        u = a / (K @ v)
        v = b / (K.T @ u)
    P = u[:, None] * K * v[None, :]
    return P, (P * C).sum() + eps * (P * torch.log(P / (a[:, None] * b[None, :]))).sum()


# ------------------------------------------------------------------ the Sinkhorn loss


@pytest.mark.parametrize("cost,eps", [("l2", 0.5), ("l2", 2.0), ("l1+l2", 1.0)])
def test_entropic_ot_value_and_gradient_match_matrix_scaling(cost, eps):
    x, y = _clouds(7, 5, 3)
    c = make_cost(cost, l1_weight=0.7)
    P, value = _scaling_reference(c(x, y), eps)
    xg, yg = x.clone().requires_grad_(True), y.clone().requires_grad_(True)
    ours = entropic_ot(xg, yg, eps, c, iters=300)
    assert ours.item() == pytest.approx(value.item(), rel=1e-9, abs=1e-9)
    ours.backward()
    diff = x[:, None, :] - y[None, :, :]  # ∇ᵤc(u, v) for u = xᵢ, v = yⱼ
    grad_c = 2 * diff + (0.7 * diff.sign() if cost == "l1+l2" else 0)
    torch.testing.assert_close(xg.grad, (P[:, :, None] * grad_c).sum(1), rtol=1e-7, atol=1e-9)
    torch.testing.assert_close(yg.grad, -(P[:, :, None] * grad_c).sum(0), rtol=1e-7, atol=1e-9)


def test_cost_matrices_are_the_pairwise_distances():
    x, y = _clouds(4, 6, 5, seed=3)
    diff = x[:, None, :] - y[None, :, :]
    torch.testing.assert_close(make_cost("l2")(x, y), (diff ** 2).sum(-1))
    torch.testing.assert_close(make_cost("l1+l2", 3.0)(x, y), (diff ** 2).sum(-1) + 3.0 * diff.abs().sum(-1))
    with pytest.raises(ValueError):
        make_cost("l3")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_small_eps_tends_to_the_exact_assignment(seed):
    # equal uniform weights: the optimal plan is a permutation / n, OT = mean assigned cost;
    # OT_ε − OT_0 ∈ [0, ε·log n] (the plan's entropy term is at most log n)
    x, y = _clouds(6, 6, 4, seed=seed)
    c = make_cost("l2")
    C = c(x, y).numpy()
    rows, cols = linear_sum_assignment(C)
    exact = C[rows, cols].mean()
    eps = 1e-3
    ours = entropic_ot(x, y, eps, c, iters=2000).item()
    assert exact - 1e-6 <= ours <= exact + eps * math.log(6) + 1e-6


def test_divergence_vanishes_on_the_same_cloud_and_is_positive_otherwise():
    x, y = _clouds(8, 8, 3, seed=4)
    c = make_cost("l2")
    assert sinkhorn_divergence(x, x, 0.3, c).item() == 0.0
    # a permutation of the rows is the same measure
    perm = torch.randperm(8, generator=torch.Generator().manual_seed(0))
    assert abs(sinkhorn_divergence(x, x[perm], 0.3, c).item()) < 1e-9
    assert sinkhorn_divergence(x, y, 0.3, c).item() > 0.1
    # OT_ε itself is biased: > 0 between a cloud and itself
    assert entropic_ot(x, x, 0.3, c).item() > 0.01


def test_semi_debiased_loss_has_the_divergences_gradient_and_a_stationary_point_at_the_data():
    x, y = _clouds(8, 8, 3, seed=5)
    c = make_cost("l1+l2", 1.0)

    def grad(fn, at):
        p = at.clone().requires_grad_(True)
        fn(p).backward()
        return p.grad

    # S_ε and the semi-debiased loss (self term on the same batch) differ by ½OT_ε(y, y)
    g_semi = grad(lambda p: semi_debiased_loss(p, y, p, 0.5, c, iters=300), x)
    torch.testing.assert_close(g_semi, grad(lambda p: sinkhorn_divergence(p, y, 0.5, c, iters=300), x))
    # at x = y the divergence is minimal: the semi-debiased gradient vanishes, OT_ε's does not
    c2 = make_cost("l2")
    at_data = grad(lambda p: semi_debiased_loss(p, y, p, 2.0, c2, iters=500), y)
    biased = grad(lambda p: entropic_ot(p, y, 2.0, c2, iters=500), y)
    assert at_data.norm().item() < 1e-8 * biased.norm().item() and biased.norm().item() > 0.1


# ------------------------------------------------------------------ the sanitiser


def test_batch_sanitizer_clips_the_whole_matrix_and_adds_2_sigma_C_noise():
    g = torch.randn(6, 1, 4, 4, generator=torch.Generator().manual_seed(0))
    g = g / g.norm() * 3.0
    C = 0.5
    out = BatchGradientSanitizer(C, 0.0)(g)
    torch.testing.assert_close(out, g * (C / 3.0))  # one factor for every row
    small = g / 30.0
    torch.testing.assert_close(BatchGradientSanitizer(C, 0.0)(small), small)  # inside the ball: unchanged
    sigma = 0.8
    s = BatchGradientSanitizer(C, DPSinkhorn.hook_noise_multiplier(sigma), torch.Generator().manual_seed(1))
    noise = s(torch.zeros(64, 1, 64, 64))
    assert noise.std().item() == pytest.approx(2 * sigma * C, rel=0.01)


def test_one_real_record_moves_every_row_but_the_clipped_matrix_at_most_2C():
    """Why the clip is on the whole matrix: a record added to the real batch changes the
    transport plan and with it the gradient at every generated sample (so per-row clipping
    would leave a sensitivity of 2C√B); the clipped matrices stay within C of 0."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(6, 10, generator=g, dtype=torch.float64)
    real = torch.randn(7, 10, generator=g, dtype=torch.float64)
    c, C = make_cost("l2"), 0.3
    clip = BatchGradientSanitizer(C, 0.0).clip

    def grad(batch):
        p = x.clone().requires_grad_(True)
        semi_debiased_loss(p, batch, p, 5.0, c, iters=200).backward()
        return p.grad

    for extra in torch.randn(5, 10, generator=g, dtype=torch.float64):
        a, b = grad(real), grad(torch.cat([real, extra[None]]))
        assert ((a - b).norm(dim=1) > 1e-6).all()  # every row moved
        assert (clip(a) - clip(b)).norm().item() <= 2 * C + 1e-12


# ------------------------------------------------------------------ one training step


_Spy = recording(BatchGradientSanitizer)  # keeps what the hook received and returned


def _data(n=30, seed=0):
    g = torch.Generator().manual_seed(seed)
    return Split(torch.rand(n, *SHAPE, generator=g) * 2 - 1, torch.arange(3).repeat(n // 3))


def test_a_step_releases_the_clipped_gradient_plus_calibrated_noise(monkeypatch):
    spies, seen = [], []
    monkeypatch.setattr(dpsinkhorn, "BatchGradientSanitizer",
                        lambda *a, **k: spies.append(_Spy(*a, **k)) or spies[-1])
    loss = DPSinkhorn.loss
    monkeypatch.setattr(DPSinkhorn, "loss", lambda self, x, y, x_alt, real: seen.append(
        (x.detach().clone(), y, x_alt.detach().clone(), real)) or loss(self, x, y, x_alt, real))
    h = DPSinkhornHparams(**{**TINY, "batch_size": 16, "steps": 1, "noise_multiplier": 1.3, "max_grad_norm": 0.3})
    m = DPSinkhorn(h, INFO)
    budget = Budget(10.0)
    parts = m.plan(budget)
    ctx = FakeContext(PrivacyLedger(budget, parts))
    m.fit(_data(), budget, ctx)
    assert ctx.ledger.taken == {PART: 1}
    sanitizer, alt_clip = spies
    ((x, y, x_alt, real),) = seen
    assert len(x_alt) == int(h.debias_ratio * h.batch_size) and alt_clip.noise_multiplier == 0
    # the hook received ∂L/∂X of the semi-debiased loss, computed here by hand
    p = x.clone().requires_grad_(True)
    loss(m, p, y, x_alt, real).backward()
    torch.testing.assert_close(sanitizer.received, p.grad)
    # and released clip_C(∂L/∂X) (one factor for the whole matrix) plus N(0, (2σC)²)
    norm = p.grad.norm().item()
    clipped = p.grad * min(1.0, 0.3 / norm)
    noise = sanitizer.returned - clipped
    assert parts[0].noise_multiplier == 1.3
    assert noise.std().item() == pytest.approx(2 * 1.3 * 0.3, rel=0.1)  # 4,096 coordinates
    assert abs(noise.mean().item()) < 4 * 2 * 1.3 * 0.3 / 64


def test_an_empty_real_batch_gives_no_gradient():
    m = DPSinkhorn(DPSinkhornHparams(**TINY), INFO)
    x = torch.randn(8, *SHAPE, requires_grad=True)
    y = torch.randint(0, 3, (8,))
    empty = Split(torch.zeros(0, *SHAPE), torch.zeros(0, dtype=torch.long))
    m.loss(x, y, x[:1].detach(), empty).backward()
    assert torch.equal(x.grad, torch.zeros_like(x))


def test_fit_counts_every_step_and_the_generator_samples():
    m = DPSinkhorn(DPSinkhornHparams(**TINY, noise_multiplier=2.0), INFO)
    budget = Budget(10.0)
    ctx = FakeContext(PrivacyLedger(budget, m.plan(budget)))
    m.fit(_data(), budget, ctx)
    assert ctx.ledger.taken == {PART: 4}
    assert [r["step"] for r in ctx.records] == [2, 4] and all(r["clip_fraction"] in (0, 1) for r in ctx.records)
    x, y = m.sample(6, torch.tensor([0, 1, 2, 0, 1, 2]), torch.Generator().manual_seed(0))
    assert x.shape == (6, *SHAPE) and x.min() >= -1 and x.max() <= 1 and y.tolist() == [0, 1, 2, 0, 1, 2]


# ------------------------------------------------------------------ the plan


@pytest.mark.parametrize("eps", [1.0, 10.0])
def test_plan_with_fixed_steps_calibrates_sigma_within_the_target(eps):
    h = DPSinkhornHparams(batch_size=10, steps=500)
    info = DataInfo("digits", SHAPE, 10, 1221)
    (part,) = DPSinkhorn(h, info).plan(Budget(eps))
    assert part.name == PART and part.mechanism == POISSON and part.steps == 500
    assert part.sample_rate == pytest.approx(10 / 1221)
    assert part.noise_multiplier == pytest.approx(
        calibrate_noise(epsilon=eps, delta=1e-5, sample_rate=10 / 1221, steps=500))
    assert 0.99 * eps <= compose_rdp([part], 1e-5) <= eps


def test_plan_with_fixed_sigma_trains_until_the_budget_is_spent():
    h = DPSinkhornHparams(batch_size=50, noise_multiplier=1.1)
    (part,) = DPSinkhorn(h, DataInfo("toy", SHAPE, 10, 6000)).plan(Budget(2.0))
    assert part.noise_multiplier == 1.1
    assert compose_rdp([part], 1e-5) <= 2.0 < compose_rdp([dataclasses.replace(part, steps=part.steps + 1)], 1e-5)


def test_max_steps_caps_the_steps_a_fixed_sigma_allows():
    info = DataInfo("toy", SHAPE, 10, 6000)
    (free,) = DPSinkhorn(DPSinkhornHparams(batch_size=50, noise_multiplier=1.1), info).plan(Budget(2.0))
    h = DPSinkhornHparams(batch_size=50, noise_multiplier=1.1, max_steps=100)
    (capped,) = DPSinkhorn(h, info).plan(Budget(2.0))
    assert free.steps > 100 and capped.steps == 100 and capped.noise_multiplier == 1.1


def test_plan_needs_steps_or_noise():
    with pytest.raises(UserError, match="steps or noise_multiplier"):
        DPSinkhorn(DPSinkhornHparams(), INFO).plan(Budget(1.0))


@pytest.mark.parametrize("bad", [
    dict(batch_size=0), dict(steps=0), dict(noise_multiplier=0.0), dict(max_grad_norm=0.0), dict(sinkhorn_eps=-1.0),
    dict(lr=0.0), dict(l1_weight=-1.0), dict(label_weight=-0.5), dict(cost="l3"), dict(debias_ratio=1.5),
    dict(debias_ratio=-0.1), dict(scaling=1.0), dict(scaling=0.0), dict(sinkhorn_iters=0), dict(beta1=1.0),
    dict(torch_threads=0), dict(latent_dim=0), dict(max_steps=0),
])
def test_invalid_hparams_are_refused(bad):
    with pytest.raises(ValueError):
        DPSinkhornHparams(**bad)
