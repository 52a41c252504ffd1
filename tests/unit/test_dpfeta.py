"""DP-FETA's warm start in dpdm (``--set warmup=central``): the central
images' sensitivity and noise, the budget they leave DP-SGD (``calibrate_beside``), the
post-processing, and a fit that counts both parts."""

import math

import numpy as np
import pytest
import torch
from fake_context import FakeContext

import methods.dpdm as dpdm
from dpgen_bench.api import Budget, DataInfo, PrivacyPart, Split
from dpgen_bench.errors import BudgetTooLow, UserError
from dpgen_bench.privacy import PrivacyLedger, calibrate_noise, compose_rdp
from dpgen_bench.privacy.accounting import calibrate_beside
from methods.dpdm import DPDM, DPDMHparams, central_post_process, central_sums, median3, sharpen

INFO = DataInfo("digits", (1, 16, 16), 10, 200)


def _feta(**extra) -> DPDMHparams:
    h = {k: v for k, v in DPDM.presets["tiny"]["*"].items() if k != "samples_per_class"}
    return DPDMHparams(**(h | dict(warmup="central", central_batch=100, central_queries=3, central_sigma=2.0,
                                   warmup_steps=4, warmup_batch=8) | extra))


def _train(n=200, seed=0) -> Split:
    g = torch.Generator().manual_seed(seed)
    return Split(torch.rand(n, 1, 16, 16, generator=g) * 2 - 1, torch.randint(0, 10, (n,), generator=g))


# ------------------------------------------------------------------ the release


