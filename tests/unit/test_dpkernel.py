"""DP-Kernel against the math: the RKHS sensitivity √m/B of the released mean embedding, the
Gaussian-process noise's covariance (σΔ)²·k at the generated points and of its derivatives
there (what G reads), noise that is never dropped whatever K is, the ledger charged before
each draw, an end-to-end run within its ε, and DPImageBench's mechanism (a diagnostic) with
the steps whose noise it drops recorded."""

import json
import math

import pytest
import torch
from fake_context import FakeContext

import methods.dpkernel as dpk
from dpgen_bench.api import Budget, DataInfo, PrivacyPart, Split
from dpgen_bench.cli import cli
from dpgen_bench.privacy import PrivacyLedger, calibrate_noise
from methods.dpkernel import (PART, DPKernel, DPKernelHparams, dpimagebench_gram, dpimagebench_noise, gp_draw, gram,
                              psd_factor, witness)

SHAPE = (1, 16, 16)
D = 256
INFO = DataInfo("toy", SHAPE, 3, 200)


def _ctx(sigma: float, steps: int = 10**6, seed: int = 0) -> FakeContext:
    """A context whose one part has noise multiplier ``sigma`` and room for ``steps`` steps."""
    budget = Budget(1e9)
    return FakeContext(PrivacyLedger(budget, [PrivacyPart(PART, sigma, 0.1, steps)]), seed=seed)


def _brute_joint_cov(y, labels, bandwidths):
    """The covariance of (g(y_j), ∇g(y_j))_j for g ~ GP(0, k), from k's derivatives taken by
    autograd (values first, then each point's d partial derivatives)."""
    n, d = y.shape

    def k(u, v, same):
        return sum(torch.exp(-((u - v) ** 2).sum() / (2 * s * s)) for s in bandwidths) * same

    cov = torch.zeros(n * (1 + d), n * (1 + d), dtype=torch.float64)
    for j in range(n):
        for l in range(n):
            if labels[j] != labels[l]:
                continue
            u, v = y[j].clone().requires_grad_(True), y[l].clone().requires_grad_(True)
            kv = k(u, v, 1.0)
            cov[j, l] = kv.detach()
            gu, = torch.autograd.grad(kv, u, create_graph=True)
            gv, = torch.autograd.grad(kv, v, retain_graph=True)
            cov[n + j * d:n + (j + 1) * d, l] = gu.detach()
            cov[j, n + l * d:n + (l + 1) * d] = gv.detach()
            for a in range(d):
                gva, = torch.autograd.grad(gu[a], v, retain_graph=True)
                cov[n + j * d + a, n + l * d:n + (l + 1) * d] = gva.detach()
    return cov


# ------------------------------------------------------------------ sensitivity


@pytest.mark.parametrize("where", ["far", "near"])
def test_neighbouring_batches_give_functions_sqrt_m_over_b_apart_in_the_rkhs(where):
    """f_S' − f_S = k(x, ·)/B for S' = S ∪ {x}: its RKHS norm, √(vᵀK⁻¹v) from its values v at
    the points of S' (the code's own ``witness``), is √m/B = the method's Δ, for a point far
    from S as for one next to a record, whatever the realised batch size (here 8, B = 10)."""
    h = DPKernelHparams(batch_size=10, bandwidths="0.5,1.0")
    m = DPKernel(h, INFO)
    g = torch.Generator().manual_seed(0)
    s_img = (torch.rand(8, 16, generator=g, dtype=torch.float64) * 6 - 3)
    s_lab = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    x = torch.full((1, 16), 9.0, dtype=torch.float64) if where == "far" else s_img[:1] + 0.3
    x_lab = torch.tensor([0])
    pts, pts_lab = torch.cat([s_img, x]), torch.cat([s_lab, x_lab])
    w = h.widths()
    f_s, _ = witness(s_img, s_lab, pts, pts_lab, w, h.batch_size)
    f_s2, _ = witness(pts, pts_lab, pts, pts_lab, w, h.batch_size)
    v = f_s2 - f_s
    k = gram(pts, pts_lab, pts, pts_lab, w)
    dist = math.sqrt(float(v @ torch.linalg.solve(k, v)))
    assert dist == pytest.approx(math.sqrt(2) / 10, rel=1e-9)  # √m / B with m = 2
    assert dist <= m.sensitivity * (1 + 1e-9)  # the Δ the noise is scaled with covers it
    assert dist == pytest.approx(m.sensitivity, rel=1e-9)  # and is not larger than needed


