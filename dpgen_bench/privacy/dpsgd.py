"""DPSGD building blocks on top of Opacus (no hand-written clipping or noise).

``make_private`` wraps a module for per-example gradients and its optimizer in Opacus'
``DPOptimizer`` with the noise of a planned privacy part, and counts each of the
optimizer's steps on that part (before the update is applied): a DPSGD step cannot be
taken without being counted, nor beyond the plan. Data sampling is done by the caller with
``poisson_batch`` on cached tensors (Opacus' ``DPDataLoader`` would iterate Python items).
"""

from __future__ import annotations

import warnings

import torch
from opacus.grad_sample.utils import wrap_model
from opacus.optimizers import DPOptimizer
from opacus.validators import ModuleValidator
from torch import nn

from ..api import RunContext

GRAD_SAMPLE_MODES = ("hooks", "functorch", "ew")


def make_private(
    module: nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    ctx: RunContext,
    part: str,
    max_grad_norm: float,
    expected_batch_size: int,
    grad_sample_mode: str = "hooks",
    noise_generator: torch.Generator | None = None,
):
    """Return ``(grad_sample_module, dp_optimizer)`` for the planned part ``part``: noise
    multiplier ``ctx.part(part).noise_multiplier``; every step that adds noise (not one
    skipped by ``signal_skip_step``) calls ``ctx.spend(part)`` before the update.

    The loss must be a mean over the physical batch: Opacus rescales per-example
    gradients by the batch length, and the optimizer divides the noisy sum by
    ``expected_batch_size``: ``(Σ clip(g_i, C) + N(0, σ²C²)) / expected_batch_size``.
    """
    noise_multiplier = ctx.part(part).noise_multiplier
    if grad_sample_mode not in GRAD_SAMPLE_MODES:
        raise ValueError(f"grad_sample_mode must be one of {GRAD_SAMPLE_MODES}")
    errors = ModuleValidator.validate(module, strict=False)
    if errors:  # e.g. BatchNorm: fail early and clearly
        raise ValueError(f"module is not DPSGD-compatible: {errors}")
    # Opacus' hooks fire with respect to module outputs when the input needs no grad
    # (real images): expected and harmless; the secure-RNG note is about secure_mode.
    warnings.filterwarnings("ignore", message="Full backward hook is firing")
    warnings.filterwarnings("ignore", message=".*Secure RNG turned off.*")
    gsm = wrap_model(module, grad_sample_mode, batch_first=True, loss_reduction="mean")
    dp_opt = DPOptimizer(
        optimizer,
        noise_multiplier=noise_multiplier,
        max_grad_norm=max_grad_norm,
        expected_batch_size=expected_batch_size,
        loss_reduction="mean",
        generator=noise_generator,
    )
    dp_opt.attach_step_hook(lambda _opt: ctx.spend(part))
    return gsm, dp_opt


def poisson_batch(n: int, sample_rate: float, generator: torch.Generator, device: torch.device) -> torch.Tensor:
    """Indices of a Poisson-sampled batch: each of the ``n`` examples independently with
    probability ``sample_rate`` (the sampling the RDP/PRV analysis assumes)."""
    mask = torch.rand(n, generator=generator, device=device) < sample_rate
    return mask.nonzero(as_tuple=True)[0]
