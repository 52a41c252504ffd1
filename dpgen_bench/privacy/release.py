"""A one-shot Gaussian release of a sum: ``value + N(0, (σ·Δ)² I)``, where one record moves
``value`` by at most Δ in L2 (add/remove). dpmean's class sums, squares and counts and
dpmerf's mean embedding and count are such releases.

The release counts its own step in the ledger (``ctx.spend``) before it draws the noise,
so a method cannot use a release that was not counted, nor count it late; and it announces
itself to a white-box audit (``RunContext.watch``), which then adds canaries to the exact
sum before the noise and scores them on the released value (``privacy.canaries``): the
method's own noise, std and counting are what the audit observes.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


class GaussianRelease:
    # how far one record can move the released sum (privacy.canaries.SanitizerCanaries): the
    # whole tensor by Δ, i.e. a canary is Δ on one coordinate
    clip_geometry = "whole"
    # a release with fewer coordinates than the audit's --canaries (a count) gets one canary
    # per coordinate instead of an error: the bound is then weaker, not wrong
    canaries_fit_to_size = True
    # canaries are scored on the released value minus the sum without them (the adversary of
    # the DP definition knows the other records)
    canaries_subtract_clean = True

    def __init__(self, ctx, part: str, sensitivity: float, generator: torch.Generator):
        if not sensitivity > 0:
            raise ValueError("sensitivity must be > 0")
        self.part = part
        self.sensitivity = float(sensitivity)
        self.noise_multiplier = float(ctx.part(part).noise_multiplier)
        self.generator = generator
        self._ctx = ctx
        self.calls = 0
        self.canaries = None  # set by privacy.canaries.SanitizerCanaries in a white-box audit
        ctx.watch(part, self)

    @property
    def canary_shift(self) -> float:
        """The size of one record's worst-case change of the sum (a canary's size)."""
        return self.sensitivity

    def noise(self, like: Tensor) -> Tensor:
        """N(0, (σ·Δ)²) in ``like``'s shape, from the release's generator."""
        draw = torch.randn(like.shape, generator=self.generator, device=like.device, dtype=like.dtype)
        return (self.noise_multiplier * self.sensitivity) * draw

    def __call__(self, value: Tensor, record_norms: Tensor | None = None) -> Tensor:
        """``value + N(0, (σΔ)² I)``; ``record_norms``: the norms of the records whose sum
        ``value`` is, where the caller has them (DPAF's DPAGG), for the telemetry alone."""
        self._ctx.spend(self.part)  # counted before the release exists
        self.calls += 1
        observe = getattr(self._ctx, "observe", None)
        if observe is not None:  # measured before the noise: a diagnostic (privacy.telemetry)
            observe(self.part, norms=record_norms, clip=self.sensitivity, clipped_sum_norm=float(value.norm()),
                    noise_norm=self.noise_multiplier * self.sensitivity * math.sqrt(value.numel()))
        if self.canaries is not None:
            value = self.canaries.before_noise(value)
        out = value + self.noise(value)
        if self.canaries is not None:
            self.canaries.after_noise(out)
        return out
