"""SIN and DPAGG: the DP feature aggregation in the forward phase (DPAF §5.2 "The Design
of DPAGG", Eq. (3); OpenReview §3.2, Eq. (1)–(2); proof of Theorem 5 / App. A.6 Thm 6).

- ``sin``: simplified instance normalisation. Every feature map of every example is
  standardised over its own H×W values, with no learnable centre or scale:
  x̂ = (x − μ) / sqrt(σ² + eps). The paper writes sqrt(σ²) (eps = 0), which is undefined
  for a constant map; with eps > 0 each normalised map has L2 norm p·sqrt(σ²/(σ²+eps)) ≤ p
  (p² = H·W), so the bound below still holds (with equality up to eps).
- ``sensitivity``: Eq. (3), Δ₂ = √m·p for m maps of size p×p (√(m·H·W) for H ≠ W): the
  SIN-normalised feature vector of one example has norm ≤ √m·p, so adding or removing
  one example changes the aggregated (summed) vector by at most √m·p.
- ``dpagg``: the Gaussian mechanism on the aggregate: Σᵢ SIN(fᵢ) + N(0, (σ·√m·p)² I), σ the
  noise multiplier (std / sensitivity, as Opacus and the ledger define it).

Aggregation is a *sum* here (the mechanism); the caller divides by the *expected*
batch size B, a public constant (post-processing), so that the aggregate has the scale
of one example's features and the per-example discriminator D̂ of Algorithm 1 line 16
sees inputs on the same scale as the aggregate (our choice; the paper does not say
whether AGG is a sum or a mean).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

DEFAULT_SIN_EPS = 1e-8


def sin(x: Tensor, eps: float = DEFAULT_SIN_EPS) -> Tensor:
    """Simplified instance normalisation of NCHW feature maps (no affine parameters)."""
    if x.dim() != 4:
        raise ValueError(f"sin expects NCHW feature maps, got shape {tuple(x.shape)}")
    centred = x - x.mean(dim=(2, 3), keepdim=True)
    var = centred.pow(2).mean(dim=(2, 3), keepdim=True)  # biased, as Eq. (1)
    return centred / torch.sqrt(var + eps)


def sensitivity(m: int, h: int, w: int | None = None) -> float:
    """L2 sensitivity of SIN-then-sum for ``m`` maps of size h×w: √m·p with p² = h·w."""
    w = h if w is None else w
    if h * w < 2:
        raise ValueError("SIN needs feature maps with at least 2 values (p×p ≥ 2)")
    return math.sqrt(m * h * w)


def aggregate(features: Tensor) -> Tensor:
    """AGG without noise: the sum over the batch of flattened (SIN-normalised) features."""
    return features.flatten(1).sum(0)


def dpagg(features: Tensor, noise_multiplier: float, sens: float, generator: torch.Generator | None = None) -> Tensor:
    """DPAGG: sum of the SIN-normalised per-example features plus N(0, (σ·Δ)² I).

    ``features`` are the already SIN-normalised maps (n, m, H, W) or flattened (n, d);
    ``sens`` is Δ = √m·p. Works for an empty batch (n = 0): pure noise.
    """
    flat = features.flatten(1)
    total = flat.sum(0)
    noise = torch.randn(total.shape, generator=generator, device=total.device, dtype=total.dtype)
    return total + noise * (noise_multiplier * sens)