# ------------------------------------------------------------------ the GP draw


def test_the_draw_has_covariance_scale_squared_times_k_and_its_derivatives():
    """Values and gradients at fixed points (two classes, 3 + 2 points in 3 dimensions):
    the empirical covariance of many draws equals scale²·Γ, with Γ from autograd."""
    g = torch.Generator().manual_seed(1)
    y = torch.randn(5, 3, generator=g, dtype=torch.float64)
    labels = torch.tensor([0, 0, 1, 0, 1])
    bw, scale, draws = (0.7, 1.5), 0.37, 200_000
    vals, grads = gp_draw(y, labels, bw, scale, torch.Generator().manual_seed(2), draws=draws)
    x = torch.cat([vals, grads.reshape(draws, -1)], 1)
    emp = x.T @ x / draws
    want = scale**2 * _brute_joint_cov(y, labels, bw)
    se = torch.sqrt((want.diagonal()[:, None] * want.diagonal()[None, :] + want**2) / draws)
    assert ((emp - want).abs() / se.clamp(min=1e-12)).max() < 5.5  # z-scores of 400 entries
    assert torch.allclose(emp[:5, :5], scale**2 * gram(y, labels, y, labels, bw), atol=5 * se[:5, :5].max())


def test_the_methods_release_carries_noise_of_std_sigma_delta_at_its_points():
    """The method's own step (``release``): f̃(Y) − f_S(Y) over many steps at fixed points has
    covariance (σΔ)²·K_YY with σ the part's and Δ = √m/B, and the gradient's noise has
    variance (σΔ)²·Σ_s s⁻² per pixel."""
    h = DPKernelHparams(batch_size=10, bandwidths="1.0,2.0")
    m, sigma = DPKernel(h, INFO), 0.8
    ctx, noise = _ctx(sigma), torch.Generator().manual_seed(3)
    g = torch.Generator().manual_seed(4)
    real = Split(torch.rand(7, *SHAPE, generator=g) * 2 - 1, torch.tensor([0, 1, 2, 0, 1, 2, 0]))
    labels = torch.tensor([0, 0, 1, 2])
    y = torch.rand(4, D, generator=g) * 2 - 1
    f_val, f_grad = witness(real.images, real.labels, y, labels, h.widths(), h.batch_size)
    steps = 3000  # each entry of emp within 3.5 standard errors (√(K_ii K_jj + K_ij²) / √steps ≤ 0.052·sd² at 2)
    d_val, d_grad = [], []
    for _ in range(steps):
        t_val, t_grad = m.release(real, y, labels, ctx, noise)
        d_val.append(t_val - f_val)
        d_grad.append(t_grad - f_grad)
    assert ctx.ledger.taken[PART] == steps
    d_val, d_grad = torch.stack(d_val).double(), torch.stack(d_grad).double()
    sd = sigma * math.sqrt(2) / 10  # σΔ
    assert m.sensitivity == pytest.approx(math.sqrt(2) / 10)
    want = sd**2 * gram(y.double(), labels, y.double(), labels, h.widths())
    emp = d_val.T @ d_val / steps
    assert torch.allclose(emp, want, atol=0.09 * sd**2 * 2)  # 2 = m = k(y, y)
    assert d_grad.var().item() == pytest.approx(sd**2 * (1 + 1 / 4), rel=0.05)


