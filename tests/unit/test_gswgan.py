"""GS-WGAN / DP-GAN-DPAC: the gradient sanitiser against its math, the generator step's
isolation from D and C, the subset discipline of C's real data, and the privacy plan."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fake_context import FakeContext
from spies import recording

from dpgen_bench.api import Budget, DataInfo, PrivacyPart, Split
from dpgen_bench.errors import UserError
from dpgen_bench.nets.resnet import ConditionalResNetGenerator
from dpgen_bench.privacy import compose_rdp
from dpgen_bench.privacy.accounting import WOR, WOR_GAUSSIAN
from dpgen_bench.privacy.ledger import PrivacyLedger
from dpgen_bench.privacy.sanitizer import GradientSanitizer
from methods.dpac import DPAC, AuxiliaryClassifier, DPACHparams
from dpgen_bench.nets.projection import ProjectionDiscriminator
from methods.gswgan import GSWGAN, GSWGANHparams

SHAPE = (1, 16, 16)
INFO = DataInfo("digits", SHAPE, 10, 1437)
TINY = dict(num_discriminators=3, batch_size=8, n_d=1, steps=6, pretrain_steps=1, latent_dim=8, g_width=8,
            d_width=4, embed_dim=4, ema_decay=0.9, log_every=2)


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/unit/conftest.py


_Spy = recording(GradientSanitizer)  # keeps what the hook received and returned


# ------------------------------------------------------------------ the sanitiser


def test_clips_each_row_to_C_and_scales():
    g = torch.randn(6, 1, 4, 4, generator=torch.Generator().manual_seed(0))
    target = torch.tensor([0.1, 0.5, 0.99, 2.0, 3.0, 10.0])
    g = g / g.flatten(1).norm(dim=1).view(-1, 1, 1, 1) * target.view(-1, 1, 1, 1)
    C, scale = 1.0, 0.25
    s = GradientSanitizer(max_norm=C, noise_multiplier=0.0, scale=scale)
    out = s(g)
    factor = torch.clamp(C / target, max=1.0).view(-1, 1, 1, 1)
    torch.testing.assert_close(out, g * factor * scale)
    norms = out.flatten(1).norm(dim=1) / scale
    torch.testing.assert_close(norms, torch.minimum(target, torch.tensor(C)))
    assert s.calls == 1 and s.last_clip_fraction == pytest.approx(0.5)


def test_noise_is_gaussian_with_std_sigma_C_times_scale_and_seeded():
    sigma, C, scale = 1.3, 0.7, 1 / 8
    zero = torch.zeros(64, 1, 64, 64)  # 262,144 coordinates
    s = GradientSanitizer(C, sigma, torch.Generator().manual_seed(5), scale=scale)
    noise = s(zero)
    expected = sigma * C * scale
    # the std of a sample std with n ≈ 2.6e5 is ≈ expected/sqrt(2n) ≈ 0.14%: 1% is > 7 standard errors
    assert noise.std().item() == pytest.approx(expected, rel=0.01)
    assert abs(noise.mean().item()) < 4 * expected / noise.numel() ** 0.5
    again = GradientSanitizer(C, sigma, torch.Generator().manual_seed(5), scale=scale)(zero)
    other = GradientSanitizer(C, sigma, torch.Generator().manual_seed(6), scale=scale)(zero)
    assert torch.equal(noise, again) and not torch.equal(noise, other)
    # noise is added after clipping: a huge gradient still leaves a row of norm ≈ ‖clip‖ + noise
    big = torch.zeros(1, 1, 64, 64)
    big[0, 0, 0, 0] = 1e6
    out = GradientSanitizer(C, 0.0)(big)
    assert out.norm().item() == pytest.approx(C)


def _nets(seed=0):
    torch.manual_seed(seed)
    G = ConditionalResNetGenerator(SHAPE, 10, width=8, latent_dim=8, embed_dim=4).eval()
    D = ProjectionDiscriminator(SHAPE, 10, width=4).eval()  # spectral norm: no power iteration per call
    return G, D


def test_hook_sees_per_example_gradients_and_only_G_is_updated():
    G, D = _nets()
    B = 5
    z, y = torch.randn(B, 8), torch.randint(0, 10, (B,))
    # per-example gradients of ℓ_i = −D(x_i, y_i), one example at a time
    x_ref = G(z, y).detach()
    per_example = []
    for i in range(B):
        xi = x_ref[i:i + 1].clone().requires_grad_(True)
        (gi,) = torch.autograd.grad(-D(xi, y[i:i + 1]).sum(), xi)
        per_example.append(gi[0])
    per_example = torch.stack(per_example)
    C = 0.5 * per_example.flatten(1).norm(dim=1).median().item()  # some rows clipped, some not

    spy = _Spy(C, 0.7, torch.Generator().manual_seed(1), scale=1 / B)
    x = G(z, y)
    handle = spy.attach(x)
    loss = -D(x, y).sum()
    loss.backward(inputs=list(G.parameters()), retain_graph=True)
    handle.remove()
    assert spy.calls == 1
    torch.testing.assert_close(spy.received, per_example, rtol=1e-4, atol=1e-7)
    assert (spy.clip(spy.received).flatten(1).norm(dim=1) <= C * (1 + 1e-5)).all()
    # G's gradient is J_Gᵀ · M(∂L/∂x): nothing else reaches it
    expected = torch.autograd.grad(x, list(G.parameters()), grad_outputs=spy.returned, allow_unused=True)
    for p, e in zip(G.parameters(), expected):
        torch.testing.assert_close(p.grad, torch.zeros_like(p) if e is None else e, rtol=1e-4, atol=1e-7)
    assert all(p.grad is None for p in D.parameters())


def test_two_consumers_are_clipped_together_once():
    G, D = _nets()
    Cnet = AuxiliaryClassifier(SHAPE, 10, width=4)
    B = 4
    z, y = torch.randn(B, 8), torch.randint(0, 10, (B,))
    x = G(z, y)
    loss_d, loss_c = -D(x, y).sum(), F.cross_entropy(Cnet(x), y, reduction="sum")
    g_d, g_c = torch.autograd.grad([loss_d], [x], retain_graph=True)[0], torch.autograd.grad([loss_c], [x],
                                                                                            retain_graph=True)[0]
    spy = _Spy(1e9, 0.0)
    handle = spy.attach(x)
    (0.8 * loss_d + 0.2 * loss_c).backward(inputs=list(G.parameters()))
    handle.remove()
    assert spy.calls == 1
    torch.testing.assert_close(spy.received, 0.8 * g_d + 0.2 * g_c, rtol=1e-4, atol=1e-7)
    assert all(p.grad is None for p in list(D.parameters()) + list(Cnet.parameters()))


def test_networks_have_no_batch_coupling():
    """Row i of ∂L/∂x is example i's gradient only if D, C (and G) treat examples separately."""
    G, D = _nets()
    Cnet = AuxiliaryClassifier(SHAPE, 10, width=4)
    z, y = torch.randn(6, 8), torch.randint(0, 10, (6,))
    x = G(z, y)
    torch.testing.assert_close(G(z[2:3], y[2:3]), x[2:3], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(D(x[4:5], y[4:5]), D(x, y)[4:5], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(Cnet(x[1:2]), Cnet(x)[1:2], rtol=1e-5, atol=1e-6)


def test_nothing_bypasses_the_sanitiser_in_the_dpac_generator_loss():
    """A hook that zeroes the image gradient must leave G without any gradient: D's and
    C's feedback (C trained on real data of the subset) reach G only through it."""
    m = DPAC(DPACHparams(**TINY, t_c=0, n_f=1, n_r=1, c_width=4), INFO)
    D = m._new_discriminator()
    gen = torch.Generator().manual_seed(0)
    subset = Split(torch.rand(20, *SHAPE) * 2 - 1, torch.randint(0, 10, (20,)))
    zero = GradientSanitizer(1e-30, 0.0)
    y = torch.randint(0, 10, (8,))
    x = m.G(m._latent(8, "cpu"), y)
    handle = zero.attach(x)
    logs = {}
    loss = m._generator_loss(x, y, D, subset, t=1, gen=gen, logs=logs)
    loss.backward(inputs=list(m.G.parameters()))
    handle.remove()
    assert zero.calls == 1 and "c_g_acc" in logs and m.c_real_steps == 1
    assert max(p.grad.abs().max().item() for p in m.G.parameters() if p.grad is not None) < 1e-20
    assert all(p.grad is None for p in D.parameters())


# ------------------------------------------------------------------------- training


def test_partition_is_disjoint_and_covers_every_record():
    m = GSWGAN(GSWGANHparams(num_discriminators=7), INFO)
    parts = m._partition(700, seed=3)
    allidx = torch.cat([torch.as_tensor(p) for p in parts])
    assert len(parts) == 7 and sorted(allidx.tolist()) == list(range(700))
    assert all(50 <= len(p) <= 150 for p in parts)  # Binomial(700, 1/7): mean 100, sd ≈ 9
    # each record's subset is its own draw: the first 600 records land where they did
    # when 100 more records are appended (adding records moves no one else)
    first = m._partition(600, seed=3)
    assert all(np.array_equal(a, b[b < 600]) for a, b in zip(first, parts))


def test_dpac_fit_uses_only_the_chosen_subset_and_spends_once_per_generator_step(monkeypatch):
    h = DPACHparams(**TINY, t_c=2, n_f=1, n_r=2, c_width=4)
    info = DataInfo("digits", SHAPE, 10, 60)
    m = DPAC(h, info)
    budget = Budget(10.0)
    ledger = PrivacyLedger(budget, m.plan(budget))
    events = []
    real_batch, gen_loss = m._real_batch, m._generator_loss

    def spy_real(subset, size, gen):
        events.append(("real", id(subset)))
        return real_batch(subset, size, gen)

    def spy_gen(x, y, D, subset, t, gen, logs):
        events.append(("gen", id(subset), id(D), t))
        out = gen_loss(x, y, D, subset, t, gen, logs)
        events.append(("end", id(subset)))
        return out

    monkeypatch.setattr(m, "_real_batch", spy_real)
    monkeypatch.setattr(m, "_generator_loss", spy_gen)
    train = Split(torch.rand(60, *SHAPE) * 2 - 1, torch.randint(0, 10, (60,)))
    ctx = FakeContext(ledger)
    m.fit(train, budget, ctx)

    # pretraining: each of the 3 discriminators on its own subset (1 iteration × n_d batch)
    pre = [e[1] for e in events[:3]]
    assert all(e[0] == "real" for e in events[:3]) and len(set(pre)) == 3
    steps, d_of_subset, pending, current = 0, {}, [], None
    for e in events[3:]:
        if e[0] == "real":
            pending.append(e[1])
        elif e[0] == "gen":  # the step's critic batches all came from the chosen subset
            assert pending == [e[1]] * h.n_d, "a critic batch came from another subset"
            assert d_of_subset.setdefault(e[1], e[2]) == e[2], "a discriminator met another subset"
            pending, current, steps = [], e, steps + 1
        else:  # C's real batches of this step: n_r from the chosen subset, from t_c on
            assert pending == [e[1]] * (h.n_r if current[3] > h.t_c else 0), "C saw another subset"
            pending = []
    assert pending == [] and set(d_of_subset) <= set(pre)
    assert steps == h.steps == ledger.taken["generator_gradient"]
    assert m.c_real_steps == (h.steps - h.t_c) * h.n_r
    report = ledger.report()
    assert report.epsilon_rdp <= 10.0 and [p.name for p in report.parts] == ["generator_gradient"]
    assert m.discriminators == []  # discarded
    assert set(m.state_dict()) == {"G"}
    assert any("c_real_steps" in r for r in ctx.records)
    x, y = m.sample(20, torch.arange(10).repeat(2), torch.Generator().manual_seed(0))
    assert x.shape == (20, *SHAPE) and x.dtype == torch.float32 and x.abs().max() <= 1 and torch.equal(
        y, torch.arange(10).repeat(2))
    clone = DPAC(h, info)
    clone.load_state_dict(m.state_dict())
    x2, _ = clone.sample(20, torch.arange(10).repeat(2), torch.Generator().manual_seed(0))
    torch.testing.assert_close(x, x2)
    z = torch.randn(3, m.latent_dim, requires_grad=True)
    m.generate(z, torch.tensor([0, 1, 2])).sum().backward()
    assert z.grad is not None and m.latent_dim == h.latent_dim


# -------------------------------------------------------------------------- privacy


def test_plan_rate_is_one_over_K_and_hook_noise_is_2_sqrt_B_sigma():
    m = GSWGAN(GSWGANHparams(**dict(TINY, steps=None, noise_multiplier=0.8)), INFO)
    (part,) = m.plan(Budget(10.0))
    assert part.name == "generator_gradient" and part.sample_rate == pytest.approx(1 / 3)
    assert part.noise_multiplier == 0.8 and part.steps > 0
    assert compose_rdp([part], 1e-5) <= 10.0
    assert part.mechanism == WOR_GAUSSIAN  # sampling without replacement (one of K), not Poisson; Theorem 27
    assert compose_rdp([PrivacyPart("x", 0.8, 1 / 3, part.steps + 1, mechanism=WOR_GAUSSIAN)], 1e-5) > 10.0  # used up
    assert m.hook_noise_multiplier(0.8) == pytest.approx(2 * math.sqrt(8) * 0.8)


@pytest.mark.parametrize("cls", [GSWGAN, DPAC])
@pytest.mark.parametrize("eps", [1.0, 10.0])
def test_quick_preset_calibrates_to_the_target(cls, eps):
    h = cls.Hparams(**{k: v for k, v in cls.presets["quick"]["digits"].items() if k != "samples_per_class"})
    (part,) = cls(h, INFO).plan(Budget(eps))
    assert part.sample_rate == pytest.approx(1 / h.num_discriminators) and part.steps == h.steps
    assert eps * 0.95 <= compose_rdp([part], 1e-5) <= eps


def test_gswgan_paper_sigma_does_not_meet_eps10_when_the_batch_shares_one_sampling_event():
    """GS-WGAN's σ = 1.07 (noise 2·1.07·C per example, K = 1000, B = 32, T = 20,000) is ε = 9.99
    by its own accounting (T·B separately amplified mechanisms, autodp's bound) but far above
    10 when the B examples of a step are one mechanism, as here."""
    own = compose_rdp([PrivacyPart("own", 1.07, 1e-3, 20_000 * 32, mechanism=WOR)], 1e-5)
    joint = compose_rdp([PrivacyPart("joint", 1.07 / math.sqrt(32), 1e-3, 20_000, mechanism=WOR)], 1e-5)
    assert own == pytest.approx(9.99, abs=0.01) and joint > 1000


def test_too_many_discriminators_is_a_user_error():
    with pytest.raises(UserError, match="num_discriminators"):
        GSWGAN(GSWGANHparams(num_discriminators=2000, steps=10), INFO).plan(Budget(10.0))


# ------------------------------------------------------- GS-WGAN's own accounting (opt-in)


def test_paper_mode_is_gswgan_accounting_with_a_caveat():
    """privacy_mode=paper: B compositions per generator step at rate 1/K with noise
    multiplier σ and hook noise 2σ·C (GS-WGAN's privacy_analysis.py and dp_conv_hook);
    the paper's setting σ = 1.07, T = 20,000, B = 32, K = 1,000 then is ε = 9.99, autodp's number."""
    paper = dict(num_discriminators=1000, batch_size=32, steps=None, noise_multiplier=1.07, privacy_mode="paper")
    info = DataInfo("mnist", (1, 28, 28), 10, 60_000)
    m = GSWGAN(GSWGANHparams(**paper), info)
    (part,) = m.plan(Budget(10.0))
    assert part.noise_multiplier == 1.07 and part.sample_rate == pytest.approx(1e-3)
    assert part.mechanism == WOR and part.steps % 32 == 0
    assert 20_000 <= part.steps // 32 < 20_200  # σ = 1.07 is the paper's ε = 10 at T = 20,000
    assert m.hook_noise_multiplier(1.07) == pytest.approx(2 * 1.07) and m.compositions_per_step == 32
    fixed = GSWGAN(GSWGANHparams(**dict(paper, steps=20_000)), info)
    (part,) = fixed.plan(Budget(10.0))
    assert part.steps == 20_000 * 32 and compose_rdp([part], 1e-5) == pytest.approx(9.99, abs=0.01)
    (calibrated,) = GSWGAN(GSWGANHparams(**dict(paper, steps=20_000, noise_multiplier=None)), info).plan(Budget(10.0))
    assert calibrated.noise_multiplier == pytest.approx(1.07, abs=0.005)  # --eps 10 gives the paper's σ
    assert "not a DP guarantee" in fixed.accounting_caveat()
    sound = GSWGAN(GSWGANHparams(**dict(paper, privacy_mode="sound")), info)
    assert sound.accounting_caveat() is None and sound.compositions_per_step == 1
    assert sound.hook_noise_multiplier(1.07) == pytest.approx(2 * math.sqrt(32) * 1.07)


@pytest.mark.parametrize("cls", [GSWGAN, DPAC])
def test_paper_mode_charges_B_per_generator_step_and_takes_T_steps(cls):
    extra = dict(t_c=2, n_f=1, n_r=1, c_width=4) if cls is DPAC else {}
    m = cls(cls.Hparams(**TINY, **extra, privacy_mode="paper"), DataInfo("digits", SHAPE, 10, 60))
    budget = Budget(10.0)
    (part,) = m.plan(budget)
    assert part.steps == TINY["steps"] * TINY["batch_size"]
    sigma = part.noise_multiplier
    ledger = PrivacyLedger(budget, [part])
    ctx = FakeContext(ledger)
    train = Split(torch.rand(60, *SHAPE) * 2 - 1, torch.randint(0, 10, (60,)))
    m.fit(train, budget, ctx)
    report = ledger.report()
    assert ledger.taken["generator_gradient"] == part.steps  # T generator steps × B
    assert max(r["step"] for r in ctx.records if "step" in r) == TINY["steps"]
    assert report.epsilon_rdp <= 10.0 and m.hook_noise_multiplier(sigma) == pytest.approx(2 * sigma)


def test_the_sanitiser_counts_its_own_release_before_it_returns():
    """The step is counted by the sanitiser as it releases the gradient, so no
    loop can count it after the update (or forget it)."""
    from dpgen_bench.privacy.sanitizer import GradientSanitizer

    seen = []
    s = GradientSanitizer(0.7, 2.0, generator=torch.Generator().manual_seed(0),
                          on_release=lambda: seen.append(s.calls))
    x = torch.zeros(4, 3, requires_grad=True)
    y = x * 2
    handle = s.attach(y)
    y.sum().backward()
    handle.remove()
    assert seen == [1] and x.grad is not None


@pytest.mark.parametrize("B", [4, 64])
def test_noise_reaching_G_does_not_shrink_with_the_batch(B):
    """The gswgan docstring's noise argument: with the sound hook noise 2√B·σ·C per row and the
    1/B scale, the noise part of G's gradient is (1/B)·Σᵢ J_iᵀ nᵢ, of covariance 4σ²C²·E[JᵀJ]
    whatever B is: a larger batch buys no averaging (DP-SGD on D's parameters gets σC/B). For a
    linear generator x_i = W z_i with z ~ N(0, I), every entry of W's gradient has std 2σC
    exactly. A hook without the √B (GS-WGAN's own 2σ) would give 2σC/√B."""
    sigma, C, d, k, reps = 0.9, 0.6, 49, 8, 40
    m = GSWGAN(GSWGANHparams(**dict(TINY, batch_size=B, steps=None, noise_multiplier=sigma)), INFO)
    gen = torch.Generator().manual_seed(B)
    W = torch.zeros(d, k, requires_grad=True)
    grads = []
    for _ in range(reps):
        z = torch.randn(B, k, generator=gen)
        x = (z @ W.T).view(B, 1, 7, 7)
        s = GradientSanitizer(C, m.hook_noise_multiplier(sigma), gen, scale=1.0 / B)
        handle = s.attach(x)
        (x * 0.0).sum().backward()  # every row's data gradient is 0: what reaches W is the noise alone
        handle.remove()
        grads.append(W.grad.clone())
        W.grad = None
    std = torch.stack(grads).std().item()  # 40·49·8 = 15,680 entries: the sample std is within ~1 %
    assert std == pytest.approx(2 * sigma * C, rel=0.05)
