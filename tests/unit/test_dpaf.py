"""DPAF against the math of the paper: SIN, DPAGG's sensitivity and noise, the μ-batch
cadence of conv2*, gradient compression, the budget split, the composed ε."""

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from fake_context import FakeContext, PartContext

from dpgen_bench.api import Budget, DataInfo, PrivacyPart
from dpgen_bench.errors import UserError
from dpgen_bench.privacy import compose_rdp
from dpgen_bench.privacy.dpsgd import make_private
from dpgen_bench.privacy.ledger import PrivacyLedger
from methods.dpaf import DPAF, DPAFHparams
from methods.dpaf.budget import allocate, parse_split, plan_parts, schedule
from methods.dpaf.compression import compress_grad_samples, top_fraction_mask
from methods.dpaf.dpagg import dpagg, sensitivity, sin
from methods.dpaf.nets import LAYER_CONFIGS, Conv1, Conv2Star, make_layout, sensitivity_of

DIGITS = DataInfo("digits", (1, 16, 16), 10, 1437)
TINY = {k: v for k, v in DPAF.presets["tiny"]["*"].items() if k != "samples_per_class"}


# ------------------------------------------------------------------------- SIN


def test_sin_standardises_every_map_of_every_example_without_parameters():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 7, 4, 4, generator=g) * torch.rand(5, 7, 1, 1, generator=g) * 10 + 3
    y = sin(x, eps=0.0)
    torch.testing.assert_close(y.mean((2, 3)), torch.zeros(5, 7), atol=1e-5, rtol=0)
    torch.testing.assert_close(y.var((2, 3), unbiased=False), torch.ones(5, 7), atol=1e-4, rtol=0)
    # each normalised map has L2 norm p (p×p maps), so one example's vector has norm √m·p
    torch.testing.assert_close(y.flatten(2).norm(dim=2), torch.full((5, 7), 4.0), atol=1e-4, rtol=0)
    # per example and per map: scaling or shifting one map of one example changes nothing else
    x2 = x.clone()
    x2[1, 2] = x2[1, 2] * 5 - 8
    torch.testing.assert_close(sin(x2, 0.0), y, atol=1e-5, rtol=0)


def test_sin_with_eps_stays_within_the_bound_even_for_constant_maps():
    x = torch.zeros(3, 2, 2, 2)
    x[0, 0] = 7.0  # constant map: variance 0
    x[1, 1] = torch.tensor([[1e-4, 0.0], [0.0, 0.0]])  # nearly constant
    x[2] = torch.randn(2, 2, 2)
    y = sin(x)
    assert torch.isfinite(y).all()
    assert (y.flatten(2).norm(dim=2) <= 2.0 + 1e-6).all()
    assert y[0, 0].abs().max() == 0


# ------------------------------------------------------------------------ DPAGG


def test_sensitivity_is_sqrt_m_times_p_for_each_layer_configuration():
    assert sensitivity(64, 2) == pytest.approx(16.0)
    assert sensitivity(512, 4) == pytest.approx(math.sqrt(512) * 4)
    # CelebA 64×64, C2-C2-C1, d = 64: DPAGG after 4 convolutions, 512 maps of 4×4
    layout = make_layout((3, 64, 64), "C2-C2-C1", 64)
    assert (layout.agg_channels, layout.agg_size) == (512, 4)
    assert sensitivity_of(layout) == pytest.approx(math.sqrt(512) * 4)
    # MNIST 28×28, C2-C1-×: 28 → 14 → 7 → 4, 256 maps of 4×4 at d = 64
    layout = make_layout((1, 28, 28), "C2-C1-×", 64)
    assert layout.sizes == (28, 14, 7, 4) and sensitivity_of(layout) == pytest.approx(16 * 4)
    # FFHQ 128×128, C3-C1-×: 128 → 64 → 32 → 16 → 8
    layout = make_layout((3, 128, 128), "C3-C1-x", 64)
    assert (layout.agg_channels, layout.agg_size) == (512, 8)


@pytest.mark.parametrize("config", list(LAYER_CONFIGS))
def test_adding_or_removing_one_example_moves_the_aggregate_by_at_most_sqrt_m_p(config):
    torch.manual_seed(0)
    layout = make_layout((1, 32, 32), config, 4)
    conv1, conv2 = Conv1(layout), Conv2Star(layout, 10, 3)
    m, p = layout.agg_channels, layout.agg_size
    bound = math.sqrt(m) * p
    x = torch.randn(9, 1, 32, 32) * 3
    x[3] = 1e4 * torch.sign(torch.randn(1, 32, 32))  # an outlier gains no extra influence
    x[4] = 0.0
    y = torch.randint(0, 10, (9,))
    with torch.no_grad():
        f = sin(conv2(conv1(x), y))
    full = f.flatten(1).sum(0)
    for i in range(len(x)):
        without = torch.cat([f[:i], f[i + 1:]]).flatten(1).sum(0)
        assert (full - without).norm().item() <= bound * (1 + 1e-5)
    # the bound is attained (up to eps) by examples without constant maps
    assert f.flatten(1).norm(dim=1).max().item() == pytest.approx(bound, rel=1e-4)


