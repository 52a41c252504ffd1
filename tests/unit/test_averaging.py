"""The generator's weight average (dpgen_bench/nets/averaging.py): the bias-corrected warm-up
against its closed form, and every method that keeps an average releasing none of its initial
weights after a few steps with ``ema_decay`` close to 1."""

import math

import pytest
import torch
from torch import nn

from dpgen_bench.api import Budget, DataInfo
from dpgen_bench.config import build_config
from dpgen_bench.data import load_dataset
from dpgen_bench.nets import averaging
from dpgen_bench.nets.averaging import average_decay, initial_share, update_average
from dpgen_bench.privacy import PrivacyLedger
from dpgen_bench import registry
from fake_context import FakeContext


def _run_average(decay, iterates, warmup):
    average, model = nn.Linear(3, 1, bias=False), nn.Linear(3, 1, bias=False)
    with torch.no_grad():
        average.weight.fill_(1000.0)  # the initial weights: any share of them shows
    for t, theta in enumerate(iterates, start=1):
        with torch.no_grad():
            model.weight.copy_(theta)
        update_average(average, model, decay, t, warmup)
    return average.weight.detach()


@pytest.mark.parametrize("decay", [0.5, 0.9, 0.999])
def test_bias_corrected_average_is_the_normalised_exponential_weighting_of_the_iterates(decay):
    g = torch.Generator().manual_seed(0)
    iterates = [torch.randn(1, 3, generator=g, dtype=torch.float64).float() for _ in range(7)]
    got = _run_average(decay, iterates, "bias-corrected")
    T = len(iterates)
    weights = [(1 - decay) * decay ** (T - t) for t in range(1, T + 1)]
    want = sum(w * th for w, th in zip(weights, iterates)) / sum(weights)  # Σ (1−β)β^(T−t) θ_t / (1 − β^T)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_plain_average_keeps_beta_to_the_t_of_the_initial_weights():
    iterates = [torch.zeros(1, 3)] * 5
    got = _run_average(0.9, iterates, "none")
    torch.testing.assert_close(got, torch.full((1, 3), 1000.0 * 0.9 ** 5))
    assert initial_share(0.9, 5, "none") == pytest.approx(0.9 ** 5)
    assert initial_share(0.999, 1500, "none") == pytest.approx(0.223, abs=1e-3)  # dpgan long before the fix


def test_initial_share_by_warmup():
    assert initial_share(0.999, 1, "bias-corrected") == 0.0 and initial_share(0.999, 1500, "bias-corrected") == 0.0
    assert initial_share(0.999, 3, "uniform") == pytest.approx(1 / 4)  # GS-WGAN's as run here: 1/(t+1)
    assert average_decay(0.999, 10 ** 6) == pytest.approx(0.999)  # the warm-up ends at β
    assert average_decay(0.0, 5) == 0.0
    with pytest.raises(ValueError):
        average_decay(0.9, 1, "sideways")
    with pytest.raises(ValueError):
        average_decay(0.9, 0)


def test_buffers_are_copied():
    model, average = nn.BatchNorm1d(3), nn.BatchNorm1d(3)
    with torch.no_grad():
        model.running_mean.normal_()
    update_average(average, model, 0.9, 3)
    assert torch.equal(average.running_mean, model.running_mean)


# method, module whose update_average it calls, the averaged module, the released one, fewer steps
AVERAGED = {
    "dpgan": ("methods.dpgan", lambda m: m.G_ema, lambda m: m.G, dict(steps=6)),
    "gan": ("methods.dpgan", lambda m: m.G_ema, lambda m: m.G, dict(steps=6)),
    "gswgan": ("methods.gswgan", lambda m: m.G_ema, lambda m: m.sampling_generator(), dict(steps=6)),
    "dpac": ("methods.gswgan", lambda m: m.G_ema, lambda m: m.sampling_generator(), dict(steps=6)),
    "dpdm": ("methods.dpdm", lambda m: m.ema, lambda m: m.ema, dict(steps=4)),
    "dpaf": ("methods.dpaf.core", lambda m: m.G_ema, lambda m: m.G, dict(batches=12)),
}