@pytest.mark.parametrize("ds,shape", [(2, (1, 16, 16)), (2, (1, 28, 28)), (4, (3, 32, 32))])
def test_one_record_moves_the_sums_by_at_most_delta(ds, shape):
    """Add/remove adjacency: the worst record (every pixel at +1, i.e. 1 in [0, 1]) moves its
    class's pooled sum by exactly Δ = √(pooled pixels); any record by at most Δ."""
    g = torch.Generator().manual_seed(1)
    x = torch.rand(50, *shape, generator=g) * 2 - 1
    y = torch.randint(0, 10, (50,), generator=g)
    delta = math.sqrt(shape[0] * (shape[1] // ds) * (shape[2] // ds))
    base = central_sums(x, y, 10, ds)
    for record in (torch.ones(1, *shape), -torch.ones(1, *shape), torch.rand(1, *shape, generator=g) * 2 - 1):
        more = central_sums(torch.cat([x, record]), torch.cat([y, torch.tensor([3])]), 10, ds)
        moved = (more - base).norm().item()
        assert moved <= delta + 1e-5
    worst = central_sums(torch.cat([x, torch.ones(1, *shape)]), torch.cat([y, torch.tensor([3])]), 10, ds)
    assert (worst - base).norm().item() == pytest.approx(delta, rel=1e-6)
    assert central_sums(x[:0], y[:0], 10, ds).abs().sum() == 0  # an empty Poisson sample


def test_release_noise_is_sigma_times_delta_and_counted_first(monkeypatch):
    """What the release adds to the sums: N(0, (σ·Δ)²) per coordinate (σ = 2.0, Δ = 8 here:
    a noise that forgot Δ, or used Δ², is far off), one ledger step per query, counted before
    the noise is drawn."""
    from dpgen_bench.privacy.release import GaussianRelease

    seen = []
    real_call = GaussianRelease.__call__

    def spy(self, value):
        before = dict(self._ctx.ledger.taken)
        out = real_call(self, value)
        seen.append((before[self.part], self._ctx.ledger.taken[self.part], (out - value).flatten()))
        return out

    monkeypatch.setattr(GaussianRelease, "__call__", spy)
    h = _feta(central_queries=40, warmup_steps=0, steps=1)
    m = DPDM(h, INFO)
    budget = Budget(1e4)
    ctx = FakeContext(PrivacyLedger(budget, m.plan(budget)), seed=0)
    images, labels = m.central_images(_train().to("cpu"), ctx, ctx.generator("data"), ctx.generator("n", offset=9))
    assert [(a, b) for a, b, _ in seen] == [(i, i + 1) for i in range(40)]
    noise = torch.cat([n for _, _, n in seen])
    assert noise.std().item() == pytest.approx(2.0 * 8.0, rel=0.05)
    assert abs(noise.mean().item()) < 0.5
    assert images.dtype == torch.uint8 and images.shape == (400, 1, 16, 16)
    assert labels.tolist() == list(range(10)) * 40


def test_central_images_show_the_class_means_when_the_noise_is_small():
    """Two classes with distinct constant images: with σ tiny the central image of each class
    is its class's image (through the fixed denominator: the expected count)."""
    n = 400
    y = torch.arange(n) % 2
    x = torch.where(y.view(-1, 1, 1, 1) == 0, -1.0, 0.0).expand(n, 1, 16, 16).clone()  # 0 and 0.5 in [0, 1]
    info = DataInfo("digits", (1, 16, 16), 2, n)
    m = DPDM(_feta(central_batch=n, central_sigma=1e-3, central_queries=1, warmup_steps=0), info)
    budget = Budget(1e9)
    ctx = FakeContext(PrivacyLedger(budget, m.plan(budget)), seed=0)
    images, labels = m.central_images(Split(x, y), ctx, ctx.generator("data"), ctx.generator("n", offset=9))
    assert labels.tolist() == [0, 1]
    assert images[0].float().mean().item() == pytest.approx(0.0, abs=1)
    assert images[1].float().mean().item() == pytest.approx(127.5, abs=4)


def test_the_divisor_is_the_plans_not_the_splits_size():
    """The central images divide the noisy sums by the plan's expected class count (rate ·
    the plan's N / K), never by the split's size: under bench audit's canaries that size
    depends on which canaries were drawn in, and under add/remove the divisor itself would
    move with the record. Same data and noise, a plan N of 400 or 800: the release scales by
    exactly 2 (a divisor of len(train) would give equal images)."""
    n = 400
    y = torch.arange(n) % 2
    x = torch.where(y.view(-1, 1, 1, 1) == 0, -1.0, -0.5).expand(n, 1, 16, 16).clone()  # 0 and 0.25 in [0, 1]
    out = []
    for n_plan in (n, 2 * n):
        m = DPDM(_feta(central_batch=n_plan, central_sigma=1e-3, central_queries=1, warmup_steps=0),
                 DataInfo("digits", (1, 16, 16), 2, n_plan))  # rate 1 either way: every record in
        budget = Budget(1e9)
        ctx = FakeContext(PrivacyLedger(budget, m.plan(budget)), seed=0)
        images, _ = m.central_images(Split(x, y), ctx, ctx.generator("data"), ctx.generator("n", offset=9))
        out.append(images[1].float().mean().item())  # class 1: 0.25 in [0, 1], ~64 of 255
    assert out[0] == pytest.approx(63.75, abs=3)
    assert out[1] == pytest.approx(out[0] / 2, abs=3)


# ------------------------------------------------------------------ the post-processing


def test_median_and_sharpen_match_their_definitions():
    g = torch.Generator().manual_seed(2)
    x = (torch.rand(2, 3, 9, 7, generator=g) * 255).round()
    med = median3(x)
    padded = torch.nn.functional.pad(x, (1, 1, 1, 1), mode="replicate")
    for i, j in [(0, 0), (4, 3), (8, 6)]:
        window = padded[:, :, i:i + 3, j:j + 3].reshape(2, 3, 9)
        torch.testing.assert_close(med[:, :, i, j], window.median(dim=2).values)
    gray = x[:, :1]
    s = sharpen(gray)
    i, j = 4, 3  # interior: 5·centre minus the four neighbours, saturated
    want = (5 * gray[:, 0, i, j] - gray[:, 0, i - 1, j] - gray[:, 0, i + 1, j] - gray[:, 0, i, j - 1]
            - gray[:, 0, i, j + 1]).clamp(0, 255)
    torch.testing.assert_close(s[:, 0, i, j], want)
    out = central_post_process(torch.rand(4, 1, 8, 8, generator=g) * 1.4 - 0.2, (16, 16))
    assert out.dtype == torch.uint8 and out.shape == (4, 1, 16, 16)


# ------------------------------------------------------------------ the budget


def test_calibrate_beside_leaves_dp_sgd_exactly_the_rest():
    central = PrivacyPart("central", 5.0, 0.1, 5)
    sigma = calibrate_beside([central], epsilon=1.0, delta=1e-5, sample_rate=0.05, steps=500)
    composed = compose_rdp([central, PrivacyPart("d", sigma, 0.05, 500)], 1e-5)
    assert 0.99 <= composed <= 1.0
    alone = calibrate_noise(epsilon=1.0, delta=1e-5, sample_rate=0.05, steps=500)
    assert sigma > alone  # the central images cost something
    assert calibrate_beside([], epsilon=1.0, delta=1e-5, sample_rate=0.05, steps=500) == alone
    with pytest.raises(BudgetTooLow, match=r"the fixed parts \(central\) leave no room for 5 steps at sample rate "
                       r"0.05 within ε = 1 at δ=1e-05"):  # the fixed part alone is over the target (the user's line)
        calibrate_beside([PrivacyPart("central", 0.5, 1.0, 5)], epsilon=1.0, delta=1e-5, sample_rate=0.05, steps=5)


def test_plan_has_both_parts_within_the_target_and_needs_steps():
    m = DPDM(_feta(steps=20, central_sigma=8.0), INFO)
    for eps in (1.0, 10.0):
        plan = m.plan(Budget(eps))
        assert [p.name for p in plan] == ["central", "denoiser"]
        assert plan[0].noise_multiplier == 8.0 and plan[0].sample_rate == pytest.approx(0.5) and plan[0].steps == 3
        assert compose_rdp(plan, 1e-5) <= eps
    plain = DPDM(_feta(steps=20, central_sigma=8.0, warmup="none"), INFO).plan(Budget(10.0))
    assert plain[0].noise_multiplier < m.plan(Budget(10.0))[1].noise_multiplier
    with pytest.raises(BudgetTooLow):  # σ = 2 on half the data, three times: over ε = 1 alone
        DPDM(_feta(steps=20), INFO).plan(Budget(1.0))
    with pytest.raises(UserError, match="steps"):
        DPDM(_feta(steps=None, noise_multiplier=1.0), INFO).plan(Budget(10.0))
    with pytest.raises(ValueError, match="warmup"):
        _feta(warmup="public")


def test_fit_counts_central_queries_then_dp_steps_and_starts_dp_sgd_from_the_warm_weights(monkeypatch):
    h = _feta(steps=3)
    m = DPDM(h, INFO)
    budget = Budget(10.0)
    ctx = FakeContext(PrivacyLedger(budget, m.plan(budget)), seed=0)
    order = []
    real_warm = DPDM._warm_up

    def warm(self, images, labels, ctx_):
        order.append(("warm-up", dict(ctx_.ledger.taken)))
        real_warm(self, images, labels, ctx_)
        order.append(("warm weights", [p.detach().clone() for p in self.net.parameters()]))

    monkeypatch.setattr(DPDM, "_warm_up", warm)
    m.fit(_train(), budget, ctx)
    assert order[0] == ("warm-up", {"central": 3, "denoiser": 0})  # the queries were counted first
    assert ctx.ledger.taken == {"central": 3, "denoiser": 3}
    assert m.central[0].shape == (30, 1, 16, 16)
    assert any(r.get("warmup_loss") is not None for r in ctx.records)
    # the net moved away from the warm weights by DP-SGD (3 steps), from there
    warm_weights = order[1][1]
    assert any(not torch.equal(a, b.cpu()) for a, b in zip(warm_weights, m.net.parameters()))


def test_warm_up_is_reproducible_and_moves_the_net():
    outs = []
    for _ in range(2):
        m = DPDM(_feta(steps=1, warmup_steps=6), INFO)
        torch.manual_seed(0)
        m.net.apply(lambda mod: mod.reset_parameters() if hasattr(mod, "reset_parameters") else None)
        before = [p.detach().clone() for p in m.net.parameters()]
        budget = Budget(10.0)
        ctx = FakeContext(PrivacyLedger(budget, m.plan(budget)), seed=3)
        images = torch.randint(0, 256, (20, 1, 16, 16), dtype=torch.uint8)
        m._warm_up(images, torch.arange(20) % 10, ctx)
        after = [p.detach().clone() for p in m.net.parameters()]
        assert any(not torch.equal(a, b) for a, b in zip(before, after))
        outs.append(after)
    for a, b in zip(*outs):
        torch.testing.assert_close(a, b)
    assert np.isfinite([r["warmup_loss"] for r in ctx.records if "warmup_loss" in r]).all()


def test_warm_up_needs_a_private_run():
    m = DPDM(_feta(steps=2), INFO)
    m.private = False
    budget = Budget(float("inf"))
    with pytest.raises(UserError, match="private run"):
        m.fit(_train(), budget, FakeContext(PrivacyLedger(budget, []), seed=0))
    assert dpdm.WARMUPS == ("none", "central")


def test_central_share_calibrates_the_queries_to_their_share_of_epsilon():
    from dpgen_bench.privacy import part_epsilon

    for eps in (1.0, 10.0):
        central, denoiser = DPDM(_feta(steps=20, central_share=0.3), INFO).plan(Budget(eps))
        assert 0.29 * eps <= part_epsilon(central, 1e-5) <= 0.3 * eps
        assert compose_rdp([central, denoiser], 1e-5) <= eps
    with pytest.raises(ValueError, match="central_share"):
        _feta(central_share=1.0)