def test_dpagg_noise_std_is_noise_multiplier_times_sensitivity():
    g = torch.Generator().manual_seed(1234)
    feats = sin(torch.randn(6, 16, 2, 2, generator=g))  # m = 16, p = 2: Δ = 8
    delta = sensitivity(16, 2)
    sigma = 1.7
    clean = feats.flatten(1).sum(0)
    draws = torch.stack([dpagg(feats, sigma, delta, g) for _ in range(4000)]) - clean  # 4000 × 64 values
    expected = sigma * delta
    # the std of a sample std of n = 256,000 values is ≈ std/√(2n) ≈ 0.14%: 1% is > 7 standard errors
    assert draws.std().item() == pytest.approx(expected, rel=0.01)
    assert abs(draws.mean().item()) < 5 * expected / math.sqrt(draws.numel())
    # independent coordinates: the per-coordinate stds all agree
    assert draws.std(0).min().item() > 0.9 * expected and draws.std(0).max().item() < 1.1 * expected
    # an empty batch releases pure noise
    assert dpagg(feats[:0], sigma, delta, g).shape == clean.shape


def test_the_method_adds_noise_of_its_planned_multiplier_times_sqrt_m_p(monkeypatch):
    """The real aggregate goes through the ledger-counting GaussianRelease (privacy.release),
    the fake one through ``dpagg``: both with the planned σ and Δ = √m·p, once per batch."""
    import methods.dpaf.core as core
    from dpgen_bench.privacy.release import GaussianRelease

    fakes, reals = [], []
    real_dpagg, real_noise = core.dpagg, GaussianRelease.noise

    def spy(features, noise_multiplier, sens, generator=None):
        fakes.append((noise_multiplier, sens, features.shape[1:]))
        return real_dpagg(features, noise_multiplier, sens, generator)

    def spy_noise(self, like):
        reals.append((self.part, self.noise_multiplier, self.sensitivity, tuple(like.shape)))
        return real_noise(self, like)

    monkeypatch.setattr(core, "dpagg", spy)
    monkeypatch.setattr(GaussianRelease, "noise", spy_noise)
    m, ctx = _fit(eps=2.0)
    planned = ctx.ledger.planned["dpagg"]
    layout = m.layout
    sens = math.sqrt(layout.agg_channels) * layout.agg_size
    assert {c[0] for c in fakes} == {planned.noise_multiplier} and all(c[1] == pytest.approx(sens) for c in fakes)
    assert {tuple(c[2]) for c in fakes} == {(layout.agg_channels, layout.agg_size, layout.agg_size)}
    assert {(c[0], c[1]) for c in reals} == {("dpagg", planned.noise_multiplier)}
    assert all(c[2] == pytest.approx(sens) for c in reals)
    assert {c[3] for c in reals} == {(layout.agg_channels * layout.agg_size**2,)}
    assert len(reals) == len(fakes) == planned.steps  # one real (private) and one fake (symmetric) aggregate per batch


# ------------------------------------------------------------------- schedule


class _RecordingLedger(PrivacyLedger):
    def __init__(self, budget, planned, method):
        super().__init__(budget, planned)
        self.events = []
        self.method = method

    def spend(self, name, steps=1):
        super().spend(name, steps)
        snap = [p.detach().clone() for p in self.method.conv2.parameters()]
        self.events.append((name, snap))


def _data(n=200, seed=0):
    from dpgen_bench.data.digits import load_digits_data

    return load_digits_data().train.subset(torch.arange(n))


def _fit(eps=1.0, info=DIGITS, recording=False, **over):
    h = DPAFHparams(**{**TINY, **over})
    m = DPAF(h, info)
    budget = Budget(eps)
    plan = m.plan(budget)
    ledger = _RecordingLedger(budget, plan, m) if recording else PrivacyLedger(budget, plan)
    ctx = FakeContext(ledger)
    m.fit(_data(), budget, ctx)
    return m, ctx


