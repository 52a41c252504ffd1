"""DP-NTK against the math: the per-example NTK features from ``torch.func`` equal a
per-example autograd loop and the closed form of the output layer's gradient, each has unit
norm, so one record moves the released sum by exactly 1 (two neighbouring datasets, through
the release's own code with the noise off); the releases' noise std is σ·Δ; each release is
counted before its noise exists; the chunked batch loss has the full batch's gradient; and
``bench run --method dpntk --preset tiny`` end to end."""

import json
import math

import pytest
import torch
import torch.nn.functional as F
from fake_context import FakeContext

from dpgen_bench.api import Budget, DataInfo, Split
from dpgen_bench.privacy import PrivacyLedger, calibrate_noise, compose_rdp, release_noise_to_signal
from dpgen_bench.privacy.release import GaussianRelease
from methods.dpntk import (COUNT, SUM, DPNTK, DPNTKHparams, NTKNet, _init_ntk, class_embedding, ntk_features,
                           per_example_grads)

SHAPE = (1, 16, 16)
K = 3
INFO = DataInfo("toy", SHAPE, K, 30)


def _net(widths=(6,), seed=0):
    net = NTKNet(math.prod(SHAPE), widths, K, device="meta")
    return net, _init_ntk(net, torch.Generator().manual_seed(seed))


