"""GAN-Leaks reconstruction distances (Chen, Yu, Zhang, Fritz, *GAN-Leaks: A Taxonomy of
Membership Inference Attacks against Generative Models*, CCS 2020): how close a generator
comes to a query image, from what each adversary sees. Shared by the membership-inference
evaluators (``evaluators.mia``: ROC AUC over members / non-members) and ``bench audit``
(``dpgen_bench.audit_run``: canary scores for the one-run bound), so the harness never
imports an evaluator.

- ``full_black_box_distance``: k generated samples only; L2 distance to the nearest (for a
  conditional generator, k samples with the query's label), as GAN-Leaks' ``fbb.py``;
- ``partial_black_box_distance``: latent codes in, images out, no gradients;
- ``white_box_distance``: gradients through G: L-BFGS on z.

The two latent attacks minimise GAN-Leaks' objective (``attack_models/wb_*.py``,
``pbb_*.py``, distance ``l2``): the mean over the batch of each query's per-pixel mean
squared error, plus ``lam`` times the mean of (‖z‖² − d)², the prior that keeps z where
G was trained (their LAMBDA3 = 0.001, pixels in [−1, 1] as theirs). Each returns the
query's per-pixel mean squared error at the end (their ``vec_loss``), which the calibrated
evaluators subtract as theirs do. Departures: no LPIPS term (it needs downloaded VGG
weights); the start is the best of R random z by the objective (theirs: z = 0, one random
z, or the full black-box attack's nearest neighbour's z); partial black-box is a batched
(1+λ) evolution strategy instead of scipy's Powell; L-BFGS runs ``steps`` iterations
(theirs: up to 1,000 function evaluations).
"""

from __future__ import annotations

import torch

from .api import Method


def _flat(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(len(x), -1)


@torch.no_grad()
def full_black_box_distance(method: Method, x: torch.Tensor, y: torch.Tensor, k: int, num_classes: int,
                            seed: int) -> torch.Tensor:
    rng = torch.Generator().manual_seed(seed)
    out = torch.empty(len(x))
    if method.conditional:
        for c in range(num_classes):
            sel = (y == c).nonzero(as_tuple=True)[0]
            if len(sel) == 0:
                continue
            gen, _ = method.sample(k, torch.full((k,), c, dtype=torch.long), rng)
            out[sel] = torch.cdist(_flat(x[sel]), _flat(gen)).min(1).values
    else:
        gen, _ = method.sample(k * num_classes, None, rng)
        out[:] = torch.cdist(_flat(x), _flat(gen)).min(1).values
    return out


def _labels(method: Method, y: torch.Tensor):
    return y if method.conditional else None


def _mse(method: Method, z: torch.Tensor, y, target: torch.Tensor) -> torch.Tensor:
    """Each query's per-pixel mean squared reconstruction error (GAN-Leaks' ``vec_loss``)."""
    return ((_flat(method.generate(z, y)) - target) ** 2).mean(1)


def _norm_penalty(z: torch.Tensor) -> torch.Tensor:
    """GAN-Leaks' latent prior (‖z‖² − d)², per query."""
    return ((z ** 2).sum(1) - z.shape[1]) ** 2


def _best_start(method, x, y, restarts: int, rng, lam: float) -> torch.Tensor:
    """The best of ``restarts`` random z per query by the attack's objective."""
    d = method.latent_dim
    target = _flat(x)
    best_z, best = None, torch.full((len(x),), float("inf"))
    with torch.no_grad():
        for _ in range(restarts):
            z = torch.randn(len(x), d, generator=rng)
            obj = _mse(method, z, _labels(method, y), target) + lam * _norm_penalty(z)
            better = obj < best
            best = torch.where(better, obj, best)
            best_z = z if best_z is None else torch.where(better[:, None], z, best_z)
    return best_z


@torch.no_grad()
def partial_black_box_distance(method: Method, x, y, *, restarts: int, steps: int, lam: float, seed: int,
                               population: int = 16) -> torch.Tensor:
    """(1+λ)-ES on z with forward passes only (step size by the 1/5th rule), minimising
    MSE + lam·(‖z‖² − d)²; returns each query's MSE at its best z."""
    return partial_black_box_search(method, x, y, restarts=restarts, steps=steps, lam=lam, seed=seed,
                                    population=population)[1]


@torch.no_grad()
def partial_black_box_search(method: Method, x, y, *, restarts: int, steps: int, lam: float, seed: int,
                             population: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """``partial_black_box_distance``'s best z per query, and its MSE."""
    rng = torch.Generator().manual_seed(seed)
    z = _best_start(method, x, y, restarts, rng, lam)
    target, yl = _flat(x), _labels(method, y)
    mse = _mse(method, z, yl, target)
    best = mse + lam * _norm_penalty(z)
    sigma = torch.full((len(x),), 0.5)
    for _ in range(steps):
        cand = z[:, None, :] + sigma[:, None, None] * torch.randn(len(x), population, z.shape[1], generator=rng)
        flat_c = cand.reshape(-1, z.shape[1])
        lab = yl.repeat_interleave(population) if yl is not None else None
        out = _flat(method.generate(flat_c, lab)).reshape(len(x), population, -1)
        c_mse = ((out - target[:, None]) ** 2).mean(2)  # broadcast: no copy of the targets per candidate
        obj = c_mse + lam * _norm_penalty(flat_c).reshape(len(x), population)
        o_min, idx = obj.min(1)
        improved = o_min < best
        rows = torch.arange(len(x))
        z = torch.where(improved[:, None], cand[rows, idx], z)
        mse = torch.where(improved, c_mse[rows, idx], mse)
        best = torch.where(improved, o_min, best)
        sigma = torch.where(improved, sigma * 1.5, sigma * 0.85).clamp(1e-3, 2.0)
    return z, mse


def white_box_distance(method: Method, x, y, *, restarts: int, steps: int, lam: float, seed: int) -> torch.Tensor:
    """L-BFGS on z of mean(MSE) + lam·mean((‖z‖² − d)²) (GAN-Leaks' white-box objective);
    returns each query's MSE at the end. G's weights receive no gradient."""
    return white_box_search(method, x, y, restarts=restarts, steps=steps, lam=lam, seed=seed)[1]


def white_box_search(method: Method, x, y, *, restarts: int, steps: int, lam: float,
                     seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``white_box_distance``'s final z per query, and its MSE."""
    rng = torch.Generator().manual_seed(seed)
    z = _best_start(method, x, y, restarts, rng, lam).clone().requires_grad_(True)
    target, yl = _flat(x), _labels(method, y)
    opt = torch.optim.LBFGS([z], lr=0.5, max_iter=steps, line_search_fn="strong_wolfe")

    def closure():
        loss = _mse(method, z, yl, target).mean() + lam * _norm_penalty(z).mean()
        (z.grad,) = torch.autograd.grad(loss, [z])  # gradients w.r.t. z only; weights untouched
        return loss.detach()

    opt.step(closure)
    z = z.detach()
    with torch.no_grad():
        return z, _mse(method, z, yl, target)
