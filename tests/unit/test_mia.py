"""GAN-Leaks attacks on generators with known behaviour (no training needed)."""

import dataclasses

import numpy as np
import pytest
import torch

from dpgen_bench import registry
from dpgen_bench.api import DataInfo, EvalInput
from dpgen_bench.data.digits import load_digits_data
from methods.dpgan import DPGAN, DPGANHparams


class Memoriser(DPGAN):
    """A 'generator' that outputs its training images (perfect memorisation) or noise."""

    def __init__(self, info, images=None):
        super().__init__(DPGANHparams(d_width=8, g_width=8, latent_dim=8), info)
        self.images = images

    def sample(self, n, labels, rng):
        if self.images is None:
            return torch.rand(n, *self.info.image_shape, generator=rng) * 2 - 1, labels
        idx = torch.randint(0, len(self.images), (n,), generator=rng)
        return self.images[idx], labels


@pytest.fixture(scope="module")
def member_data():
    return load_digits_data().with_members(32, seed=0)


def _run(data, method, name, **options):
    ev = registry.evaluators.get(name)()
    return ev.evaluate(EvalInput(data, data.train.images[:0], None, method, torch.device("cpu"), 0,
                                 {"mia_k": 50, **options}))


def test_full_black_box_detects_memorisation(member_data):
    info = DataInfo("digits", member_data.image_shape, 10, len(member_data.train))
    # class-conditional memoriser: every label gets the member images of that class only
    mem = Memoriser(info, member_data.train.images)
    mem.conditional = False
    out = _run(member_data, mem, "mia_auc_full_black_box", mia_k=200)
    assert out["metrics"]["mia_auc_full_black_box"] > 0.95
    roc = out["protocol"]["roc"]
    assert roc["fpr"][0] == 0 and roc["tpr"][-1] == 1
    u = out["protocol"]["auc_uncertainty"]  # the recorded AUC's own, and a leak that is significant
    assert u["auc"] == pytest.approx(out["metrics"]["mia_auc_full_black_box"], abs=1e-12)
    assert u["ci"][0] > 0.5 and u["p_value"] < 1e-6
    assert u["null_sd"] == pytest.approx((65 / (12 * 32 * 32)) ** 0.5)  # 32 members, 32 non-members


def test_full_black_box_is_chance_for_a_data_independent_generator(member_data):
    info = DataInfo("digits", member_data.image_shape, 10, len(member_data.train))
    mem = Memoriser(info, None)
    mem.conditional = False
    out = _run(member_data, mem, "mia_auc_full_black_box", mia_k=200)
    auc, u = out["metrics"]["mia_auc_full_black_box"], out["protocol"]["auc_uncertainty"]
    assert 0.3 < auc < 0.7
    assert u["ci"][0] < 0.5 < u["ci"][1] and u["p_value"] > 0.01  # no leak is what it reports


@pytest.mark.parametrize("name", ["mia_auc_partial_black_box", "mia_auc_white_box"])
def test_latent_attacks_run_and_reconstruct(member_data, name):
    info = DataInfo("digits", member_data.image_shape, 10, len(member_data.train))
    m = DPGAN(DPGANHparams(d_width=8, g_width=8, latent_dim=8), info)
    out = _run(member_data, m, name, mia_restarts=2, mia_steps=5)
    assert 0 <= out["metrics"][name] <= 1
    assert out["protocol"]["n_members"] == out["protocol"]["n_nonmembers"] == 32


def test_white_box_lowers_the_distance_and_leaves_weights_alone(member_data):
    from dpgen_bench.attacks import _best_start, white_box_distance

    info = DataInfo("digits", member_data.image_shape, 10, len(member_data.train))
    m = DPGAN(DPGANHparams(d_width=8, g_width=8, latent_dim=8), info)
    before = [p.detach().clone() for p in m.G.parameters()]
    x, y = member_data.train.images[:8], member_data.train.labels[:8]
    z0 = _best_start(m, x, y, 2, torch.Generator().manual_seed(0), 0.001)
    mse0 = ((m.generate(z0, y) - x) ** 2).flatten(1).mean(1)
    mse = white_box_distance(m, x, y, restarts=2, steps=20, lam=0.001, seed=0)
    assert mse.shape == (8,) and mse.mean() < mse0.mean()
    assert all(torch.equal(a, b) and b.requires_grad for a, b in zip(before, m.G.parameters()))


class _Linear(torch.nn.Module):
    """G(z) = A z: the attacks' objective has a closed-form minimiser."""

    conditional, latent_dim = False, 4

    def __init__(self):
        super().__init__()
        self.A = torch.nn.Parameter(torch.randn(16, 4, generator=torch.Generator().manual_seed(3)) * 0.3)

    def generate(self, z, labels):
        return (z @ self.A.T).reshape(-1, 1, 4, 4)


def _gan_leaks_objective(g, z, target, lam):
    """GAN-Leaks' white-box / partial black-box loss (attack_models/wb_dcgan.py, distance
    l2, if_norm_reg): reduce_mean of the per-pixel MSE + LAMBDA3 · reduce_mean (‖z‖² − d)²."""
    mse = ((g.generate(z, None).reshape(len(z), -1) - target) ** 2).mean(1)
    return mse.mean() + lam * (((z ** 2).sum(1) - z.shape[1]) ** 2).mean(), mse


@pytest.mark.parametrize("lam", [0.0, 0.001, 0.05])
def test_latent_attacks_minimise_gan_leaks_objective(lam):
    """Both latent attacks end at a (local) minimum of GAN-Leaks' objective and report the
    per-pixel MSE there. White-box: the objective's gradient vanishes at its z. Partial
    black-box (no gradients): gradient descent from its z gains almost nothing. A prior on
    ‖z‖²/d, a summed error or a missing prior ends elsewhere once lam > 0."""
    from dpgen_bench.attacks import partial_black_box_search, white_box_search

    g = _Linear()
    x = torch.randn(6, 1, 4, 4, generator=torch.Generator().manual_seed(4)) * 0.5
    target = x.reshape(6, -1)

    z, mse = white_box_search(g, x, None, restarts=4, steps=200, lam=lam, seed=0)
    z = z.clone().requires_grad_(True)
    obj, want = _gan_leaks_objective(g, z, target, lam)
    (grad,) = torch.autograd.grad(obj, [z])
    assert grad.norm() < 2e-4 * max(1.0, obj.item())
    torch.testing.assert_close(mse, want.detach())

    z, mse = partial_black_box_search(g, x, None, restarts=4, steps=400, lam=lam, seed=0)
    start, want = _gan_leaks_objective(g, z, target, lam)
    torch.testing.assert_close(mse, want)
    z = z.clone().requires_grad_(True)
    opt = torch.optim.SGD([z], lr=0.5)
    for _ in range(500):
        obj, _ = _gan_leaks_objective(g, z, target, lam)
        opt.zero_grad()
        obj.backward()
        opt.step()
    assert start.item() - obj.item() < 1e-4 * max(1.0, start.item())


def test_without_members_the_attack_is_not_applicable():
    data = load_digits_data()
    info = DataInfo("digits", data.image_shape, 10, len(data.train))
    out = _run(data, Memoriser(info), "mia_auc_full_black_box")
    assert out["metrics"] == {} and "--members" in out["protocol"]["skipped"]