@pytest.mark.parametrize("case", ["all_equal", "zeros", "duplicates"])
def test_the_noise_is_never_dropped_whatever_k_is(case):
    """Points whose K is singular (all equal: K = m·11ᵀ; all zero; duplicated pairs) still get
    the GP's noise: variance scale²·m at each point, correlation 1 between equal points, and
    the gradient's variance scale²·Σ_s s⁻² per coordinate."""
    g = torch.Generator().manual_seed(5)
    if case == "all_equal":
        y = torch.rand(1, 16, generator=g).repeat(6, 1) * 2 - 1
    elif case == "zeros":
        y = torch.zeros(6, 16)
    else:
        y = (torch.rand(3, 16, generator=g) * 2 - 1).repeat_interleave(2, 0)
    labels = torch.zeros(6, dtype=torch.long)
    bw, scale, draws = (1.0, 4.0), 0.3, 40_000
    vals, grads = gp_draw(y, labels, bw, scale, torch.Generator().manual_seed(6), draws=draws)
    k = gram(y.double(), labels, y.double(), labels, bw)
    assert torch.linalg.eigvalsh(k).min() < 1e-6 * k.diagonal().mean()  # singular indeed
    emp = vals.T @ vals / draws
    assert torch.allclose(emp, scale**2 * k, atol=0.05 * scale**2 * 2)
    assert grads.var(0).mean().item() == pytest.approx(scale**2 * (1 + 1 / 16), rel=0.03)


@pytest.mark.parametrize("c", [torch.ones(5, 5), torch.zeros(4, 4), torch.tensor([[1.0, 2.0], [2.0, 1.0]]),
                               torch.eye(3) * 1e-30])
def test_the_factor_covers_the_covariance(c):
    """L·Lᵀ ⪰ C for singular, zero, indefinite and tiny C: a draw with L is an exact one
    plus independent noise, never less noise."""
    c = c.double()
    factor, jitter = psd_factor(c)
    gap = factor @ factor.T - c
    assert torch.linalg.eigvalsh((gap + gap.T) / 2).min() >= -1e-12
    assert jitter > 0


def test_the_ledger_is_charged_before_every_draw(monkeypatch):
    """In both modes each step counts itself before its noise is drawn: at the k-th draw the
    ledger holds k steps, and the run ends with exactly the planned T."""
    for mode, fn in (("sound", "gp_draw"), ("dpimagebench", "dpimagebench_noise")):
        h = DPKernelHparams(batch_size=10, gen_batch_size=6, steps=5, bandwidths="1,2", g_width=4, latent_dim=4,
                            log_every=2, gp_noise=mode)
        m = DPKernel(h, INFO)
        budget = Budget(5.0)
        ctx = FakeContext(PrivacyLedger(budget, m.plan(budget)))
        seen = []
        real = getattr(dpk, fn)
        monkeypatch.setattr(dpk, fn, lambda *a, _r=real, **kw: seen.append(ctx.ledger.taken[PART]) or _r(*a, **kw))
        g = torch.Generator().manual_seed(7)
        m.fit(Split(torch.rand(200, *SHAPE, generator=g) * 2 - 1, torch.arange(200) % 3), budget, ctx)
        assert seen == [1, 2, 3, 4, 5], (mode, seen)
        assert ctx.ledger.taken == {PART: 5}


# ------------------------------------------------------------------ plan and settings


@pytest.mark.parametrize("eps", [1.0, 10.0])
def test_the_plan_is_the_poisson_subsampled_gaussian_at_b_over_n(eps):
    h = DPKernelHparams(batch_size=20, steps=300)
    (part,) = DPKernel(h, INFO).plan(Budget(eps))
    assert part.name == PART and part.mechanism == "subsampled_gaussian"
    assert part.sample_rate == pytest.approx(20 / 200) and part.steps == 300
    assert part.noise_multiplier == pytest.approx(
        calibrate_noise(epsilon=eps, delta=1e-5, sample_rate=0.1, steps=300), rel=1e-9)


def test_noise_to_signal_is_the_gradients():
    h = DPKernelHparams(batch_size=50, bandwidths="8,16")
    m = DPKernel(h, INFO)
    part = PrivacyPart(PART, 2.0, 0.25, 10)
    r = torch.linspace(0, 64, 100_001, dtype=torch.float64)
    peak = float((r / 64 * torch.exp(-r * r / 128) + r / 256 * torch.exp(-r * r / 512)).max())
    want = 2.0 * (math.sqrt(2) / 50) * math.sqrt(D * (1 / 64 + 1 / 256)) / peak
    assert m.noise_to_signal(part) == pytest.approx(want, rel=1e-6)


