"""GAN-Leaks reconstruction distances (Chen, Yu, Zhang, Fritz, *GAN-Leaks: A Taxonomy of
Membership Inference Attacks against Generative Models*, CCS 2020): how close a generator
comes to a query image, from what each adversary sees. Shared by the membership-inference
evaluators (``evaluators.mia``: ROC AUC over members / non-members) and ``bench audit``
(``dpgen_bench.audit_run``: canary scores for the one-run bound), so the harness never
imports an evaluator.

- ``full_black_box_distance``: k generated samples only; L2 distance to the nearest (for a
  conditional generator, k samples with the query's label);
- ``partial_black_box_distance``: latent codes in, images out, no gradients: a (1+λ)
  evolution strategy on z from the best of R random starts (GAN-Leaks uses Powell's method;
  the ES is its batched equivalent);
- ``white_box_distance``: L-BFGS on ‖G(z, y) − x‖² + λ (‖z‖²/d − 1)² from the best of R
  random starts (GAN-Leaks' white-box attack).
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


def _best_start(method, x, y, restarts: int, rng) -> torch.Tensor:
    d = method.latent_dim
    best_z, best = None, torch.full((len(x),), float("inf"))
    with torch.no_grad():
        for _ in range(restarts):
            z = torch.randn(len(x), d, generator=rng)
            dist = (_flat(method.generate(z, _labels(method, y))) - _flat(x)).norm(dim=1)
            better = dist < best
            best = torch.where(better, dist, best)
            best_z = z if best_z is None else torch.where(better[:, None], z, best_z)
    return best_z


@torch.no_grad()
def partial_black_box_distance(method: Method, x, y, *, restarts: int, steps: int, seed: int,
                               population: int = 16) -> torch.Tensor:
    """(1+λ)-ES on z with forward passes only; step size adapts by the 1/5th rule."""
    rng = torch.Generator().manual_seed(seed)
    z = _best_start(method, x, y, restarts, rng)
    target = _flat(x)
    best = (_flat(method.generate(z, _labels(method, y))) - target).norm(dim=1)
    sigma = torch.full((len(x),), 0.5)
    yl = _labels(method, y)
    for _ in range(steps):
        cand = z[:, None, :] + sigma[:, None, None] * torch.randn(len(x), population, z.shape[1], generator=rng)
        flat_c = cand.reshape(-1, z.shape[1])
        lab = yl.repeat_interleave(population) if yl is not None else None
        dist = (_flat(method.generate(flat_c, lab)).reshape(len(x), population, -1) - target[:, None]).norm(dim=2)
        d_min, idx = dist.min(1)
        improved = d_min < best
        z = torch.where(improved[:, None], cand[torch.arange(len(x)), idx], z)
        best = torch.where(improved, d_min, best)
        sigma = torch.where(improved, sigma * 1.5, sigma * 0.85).clamp(1e-3, 2.0)
    return best


def white_box_distance(method: Method, x, y, *, restarts: int, steps: int, lam: float, seed: int) -> torch.Tensor:
    rng = torch.Generator().manual_seed(seed)
    z = _best_start(method, x, y, restarts, rng).clone().requires_grad_(True)
    target, d = _flat(x), method.latent_dim
    yl = _labels(method, y)
    opt = torch.optim.LBFGS([z], lr=0.5, max_iter=steps, line_search_fn="strong_wolfe")

    def closure():
        rec = ((_flat(method.generate(z, yl)) - target) ** 2).sum(1)
        prior = lam * ((z ** 2).sum(1) / d - 1) ** 2
        loss = (rec + prior).sum()
        (z.grad,) = torch.autograd.grad(loss, [z])  # gradients w.r.t. z only; weights untouched
        return loss.detach()

    opt.step(closure)
    with torch.no_grad():
        return (_flat(method.generate(z, yl)) - target).norm(dim=1)