def _data(n=30, seed=0):
    g = torch.Generator().manual_seed(seed)
    return Split(torch.rand(n, *SHAPE, generator=g) * 2 - 1, torch.arange(K).repeat(n // K))


def _ctx(m, budget=Budget(2.0), seed=0, noise_off=False):
    ledger = PrivacyLedger(budget, m.plan(budget))
    if noise_off:
        ledger.switch_noise_off()
    return FakeContext(ledger, seed=seed)


@pytest.mark.parametrize("widths", [(6,), (5, 4)])
def test_vmap_features_equal_a_per_example_autograd_loop_and_have_unit_norm(widths):
    net, params = _net(widths)
    x = torch.rand(5, *SHAPE, generator=torch.Generator().manual_seed(1))
    phi = ntk_features(net, params, x)
    ref = NTKNet(math.prod(SHAPE), widths, K)
    with torch.no_grad():
        for name, p in ref.named_parameters():
            p.copy_(params[name])
    for i in range(len(x)):
        g = torch.autograd.grad(ref(x[i]).sum(), list(ref.parameters()))
        flat = torch.cat([t.flatten() for t in g])
        assert torch.allclose(phi[i], flat / flat.norm(), atol=1e-6)
    assert phi.shape == (5, sum(p.numel() for p in params.values()))
    assert torch.allclose(phi.norm(dim=1), torch.ones(5), atol=1e-6)


def test_the_output_layer_block_is_its_closed_form():
    """f = Σ_c (W₂ h + b₂)_c: ∂f/∂W₂[c] = h (the LayerNorm's output) for every c, ∂f/∂b₂ = 1,
    and ∂f/∂b₁ = (Jᵀ_LN Σ_c W₂[c]) ⊙ 1[W₁x + b₁ > 0], ∂f/∂W₁ = ∂f/∂b₁ ⊗ x."""
    net, p = _net((6,))
    x = torch.rand(4, *SHAPE, generator=torch.Generator().manual_seed(2))
    g = per_example_grads(net, p, x)
    pre = x.flatten(1) @ p["layers.0.weight"].T + p["layers.0.bias"]
    h = F.layer_norm(pre.relu(), (6,))
    assert torch.allclose(g["layers.1.weight"], h[:, None, :].expand(4, K, 6), atol=1e-6)
    assert torch.equal(g["layers.1.bias"], torch.ones(4, K))
    a = pre.relu().detach().requires_grad_(True)
    (F.layer_norm(a, (6,)) @ p["layers.1.weight"].sum(0)).sum().backward()
    db1 = a.grad * (pre > 0)
    assert torch.allclose(g["layers.0.bias"], db1, atol=1e-5)
    assert torch.allclose(g["layers.0.weight"], db1[:, :, None] * x.flatten(1)[:, None, :], atol=1e-5)


def test_class_embedding_is_the_one_hot_outer_product_of_the_features():
    net, p = _net((6,))
    x = torch.rand(9, *SHAPE, generator=torch.Generator().manual_seed(3))
    y = torch.tensor([0, 2, 2, 1, 0, 0, 1, 2, 0])
    want = F.one_hot(y, K).float().T @ ntk_features(net, p, x)
    assert torch.allclose(class_embedding(net, p, x, y, K), want, atol=1e-6)


def test_feature_dimension_is_the_parameter_count():
    d = math.prod(SHAPE)
    assert DPNTK(DPNTKHparams(widths="6"), INFO).feature_dim == (d + 1) * 6 + (6 + 1) * K
    assert DPNTK(DPNTKHparams(widths="5,4"), INFO).feature_dim == (d + 1) * 5 + (5 + 1) * 4 + (4 + 1) * K
    mnist = DPNTK(DPNTKHparams(), DataInfo("mnist", (1, 28, 28), 10, 60_000))
    assert mnist.feature_dim == 636_010  # the authors' "Feature Length" at width 800


def test_one_record_moves_the_noiseless_released_sum_by_exactly_one():
    """Neighbours D and D minus its last record, through ``release`` with the noise off (the
    same θ: one seed): the embedding sum moves by 1 in L2, in the record's class row only,
    and the count by 1."""
    train = _data(30)
    fewer = Split(train.images[:-1], train.labels[:-1])
    h = DPNTKHparams(widths="6", chunk=4)  # several chunks
    s_all, n_all = DPNTK(h, INFO).release(train, _ctx(DPNTK(h, INFO), noise_off=True))
    s_less, n_less = DPNTK(h, INFO).release(fewer, _ctx(DPNTK(h, INFO), noise_off=True))
    diff = s_all - s_less
    assert diff.norm().item() == pytest.approx(1.0, abs=1e-5)
    row = train.labels[-1].item()
    assert diff[row].norm().item() == pytest.approx(1.0, abs=1e-5)
    assert diff[[c for c in range(K) if c != row]].abs().max().item() < 1e-6
    assert (n_all - n_less).item() == 1.0


def test_the_releases_have_std_sigma_times_sensitivity_around_the_true_values():
    h = DPNTKHparams(widths="6")
    budget, train = Budget(2.0), _data()
    s_part, c_part = DPNTK(h, INFO).plan(budget)
    errors, counts = [], []
    for seed in range(100):
        m = DPNTK(h, INFO)
        s_hat, n_hat = m.release(train, _ctx(m, budget, seed=seed))
        true_sum = class_embedding(m.ntk, m.ntk_params, (train.images + 1) / 2, train.labels, K)  # this run's θ
        errors.append((s_hat - true_sum).flatten())
        counts.append(n_hat.item() - len(train))
    errors = torch.cat(errors)  # 100 × K × D ≈ 4.7e5 draws
    assert errors.std().item() == pytest.approx(s_part.noise_multiplier * 1.0, rel=0.02)
    assert abs(errors.mean().item()) < 0.02 * s_part.noise_multiplier
    assert torch.tensor(counts).std().item() == pytest.approx(c_part.noise_multiplier * 1.0, rel=0.2)


def test_each_release_is_counted_before_its_noise_is_drawn(monkeypatch):
    m = DPNTK(DPNTKHparams(widths="6"), INFO)
    ctx = _ctx(m)
    seen = []
    real = GaussianRelease.noise
    monkeypatch.setattr(GaussianRelease, "noise",
                        lambda self, like: seen.append((self.part, dict(ctx.ledger.taken))) or real(self, like))
    m.release(_data(), ctx)
    assert seen == [(SUM, {SUM: 1, COUNT: 0}), (COUNT, {SUM: 1, COUNT: 1})]


@pytest.mark.parametrize("eps", [0.5, 1.0, 10.0])
def test_two_releases_compose_to_the_target(eps):
    parts = DPNTK(DPNTKHparams(widths="6"), INFO).plan(Budget(eps))
    assert [p.name for p in parts] == [SUM, COUNT] and all(p.steps == 1 and p.sample_rate == 1 for p in parts)
    sigma = calibrate_noise(epsilon=eps, delta=1e-5, sample_rate=1.0, steps=1)
    assert sum(1 / p.noise_multiplier ** 2 for p in parts) == pytest.approx(1 / sigma ** 2, rel=1e-6)
    assert 0.99 * eps <= compose_rdp(parts, 1e-5) <= eps


def test_noise_to_signal_reads_a_class_row_as_the_mean_of_its_records():
    m = DPNTK(DPNTKHparams(widths="6"), INFO)
    s_part, c_part = m.plan(Budget(1.0))
    assert m.noise_to_signal(s_part) == pytest.approx(release_noise_to_signal(s_part.noise_multiplier,
                                                                              m.feature_dim, 30 / K))
    assert m.noise_to_signal(c_part) == pytest.approx(c_part.noise_multiplier / 30)


def test_a_chunked_batch_has_the_gradient_of_the_whole_batch():
    m = DPNTK(DPNTKHparams(widths="6", g_width=4, latent_dim=3), INFO)
    m.ntk_params = _init_ntk(m.ntk, torch.Generator().manual_seed(0))
    target = torch.randn(K, sum(p.numel() for p in m.ntk_params.values())) * 0.05
    z, y = torch.randn(10, 3), torch.tensor([0, 1, 2, 0, 1, 2, 0, 0, 1, 2])
    grads, losses = [], []
    for chunk in (100, 3):
        m.G.zero_grad()
        losses.append(m.batch_loss((m.G(z, y) + 1) / 2, y, target, chunk).item())
        grads.append(torch.cat([p.grad.flatten() for p in m.G.parameters()]))
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)
    assert torch.allclose(grads[0], grads[1], rtol=1e-4, atol=1e-7) and grads[0].norm() > 0


def test_fit_counts_both_releases_follows_the_authors_schedule_and_round_trips():
    h = DPNTKHparams(widths="6", steps=6, batch_size=12, g_width=4, log_every=1, lr=0.01, decay_every=4)
    m = DPNTK(h, INFO)
    ctx = _ctx(m, Budget(5.0))
    m.fit(_data(), Budget(5.0), ctx)
    assert ctx.ledger.taken == {SUM: 1, COUNT: 1}
    # StepLR stepped after steps 0 and 4 (t % 4 == 0), as the authors' loop: lr 0.01, then ×0.9
    assert [r["lr"] for r in ctx.records] == pytest.approx([0.01, 0.009, 0.009, 0.009, 0.009, 0.0081])
    assert all(math.isfinite(r["mmd2"]) for r in ctx.records) and len(ctx.records) == 6
    labels = torch.tensor([0, 1, 2, 0, 1, 2])
    x, y = m.sample(6, labels, torch.Generator().manual_seed(0))
    assert x.shape == (6, *SHAPE) and x.min() >= -1 and x.max() <= 1 and torch.equal(y, labels)
    other = DPNTK(h, INFO)
    other.load_state_dict(m.state_dict())
    assert torch.equal(other.sample(6, labels, torch.Generator().manual_seed(0))[0], x)
    assert set(other.ntk_params) == {n for n, _ in m.ntk.named_parameters()}


@pytest.mark.parametrize("bad", [dict(widths="0"), dict(widths="8,8,8"), dict(widths="a"), dict(weights="1"),
                                 dict(weights="1,0"), dict(steps=0), dict(chunk=-1), dict(lr_decay=0.0)])
def test_bad_settings_are_refused(bad):
    with pytest.raises(ValueError):
        DPNTKHparams(**bad)


def test_bench_run_tiny_end_to_end(cli_runner, results):
    from dpgen_bench.cli import cli

    res = cli_runner.invoke(cli, ["run", "--method", "dpntk", "--preset", "tiny", "--eps", "1", "--eval",
                                  "gen2real_mlp", "--device", "cpu"])
    assert res.exit_code == 0, (res.output, res.exception)
    (run_dir,) = results.iterdir()
    priv = json.loads((run_dir / "privacy.json").read_text())
    assert [p["name"] for p in priv["parts"]] == [SUM, COUNT] and all(p["steps"] == 1 for p in priv["parts"])
    assert priv["private"] and priv["caveat"] is None and priv["epsilon"]["rdp"] <= 1.0
    lines = [json.loads(x) for x in (run_dir / "train.jsonl").read_text().splitlines()]
    assert lines and all("mmd2" in x for x in lines)
    state = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    assert set(state) == {"G", "ntk"} and state["ntk"]["layers.0.weight"].shape == (8, 16 * 16)
    assert "gen2real_mlp" in json.loads((run_dir / "eval.json").read_text())["metrics"]