@pytest.mark.parametrize("mode", ["sound", "paper"])
def test_conv2_takes_one_dp_step_every_mu_batches_and_only_then_moves(mode):
    mu, batches = 4, 22
    m, ctx = _fit(recording=True, mu=mu, batches=batches, classifier_batches=3, privacy_mode=mode)
    names = [e[0] for e in ctx.ledger.events]
    assert names[:3] == ["conv1"] * 3
    phase2 = ctx.ledger.events[3:]
    assert [e[0] for e in phase2 if e[0] == "dpagg"] == ["dpagg"] * batches
    # conv2 steps right after the μ-th, 2μ-th, ... DPAGG step, ⌊𝔹/μ⌋ times
    pos, count = [], 0
    for name, _ in phase2:
        count += name == "dpagg"
        if name == "conv2":
            pos.append(count)
    assert pos == [mu * k for k in range(1, batches // mu + 1)]
    assert ctx.ledger.taken == {"conv1": 3, "conv2": batches // mu, "dpagg": batches}
    # conv2*'s parameters change only across a conv2 step; a step is counted (and the
    # snapshot taken) before its update is applied, so the change shows at the next event
    prev = None
    for name, snap in phase2:
        if prev is not None:
            same = all(torch.equal(a, b) for a, b in zip(prev[1], snap))
            assert same == (prev[0] != "conv2"), name
        prev = (name, snap)
    # conv1 is frozen in phase 2 and is C's transferred conv1
    assert all(not p.requires_grad for p in m.conv1.parameters())


def test_plan_steps_follow_the_schedule():
    m = DPAF(DPAFHparams(**{**TINY, "batches": 45, "mu": 8, "classifier_batches": 7}), DIGITS)
    parts = {p.name: p for p in m.plan(Budget(1.0))}
    assert [*parts] == ["conv1", "conv2", "dpagg"]
    assert (parts["conv1"].steps, parts["conv2"].steps, parts["dpagg"].steps) == (7, 5, 45)
    q = TINY["batch_size"] / 1437
    assert parts["conv1"].sample_rate == parts["dpagg"].sample_rate == pytest.approx(q)
    assert parts["conv2"].sample_rate == pytest.approx(8 * q)  # fresh sample of expected size μB
    paper = DPAF(DPAFHparams(**{**TINY, "batches": 45, "mu": 8, "privacy_mode": "paper"}), DIGITS)
    p2 = {p.name: p for p in paper.plan(Budget(1.0))}["conv2"]
    assert p2.sample_rate == pytest.approx(1 - (1 - q) ** 8)  # union of the last μ batches
    # classifier_batches=None: Algorithm 1 runs 𝔹 batches in both loops
    m = DPAF(DPAFHparams(**{**TINY, "batches": 16, "classifier_batches": None}), DIGITS)
    assert m.plan(Budget(1.0))[0].steps == 16


# -------------------------------------------------------------------------- GC


def test_gc_mask_keeps_exactly_the_top_90_percent_of_each_row():
    g = torch.Generator().manual_seed(0)
    flat = torch.randn(7, 1003, generator=g)
    mask = top_fraction_mask(flat, 0.9)
    kept = mask.sum(1)
    assert (kept == 1003 - math.floor(0.1 * 1003)).all()
    for i in range(7):  # the kept values are the largest magnitudes
        assert flat[i][mask[i]].abs().min() > flat[i][~mask[i]].abs().max()


def _grad_samples(n=6, seed=0, width=8):
    torch.manual_seed(seed)
    layout = make_layout((1, 16, 16), "C2-C1-×", width)
    conv1, conv2 = Conv1(layout), Conv2Star(layout, 10, 4)
    opt = torch.optim.SGD(conv2.parameters(), lr=0.0)
    gsm, dp_opt = make_private(conv2, opt, ctx=PartContext(0.0), part="d", max_grad_norm=1e6, expected_batch_size=n)
    x, y = torch.randn(n, 1, 16, 16), torch.randint(0, 10, (n,))
    with torch.no_grad():
        h1 = conv1(x)
    (sin(gsm(h1, y)).flatten(1) * torch.randn(n, 2 * 2 * 4 * width)).sum(1).mean().backward()
    return conv2, dp_opt


def test_gc_on_opacus_per_sample_gradients_keeps_the_right_fraction_before_clipping():
    conv2, dp_opt = _grad_samples()
    params = list(conv2.parameters())
    before = torch.cat([p.grad_sample.flatten(1) for p in params], 1)
    n, d = before.shape
    compress_grad_samples(params, 0.9)
    after = torch.cat([p.grad_sample.flatten(1) for p in params], 1)
    nonzero_before = (before != 0).sum(1)
    drop = math.floor(0.1 * d)
    # the embedding rows of absent labels are exact zeros: they go first
    assert ((after != 0).sum(1) == torch.clamp(nonzero_before, max=d - drop)).all()
    kept = after != 0
    torch.testing.assert_close(after[kept], before[kept])  # kept values untouched
    for i in range(n):
        assert before[i][kept[i]].abs().min() >= before[i][~kept[i]].abs().max()
    # the DP optimiser then sums the compressed per-sample gradients (no noise, no clipping here)
    dp_opt.step()
    summed = torch.cat([p.grad.flatten() for p in params])
    torch.testing.assert_close(summed, after.sum(0) / n, rtol=1e-4, atol=1e-7)


def test_gc_with_a_sampled_threshold_keeps_about_90_percent():
    conv2, _ = _grad_samples(n=5, width=16)
    params = list(conv2.parameters())
    before = torch.cat([p.grad_sample.flatten(1) for p in params], 1)
    compress_grad_samples(params, 0.9, exact_limit=0, sample_size=4096, generator=torch.Generator().manual_seed(0))
    after = torch.cat([p.grad_sample.flatten(1) for p in params], 1)
    frac = (after != 0).sum(1).float() / (before != 0).sum(1).float()
    assert ((frac > 0.88) & (frac < 0.92)).all(), frac


@pytest.mark.parametrize("rowwise", [True, False])
@pytest.mark.parametrize("sampled", [False, True])
def test_gc_on_column_blocks_equals_gc_on_the_concatenated_rows(rowwise, sampled, monkeypatch):
    """The compressor takes each example's gradient as one row or as column blocks (bk's
    per-layer chunks, never concatenated), and zeroes values either row by row (hardshrink,
    the CPU's way) or with a 0/1 mask (an accelerator's way): every combination keeps
    exactly the values above the row's threshold, those of the exact top fraction when the
    threshold is exact, and leaves the kept values bit for bit."""
    from methods.dpaf import compression

    monkeypatch.setattr(compression, "_rowwise", lambda device: rowwise)
    g = torch.Generator().manual_seed(3)
    rows = torch.randn(5, 3001, generator=g) * torch.rand(5, 1, generator=g)  # rows of different scales
    rows[:, :40] = 0.0  # exact zeros (an absent label's embedding rows) go first
    gc = compression.GradientCompression(0.9, torch.Generator().manual_seed(9), exact_limit=0 if sampled else 1 << 21,
                                         sample_size=500)
    whole = gc.plan(5, 3001, rows.device)(rows.clone())
    gc.generator.manual_seed(9)  # the same sampled positions for the blocked call
    blocks = [b.clone() for b in rows.split([7, 1500, 1, 1493], 1)]
    gc.plan(5, 3001, rows.device)(blocks)
    assert torch.equal(torch.cat(blocks, 1), whole)
    kept = whole != 0
    assert torch.equal(whole[kept], rows[kept])
    for i in range(5):
        assert rows[i][kept[i]].abs().min() > rows[i][~kept[i]].abs().max()
    if not sampled:
        assert torch.equal(kept, top_fraction_mask(rows, 0.9))
    else:
        frac = kept.sum(1) / 3001
        assert ((frac > 0.85) & (frac < 0.95)).all(), frac


def test_gc_switch_and_keep_one_leave_gradients_alone():
    conv2, _ = _grad_samples()
    params = list(conv2.parameters())
    before = [p.grad_sample.clone() for p in params]
    compress_grad_samples(params, 1.0)
    assert all(torch.equal(a, p.grad_sample) for a, p in zip(before, params))
    with pytest.raises(ValueError):
        compress_grad_samples(params, 0.0)


# ---------------------------------------------------------------------- budget


def test_budget_split_absolute_notation():
    assert allocate("0.1,x,0.1", 10.0) == pytest.approx((0.1, 9.8, 0.1))  # §6.1's example
    assert allocate("(0.1, ×, 0.1)", 1.0) == pytest.approx((0.1, 0.8, 0.1))
    assert allocate("0.2,0.5,0.3", 1.0) == pytest.approx((0.2, 0.5, 0.3))
    assert allocate("0,x,0.1", 1.0) == pytest.approx((0.0, 0.9, 0.1))  # random conv1 (Table 4)


def test_budget_split_percentage_notation():
    assert allocate("20%,60%,20%", 1.0) == pytest.approx((0.2, 0.6, 0.2))
    assert allocate("(33%, 34%, 33%)", 10.0) == pytest.approx((3.3, 3.4, 3.3))
    assert allocate("30%,x,20%", 5.0) == pytest.approx((1.5, 2.5, 1.0))
    assert allocate("0.1,x,40%", 10.0) == pytest.approx((0.1, 5.9, 4.0))


@pytest.mark.parametrize("bad", ["0.1,0.1", "x,x,0.1", "0.5,0.6,0.1", "0.6,x,0.5", "a,x,0.1", "0.1,0,0.1",
                                 "-1,x,0.1", "50%,60%,10%"])
def test_budget_split_rejects_impossible_splits(bad):
    with pytest.raises(UserError):
        allocate(bad, 1.0)


def test_budget_split_is_validated_when_the_settings_are_built():
    with pytest.raises(UserError):
        DPAFHparams(budget_split="x,x,x")
    with pytest.raises(UserError):  # nothing left for conv2 at ε = 0.2
        DPAF(DPAFHparams(**TINY), DIGITS).plan(Budget(0.2))
    assert parse_split("1%,x,2%")[1].kind == "rest"


def test_each_part_gets_its_share():
    sched = schedule(n_train=1437, batch_size=24, batches=800, classifier_batches=200, mu=8)
    parts = plan_parts(split="20%,60%,20%", epsilon=2.0, delta=1e-5, sched=sched)
    alone = [compose_rdp([p], 1e-5) for p in parts]
    for e, target in zip(alone, (0.4, 1.2, 0.4)):
        assert 0.98 * target <= e <= target


@pytest.mark.parametrize("config", ["C2-C2-C1", "C2-C1-×", "C3-C1-×"])
@pytest.mark.parametrize("eps", [0.5, 1.0, 2.0, 5.0, 10.0])
def test_composed_epsilon_never_exceeds_the_target(config, eps):
    info = DataInfo("faces", (3, 64, 64), 2, 20_000)
    h = DPAFHparams(layer_config=config, batch_size=64, batches=2000, mu=8, budget_split="0.1,x,0.1", d_width=8,
                    g_width=8)
    parts = DPAF(h, info).plan(Budget(eps))
    assert [p.name for p in parts] == ["conv1", "conv2", "dpagg"]
    assert [p.steps for p in parts] == [2000, 250, 2000]
    assert compose_rdp(parts, 1e-5) <= eps
    PrivacyLedger(Budget(eps), parts)  # the runner's check passes
    assert all(p.noise_multiplier > 0 for p in parts)


@pytest.mark.parametrize("delta", [1e-2, 1e-8])
def test_composition_fits_for_large_and_small_delta(delta):
    sched = schedule(n_train=1437, batch_size=24, batches=400, classifier_batches=100, mu=8)
    parts = plan_parts(split="30%,40%,30%", epsilon=1.0, delta=delta, sched=sched)
    assert compose_rdp(parts, delta) <= 1.0


def test_fill_budget_spends_more_but_never_too_much():
    sched = schedule(n_train=1437, batch_size=24, batches=400, classifier_batches=100, mu=8)
    base = plan_parts(split="0.1,x,0.1", epsilon=1.0, delta=1e-5, sched=sched)
    full = plan_parts(split="0.1,x,0.1", epsilon=1.0, delta=1e-5, sched=sched, fill_budget=True)
    assert compose_rdp(base, 1e-5) < compose_rdp(full, 1e-5) <= 1.0
    assert all(f.noise_multiplier <= b.noise_multiplier for f, b in zip(full, base))


@pytest.mark.parametrize("preset", ["quick", "paper"])
@pytest.mark.parametrize("eps", [1.0, 10.0])
def test_default_plan_spends_the_shared_budget(preset, eps):
    """fill_budget is the default: the composed ε reaches the target (the additive reading
    of the canonical split leaves 18% of ε = 1 unused on digits: 0.816); fill_budget=false
    keeps the paper's."""
    from dpgen_bench.config import resolve_hparams
    from methods.dpaf import DPAF

    dataset, info = ("digits", DataInfo("digits", (1, 16, 16), 10, 1437)) if preset == "quick" else \
        ("mnist", DataInfo("mnist", (1, 28, 28), 10, 60_000))
    hp, _ = resolve_hparams(DPAF, preset, dataset, {})
    assert hp.fill_budget is True
    spent = compose_rdp(DPAF(hp, info).plan(Budget(eps)), 1e-5)
    assert 0.99 * eps <= spent <= eps
    hp, _ = resolve_hparams(DPAF, preset, dataset, {"fill_budget": False})
    additive = compose_rdp(DPAF(hp, info).plan(Budget(eps)), 1e-5)
    assert additive < spent
    if preset == "quick" and eps == 1.0:
        canonical, _ = resolve_hparams(DPAF, preset, dataset, {"fill_budget": False, "budget_split": "0.1,x,0.1"})
        assert compose_rdp(DPAF(canonical, info).plan(Budget(eps)), 1e-5) == pytest.approx(0.816, abs=0.002)


def test_zero_epsilon_for_conv1_skips_phase_one():
    m, ctx = _fit(eps=1.0, budget_split="0,x,0.1")
    assert ctx.ledger.taken["conv1"] == 0 and ctx.ledger.planned["conv1"].steps == 0
    assert not any(r.get("phase") == "classifier" for r in ctx.records)


# -------------------------------------------------------------- per-example


def test_sound_conv2_gradients_of_one_example_do_not_depend_on_the_others():
    """The sound mode's per-example gradient: ∇⟨SIN(conv2*(conv1(x_i), y_i)), v⟩ with v fixed,
    identical whether x_i is alone or in a batch (the DPSGD sensitivity argument)."""
    torch.manual_seed(0)
    layout = make_layout((1, 16, 16), "C2-C1-×", 4)
    conv1, conv2 = Conv1(layout).double(), Conv2Star(layout, 10, 3).double()
    x, y = torch.randn(5, 1, 16, 16, dtype=torch.float64), torch.randint(0, 10, (5,))
    v = torch.randn(5, 2 * 2 * 16, dtype=torch.float64)

    def grads(idx):
        c2 = Conv2Star(layout, 10, 3).double()
        c2.load_state_dict(conv2.state_dict())
        gsm, _ = make_private(c2, torch.optim.SGD(c2.parameters(), lr=0), ctx=PartContext(0), part="d", max_grad_norm=1,
                              expected_batch_size=5)
        with torch.no_grad():
            h1 = conv1(x[idx])
        (sin(gsm(h1, y[idx])).flatten(1) * v[idx]).sum(1).mean().backward()
        return torch.cat([p.grad_sample.flatten(1) for p in c2.parameters()], 1)

    together = grads(torch.arange(5))
    for i in range(5):
        torch.testing.assert_close(grads(torch.tensor([i]))[0], together[i], rtol=1e-9, atol=1e-12)


# ------------------------------------------------------------------ end to end


def test_fit_sample_and_state_dict_round_trip():
    m, ctx = _fit(eps=5.0)
    rep = ctx.ledger.report()
    assert rep.epsilon_rdp <= 5.0 and {p.name for p in rep.parts} == {"conv1", "conv2", "dpagg"}
    x, y = m.sample(12, torch.arange(12) % 10, torch.Generator().manual_seed(0))
    assert x.shape == (12, 1, 16, 16) and x.dtype == torch.float32 and x.abs().max() <= 1
    assert torch.equal(y, torch.arange(12) % 10)
    m2 = DPAF(m.hparams, DIGITS)
    m2.load_state_dict(m.state_dict())
    x2, _ = m2.sample(12, torch.arange(12) % 10, torch.Generator().manual_seed(0))
    torch.testing.assert_close(x, x2)
    assert any(r["phase"] == "gan" and r["d_loss"] is not None for r in ctx.records)


def test_training_at_another_size_samples_at_the_dataset_size():
    m, _ = _fit(eps=5.0, layer_config="C2-C2-C1", image_size=32)
    assert m.train_shape == (1, 32, 32) and m.layout.agg_size == 2
    x, _ = m.sample(4, torch.arange(4), torch.Generator().manual_seed(0))
    assert x.shape == (4, 1, 16, 16) and x.abs().max() <= 1


def test_layer_configurations_too_deep_for_the_image_are_user_errors():
    with pytest.raises(UserError, match="image_size"):
        DPAF(DPAFHparams(**{**TINY, "layer_config": "C3-C1-x"}), DIGITS)
    assert DPAF(DPAFHparams(**{**TINY, "layer_config": "C3-C1-x", "image_size": 32}), DIGITS).layout.x1 == 3


def test_empty_poisson_batches_still_take_their_noisy_steps():
    # q·N ≈ 0.5: most batches are empty; every planned step is still taken
    m, ctx = _fit(eps=5.0, batch_size=1, batches=8, mu=4, classifier_batches=4)
    assert ctx.ledger.taken == {"conv1": 4, "conv2": 2, "dpagg": 8}


def test_paper_preset_settings_follow_section_6_1():
    p = DPAF.presets["paper"]
    assert set(p) == {"mnist", "fashion-mnist", "celeba-gender", "celeba-hair", "ffhq-gender"}
    assert p["mnist"]["batch_size"] == p["fashion-mnist"]["batch_size"] == 24
    assert p["celeba-gender"]["batch_size"] == p["ffhq-gender"]["batch_size"] == 64
    assert {v["layer_config"] for k, v in p.items() if "celeba" in k} == {"C2-C2-C1"}
    assert p["mnist"]["layer_config"] == "C2-C1-×" and p["ffhq-gender"]["layer_config"] == "C3-C1-×"
    assert all(v["latent_dim"] == 100 and v["mu"] == 8 and v["budget_split"] == "0.1,x,0.1" and v["gc"]
               and v["gc_keep"] == 0.9 for v in p.values())
    for name, shape in [("mnist", (1, 28, 28)), ("celeba-gender", (3, 64, 64)), ("ffhq-gender", (3, 128, 128))]:
        settings = {k: v for k, v in p[name].items() if k != "samples_per_class"}
        DPAF(DPAFHparams(**{**settings, "d_width": 4, "g_width": 4}), DataInfo(name, shape, 2, 60_000))


def test_dp_parts_are_opacus_compatible_and_fake_rows_share_the_batch():
    # the discriminator's private part has no BatchNorm and works under make_private
    layout = make_layout((1, 16, 16), "C2-C1-×", 4)
    c2 = Conv2Star(layout, 10, 3)
    gsm, opt = make_private(c2, torch.optim.SGD(c2.parameters(), lr=0.1), ctx=PartContext(1.0), part="d",
                            max_grad_norm=1.0,
                            expected_batch_size=4)
    out = gsm(torch.randn(4, 8, 4, 4), torch.tensor([0, 1, 2, 3]))
    F.softplus(out).mean().backward()
    opt.step()
    assert all(p.grad is not None for p in c2.parameters())


def test_budget_must_be_finite():
    with pytest.raises(UserError):
        DPAF(DPAFHparams(**TINY), DIGITS).plan(Budget(float("inf")))


def test_planned_parts_are_privacy_parts():
    parts = DPAF(DPAFHparams(**TINY), DIGITS).plan(Budget(1.0))
    assert all(isinstance(p, PrivacyPart) and p.mechanism == "subsampled_gaussian" for p in parts)


@pytest.mark.parametrize("gc", [False, True])
@pytest.mark.parametrize("privacy_mode", ["sound", "paper"])
def test_book_keeping_gives_the_hooks_training(privacy_mode, gc):
    """``auto`` picks book-keeping, with gradient compression (each example's gradient built
    a chunk at a time, compressed, clipped) and without it; both phases' DPSGD parts (and the
    paper mode's non-private conv2/head of C, trained on the same loss) end where Opacus'
    hooks end, on the same seed, including empty Poisson batches (batch_size=2)."""
    states = {}
    for mode in ("hooks", "auto"):
        torch.manual_seed(0)
        m, ctx = _fit(eps=5.0, gc=gc, grad_sample_mode=mode, privacy_mode=privacy_mode, batch_size=2,
                      batches=12, classifier_batches=6)
        states[mode] = m.state_dict()
        assert ctx.ledger.taken == {"conv1": 6, "conv2": 3, "dpagg": 12}
    assert DPAFHparams(gc=False).dpsgd_mode == "bk" and DPAFHparams().dpsgd_mode == "bk"
    for net in ("conv1", "conv2", "head", "G"):
        for k, v in states["hooks"][net].items():
            torch.testing.assert_close(states["auto"][net][k], v, rtol=1e-4, atol=1e-6, msg=f"{net}.{k}")


def test_aggregate_g_loss_reads_the_fakes_clean_mean_and_no_real_image(monkeypatch):
    """``g_loss=aggregate`` (the no-noise-gap diagnostic): G's loss is D's head at the mean of
    the fakes' features, the input D's head is trained on; it reads no real image (so it
    costs no privacy) and gives the same plan as the paper's per-example D̂."""
    m, ctx = _fit(eps=5.0, g_loss="aggregate")
    assert ctx.ledger.report().epsilon_rdp <= 5.0
    assert [p.steps for p in m.plan(Budget(5.0))] == [p.steps for p in DPAF(DPAFHparams(**TINY), DIGITS).plan(Budget(5.0))]
    seen = []
    orig = m.head.forward
    monkeypatch.setattr(m.head, "forward", lambda a: (seen.append(a.detach().clone()), orig(a))[1])
    x, y = m._fake(m.hparams.batch_size, torch.device("cpu"))
    hooks = type("NoHooks", (), {"disable_hooks": lambda self: None, "enable_hooks": lambda self: None})()
    m._g_step(hooks, torch.optim.SGD(m.G.parameters(), lr=0.0), x, y)
    (agg,) = seen
    expected = m._features(x.detach(), y).flatten(1).sum(0, keepdim=True) / m.hparams.batch_size
    torch.testing.assert_close(agg.reshape(expected.shape), expected)
    seen.clear()
    m.hparams = dataclasses.replace(m.hparams, g_loss="per_example")
    x, y = m._fake(m.hparams.batch_size, torch.device("cpu"))
    m._g_step(hooks, torch.optim.SGD(m.G.parameters(), lr=0.0), x, y)
    assert seen[0].shape[0] == len(x)  # D̂: one row per fake


@pytest.mark.parametrize("mode", ["hooks", "auto"])
def test_gradient_compression_reaches_every_dpsgd_step_of_both_phases(mode, monkeypatch):
    """GC is the DPSGD parts' per-example transform: every non-empty step of conv1 (phase 1)
    and conv2* (phase 2) compresses each example's whole gradient over that part's
    parameters, in Opacus' hooks and in book-keeping (``auto``), and none with gc off. (The
    trained states cannot show it: at this size the noise swamps the dropped 10 %.)"""
    from methods.dpaf.compression import GradientCompression

    calls, plan = [], GradientCompression.plan

    def spy(self, n, d, device):
        calls.append((n, d))
        return plan(self, n, d, device)

    monkeypatch.setattr(GradientCompression, "plan", spy)
    for gc in (False, True):
        calls.clear()
        torch.manual_seed(0)
        m, ctx = _fit(eps=5.0, gc=gc, grad_sample_mode=mode, privacy_mode="sound", batch_size=4, batches=12,
                      classifier_batches=6)
        if not gc:
            assert calls == []
            continue
        d1 = sum(p.numel() for p in m.conv1.parameters())
        d2 = sum(p.numel() for p in m.conv2.parameters())
        sizes = [d for _, d in calls]
        # phase 1 trains all of C (conv1 and the rest, d > conv1's) privately in the sound mode,
        # then phase 2 conv2*; a Poisson batch that came out empty has nothing to compress
        first = sizes[:sizes.index(d2)]
        assert first and set(first) == {first[0]} and first[0] > d1, sizes
        assert sizes[len(first):] == [d2] * (len(sizes) - len(first)) and len(sizes) - len(first) >= 2, sizes
        assert len(first) <= ctx.ledger.taken["conv1"] and all(n > 0 for n, _ in calls)


def test_the_generator_is_the_cdcgan_one_by_default_and_the_old_one_on_request():
    """G's hidden layers: LeakyReLU, no BatchNorm, one-hot labels by default (the
    textbook BatchNorm + ReLU + embedding G ignores z here: benchmarks/presets.md); the old
    one stays reachable, and unknown choices are refused."""
    from torch import nn

    from methods.dpaf.nets import Generator

    L = make_layout((1, 28, 28), "C2-C1-×", 4)
    new = Generator(L, 10, 4, 8, 6)
    kinds = {type(m) for m in new.modules()}
    assert nn.LeakyReLU in kinds and nn.BatchNorm2d not in kinds and nn.ReLU not in kinds and nn.Embedding not in kinds
    assert new.proj_y.in_channels == 10  # the one-hot label
    old = Generator(L, 10, 4, 8, 6, batchnorm=True, activation="relu", label="embedding")
    kinds = {type(m) for m in old.modules()}
    assert {nn.ReLU, nn.BatchNorm2d, nn.Embedding} <= kinds and nn.LeakyReLU not in kinds
    assert old.proj_y.in_channels == 6
    z, y = torch.randn(5, 8), torch.arange(5)
    for G in (new, old):
        assert G(z, y).shape == (5, 1, 28, 28)
    # the label changes the image and so does z (one class, two latents)
    x = new(torch.randn(2, 8), torch.tensor([3, 3]))
    assert (x[0] - x[1]).abs().max() > 0
    with pytest.raises(ValueError, match="activation"):
        Generator(L, 10, 4, 8, 6, activation="gelu")
    with pytest.raises(ValueError, match="label"):
        Generator(L, 10, 4, 8, 6, label="text")
    m, _ = _fit(eps=5.0, g_activation="relu", g_batchnorm=True, g_label="embedding")  # the old G trains
    assert isinstance(m.G.embed, nn.Embedding)


def test_each_dpsgd_part_is_clipped_at_its_own_bound_and_noised_at_sigma_times_it(monkeypatch):
    """max_grad_norm_conv1/2 (None: max_grad_norm) reach Opacus' optimizer of their part, whose
    noise std on the summed gradient is σ·C of that part (make_private's closed form is tested in
    the DPSGD tests); a plant that passes max_grad_norm to conv2 fails here."""
    import methods.dpaf.core as core

    seen = {}
    real = core.make_private

    def spy(module, opt, **kw):
        gsm, dp_opt = real(module, opt, **kw)
        seen[kw["part"]] = dp_opt
        return gsm, dp_opt

    monkeypatch.setattr(core, "make_private", spy)
    m, ctx = _fit(eps=2.0, max_grad_norm=0.7, max_grad_norm_conv2=0.03)
    assert seen["conv1"].max_grad_norm == 0.7 and seen["conv2"].max_grad_norm == 0.03
    for part in ("conv1", "conv2"):
        assert seen[part].noise_multiplier == ctx.ledger.planned[part].noise_multiplier
    seen.clear()
    _fit(eps=2.0, max_grad_norm_conv1=0.2, classifier_batches=2, batches=4)
    assert seen["conv1"].max_grad_norm == 0.2 and seen["conv2"].max_grad_norm == 1.0


def test_d_label_std_scales_the_same_draw_of_the_label_embedding():
    torch.manual_seed(0)
    a = DPAF(DPAFHparams(**TINY), DIGITS)
    torch.manual_seed(0)
    b = DPAF(DPAFHparams(**TINY, d_label_std=0.02), DIGITS)
    assert torch.allclose(b.conv2.embed.weight, 0.02 * a.conv2.embed.weight)
    assert all(torch.equal(p, q) for p, q in zip(a.G.parameters(), b.G.parameters()))  # nothing else moves