def test_every_method_with_an_average_is_listed():
    """A method whose Hparams have ema_decay keeps an average: it must be checked below."""
    have = {n for n in registry.methods.names() if "ema_decay" in registry.methods.get(n).Hparams.__dataclass_fields__}
    assert have == set(AVERAGED)


@pytest.mark.parametrize("name", sorted(AVERAGED))
def test_released_generator_carries_none_of_its_initial_weights(name, monkeypatch):
    """A few steps at ``ema_decay`` = 0.9999: the released weights are the bias-corrected
    average of the iterates (the closed form), nowhere near the initial weights; with the plain
    average ("none", records before it) they would be 99.9 % the initial ones."""
    import importlib

    module_name, averaged, released, fewer = AVERAGED[name]
    module = importlib.import_module(module_name)
    eps = math.inf if name == "gan" else 10.0
    cfg = build_config(name, "digits", epsilon=eps if math.isfinite(eps) else None, preset="tiny",
                       sets=[f"{k}={v}" for k, v in {**fewer, "ema_decay": 0.9999}.items()])
    assert cfg.hparams["ema_warmup"] == "bias-corrected"
    cls = registry.methods.get(name)
    data = load_dataset("digits", "test")
    m = cls(cls.Hparams(**cfg.hparams), DataInfo(data.name, data.image_shape, data.num_classes, len(data.train)))
    start = [p.detach().clone() for p in averaged(m).parameters()]
    iterates = []
    real = module.update_average

    def spy(average, model, decay, step, warmup="bias-corrected"):
        iterates.append([p.detach().clone() for p in model.parameters()])
        return real(average, model, decay, step, warmup)

    monkeypatch.setattr(module, "update_average", spy)
    budget = Budget(eps)
    m.fit(data.train, budget, FakeContext(PrivacyLedger(budget, m.plan(budget) if m.private else []), seed=0))
    assert len(iterates) >= 3
    T, beta = len(iterates), 0.9999
    weights = [(1 - beta) * beta ** (T - t) for t in range(1, T + 1)]
    moved = 0.0
    for i, (got, init) in enumerate(zip(released(m).parameters(), start)):
        want = sum(w * it[i] for w, it in zip(weights, iterates)) / sum(weights)
        torch.testing.assert_close(got.detach().cpu(), want.cpu(), rtol=1e-4, atol=1e-5)
        moved = max(moved, (got.detach().cpu() - init.cpu()).abs().max().item())
    assert moved > 1e-4  # the iterates left the initial weights, and so did the average
    assert averaging.initial_share(beta, T, "none") > 0.99  # what the plain average would have kept


def test_plain_average_is_the_bias_corrected_one_plus_beta_to_the_t_of_the_initial_weights():
    """Two dpgan fits that differ only in the warm-up train the same iterates (the warm-up is
    post-processing: not in the streams' key) and release ``plain = β^T θ_0 + (1 − β^T) A_T``,
    the identity benchmarks/ema_ab.py uses to get both averages from one training."""
    from methods.dpgan import DPGAN, DPGANHparams

    g = torch.Generator().manual_seed(0)
    shape = (1, 16, 16)
    train_images, train_labels = torch.rand(64, *shape, generator=g) * 2 - 1, torch.randint(0, 10, (64,), generator=g)
    from dpgen_bench.api import Split

    out = {}
    for warmup in ("none", "bias-corrected"):
        torch.manual_seed(1)
        m = DPGAN(DPGANHparams(d_width=8, g_width=8, latent_dim=8, batch_size=8, steps=5, ema_decay=0.9,
                               ema_warmup=warmup), DataInfo("t", shape, 10, 64))
        theta0 = [p.detach().clone() for p in m.G.parameters()]
        budget = Budget(10.0)
        m.fit(Split(train_images, train_labels), budget, FakeContext(PrivacyLedger(budget, m.plan(budget)), seed=0))
        out[warmup] = ([p.detach() for p in m.G.parameters()], [p.detach() for p in m.D.parameters()])
    keep = 0.9 ** 5
    for plain, corrected, init in zip(out["none"][0], out["bias-corrected"][0], theta0):
        torch.testing.assert_close(plain, keep * init + (1 - keep) * corrected, rtol=1e-5, atol=1e-6)
    for a, b in zip(out["none"][1], out["bias-corrected"][1]):
        assert torch.equal(a, b)  # the same training
