"""The gradient sanitiser of GS-WGAN (Chen et al. 2020, §3.2) and DP-GAN-DPAC (Eq. 5, 9).

A backward hook on the *generated image tensor* ``x = G(z, y)``: it receives ∂L/∂x (one
row per generated example), clips every row to L2 norm ``C`` and adds
N(0, (σ_hook·C)²) to every coordinate, then lets the result flow on into G, so G's update
is ``J_G(z)ᵀ · M(∂L/∂x)`` with the data-independent Jacobian ``J_G`` (Eq. 9). Written by
hand: Opacus clips gradients of *parameters*, not of an intermediate tensor.

Contract for the caller (what makes "row i" the gradient of example i):

- the loss is a **sum** of per-example terms, each a function of its own ``x[i]`` only
  (no BatchNorm or other batch coupling in the networks that read ``x``; a mean would
  scale every row by 1/B, and the clip bound would mean something else);
- every use of ``x`` by a data-dependent network goes through the one hooked tensor: the
  hook sees the *sum* of the gradients of all its consumers (PyTorch accumulates them
  before a non-leaf tensor's hooks run), so D's and C's feedback are clipped together;
- backward with ``inputs=`` G's parameters, so the data-dependent networks receive no
  gradient from the sanitised pass.

``scale`` multiplies the sanitised gradient (1/B turns the per-example sum into a mean,
as GS-WGAN's ``dp_conv_hook`` does with its ``CLIP_BOUND / batchsize``). The noise comes
from a seeded ``torch.Generator``. ``calls`` counts how often the hook fired, so a
training loop can assert that every private step was sanitised exactly once.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor


class GradientSanitizer:
    # how far one record can move the clipped batch (privacy.canaries.SanitizerCanaries):
    # every row by 2C (rows clipped one by one)
    clip_geometry = "rows"
    # the canaries' interface (privacy.release.GaussianRelease sets the other choices): as many
    # canaries as asked or an error, scored on the released batch itself
    canaries_fit_to_size = False
    canaries_subtract_clean = False
    # how the canaries are scored (SanitizerCanaries.score_kind): "sum" over releases, or
    # "mixture", each release's likelihood ratio; GS-WGAN sets "mixture" on its instance
    # (a record moves its release only at the ~T/K steps its subset is drawn)
    canaries_score = "sum"

    def __init__(self, max_norm: float, noise_multiplier: float, generator: torch.Generator | None = None,
                 scale: float = 1.0, on_release: Callable[[], None] | None = None,
                 observe: Callable[..., None] | None = None, part: str | None = None):
        if not max_norm > 0:
            raise ValueError("max_norm must be > 0")
        if not noise_multiplier >= 0:
            raise ValueError("noise_multiplier must be ≥ 0")
        self.max_norm = float(max_norm)
        self.noise_multiplier = float(noise_multiplier)  # per-coordinate noise std / C
        self.generator = generator
        self.scale = float(scale)
        # called once per sanitised gradient, as it is released and before anything can use it
        # (the ledger's step count: ``lambda: ctx.spend(part)``), so a loop cannot count it late
        self.on_release = on_release
        # measured telemetry (``RunContext.observe``, privacy.telemetry): the rows' norms and the
        # clipped batch's norm before the noise, a diagnostic outside the guarantee
        self.observe, self.part = observe, part
        self.last_norms: Tensor | None = None
        self.calls = 0
        self.last_clip_fraction = float("nan")  # share of rows whose norm exceeded C (diagnostics)
        self.last_mean_norm = float("nan")
        # white-box audit (privacy.canaries.SanitizerCanaries): added to the clipped batch
        # before the noise, scored on the released batch before ``scale``
        self.canaries = None

    @property
    def canary_shift(self) -> float:
        """A canary's size: one record moves a clipped row (or, for one clip of the whole
        tensor, the tensor) by at most 2C."""
        return 2.0 * self.max_norm

    def clip(self, grad: Tensor) -> Tensor:
        """Rows (examples) scaled to norm ≤ C: g · min(1, C / ‖g‖)."""
        flat = grad.reshape(len(grad), -1)
        norms = flat.norm(dim=1)
        factor = (self.max_norm / norms.clamp_min(1e-12)).clamp(max=1.0)
        self.last_clip_fraction = (norms > self.max_norm).float().mean().item()
        self.last_mean_norm = norms.mean().item()
        self.last_norms = norms
        return (flat * factor[:, None]).reshape(grad.shape)

    def noise(self, like: Tensor) -> Tensor:
        std = self.noise_multiplier * self.max_norm
        if std == 0:
            return torch.zeros_like(like)
        return torch.randn(like.shape, generator=self.generator, device=like.device, dtype=like.dtype) * std

    def __call__(self, grad: Tensor) -> Tensor:
        """M(g) = scale · (clip(g, C) + N(0, σ²C²·I)), row-wise clipping."""
        self.calls += 1
        with torch.no_grad():
            clipped = self.clip(grad)
            if self.observe is not None:  # before the canaries and the noise
                self.observe(self.part, norms=self.last_norms, clip=self.max_norm,
                             clipped_sum_norm=float(clipped.norm()),
                             noise_norm=self.noise_multiplier * self.max_norm * math.sqrt(clipped.numel()))
            if self.canaries is not None:
                clipped = self.canaries.before_noise(clipped)
            released = clipped + self.noise(grad)
            if self.canaries is not None:
                self.canaries.after_noise(released)
            released = released * self.scale
        if self.on_release is not None:
            self.on_release()
        return released

    def attach(self, tensor: Tensor) -> torch.utils.hooks.RemovableHandle:
        """Register on a non-leaf tensor (the generated batch); remove the handle after backward."""
        if not tensor.requires_grad:
            raise ValueError("the tensor to sanitise does not require grad")
        return tensor.register_hook(self)