def test_generated_labels_are_a_fixed_balanced_list():
    m = DPKernel(DPKernelHparams(gen_batch_size=7), INFO)
    assert m._gen_labels("cpu").tolist() == [0, 1, 2, 0, 1, 2, 0]
    assert DPKernel(DPKernelHparams(), INFO).accounting_caveat() is None
    assert "not a DP guarantee" in DPKernel(DPKernelHparams(gp_noise="dpimagebench"), INFO).accounting_caveat()
    with pytest.raises(ValueError):
        DPKernelHparams(bandwidths="1,-2")


# ------------------------------------------------------------------ DPImageBench's step


def test_dpimagebench_noise_is_dropped_on_a_singular_k_and_kept_otherwise():
    g = torch.Generator().manual_seed(8)
    onehot = torch.nn.functional.one_hot(torch.zeros(8, dtype=torch.long), 3).float()
    distinct = torch.rand(8, 16, generator=g) * 20
    k_ok = dpimagebench_gram(distinct, onehot, (1.0, 2.0))
    eps, dropped = dpimagebench_noise(k_ok, 0.05, torch.Generator().manual_seed(9))
    assert not dropped and eps.abs().sum() > 0
    same = torch.rand(1, 16, generator=g).repeat(8, 1)  # eight equal images: K = m·11ᵀ
    eps, dropped = dpimagebench_noise(dpimagebench_gram(same, onehot, (1.0, 2.0)), 0.05, torch.Generator())
    assert dropped and eps.abs().sum() == 0


def test_the_dpimagebench_diagnostic_records_every_step_whose_noise_it_dropped():
    """A generator that outputs one image (its weights zero) makes K over X ∪ Y singular at
    every step: each step's noise is dropped, and train.jsonl says so, step by step."""
    h = DPKernelHparams(batch_size=20, steps=6, bandwidths="1,2,4,8,16", g_width=4, latent_dim=4, log_every=3,
                        gp_noise="dpimagebench")
    m = DPKernel(h, INFO)
    for p in m.G.parameters():
        torch.nn.init.zeros_(p)
    budget = Budget(5.0)
    ctx = FakeContext(PrivacyLedger(budget, m.plan(budget)))
    g = torch.Generator().manual_seed(10)
    m.fit(Split(torch.rand(200, *SHAPE, generator=g) * 2 - 1, torch.arange(200) % 3), budget, ctx)
    dropped = [r for r in ctx.records if r.get("gp_fallback") == 1]
    assert [r["step"] for r in dropped] == [1, 2, 3, 4, 5, 6]
    assert all(r["bandwidths"] == "1,2,4,8,16" for r in dropped)
    windows = [r for r in ctx.records if "gp_fallback_total" in r]
    assert [(r["gp_fallback_steps"], r["gp_fallback_total"]) for r in windows] == [(3, 3), (3, 6)]
    assert m.fallbacks == 6 and ctx.ledger.taken == {PART: 6}


# ------------------------------------------------------------------ end to end


def test_a_tiny_cli_run_spends_at_most_its_epsilon(cli_runner, results):
    res = cli_runner.invoke(cli, ["run", "--method", "dpkernel", "--preset", "tiny", "--eps", "1", "--device", "cpu",
                                  "--eval", "gen2real_mlp"])
    assert res.exit_code == 0, (res.output, res.exception)
    (run,) = [p for p in results.iterdir() if p.is_dir()]
    priv = json.loads((run / "privacy.json").read_text())
    (part,) = priv["parts"]
    assert part["name"] == PART and part["mechanism"] == "subsampled_gaussian" and part["steps"] == 20
    assert part["sample_rate"] == pytest.approx(32 / 1437)
    assert priv["epsilon"]["rdp"] <= priv["target"]["epsilon"] == 1.0 and priv["caveat"] is None
    lines = [json.loads(x) for x in (run / "train.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [5, 10, 15, 20] and all("mmd2_noisy" in x for x in lines)
    assert (run / "eval.json").is_file()
