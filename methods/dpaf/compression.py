"""Gradient compression (GC) of per-sample gradients before clipping (DPAF §6.1
"Canonical Implementation", §6.2.8 "The Impact of Gradient Compression", Table 12;
Deep Gradient Compression, Lin et al. 2018 [27]): each example's gradient keeps only its
top 90% values by magnitude, the rest are set to zero, and only then is it clipped and
summed by DPSGD.

It acts on Opacus' per-sample gradients (``p.grad_sample``), between ``backward`` and the
DP optimiser's step, jointly over the whole per-sample gradient vector of the DP-trained
module (all its parameters: our reading of "the per-sample gradient"). It is a function
of one example's gradient (and of data-independent randomness), so clipping afterwards
still bounds each example's contribution by the clipping norm: GC costs no privacy.

With d values per example, the floor((1 − keep)·d) smallest magnitudes are zeroed:
exactly d − floor((1 − keep)·d) values remain when magnitudes are distinct. For large
n·d the threshold is estimated per example from a random sample of ``sample_size``
positions, as DGC itself does ("sample 0.1% to 1% of the gradients ... to estimate the
threshold", Lin et al. §3.1 / App.); the kept fraction is then ``keep`` ± ~0.5%.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import Tensor

EXACT_LIMIT = 1 << 21  # n·d values up to which the threshold is exact
SAMPLE_SIZE = 4096


def _flat_grad_sample(p: torch.nn.Parameter) -> Tensor | None:
    gs = getattr(p, "grad_sample", None)
    if gs is None:
        return None
    if isinstance(gs, list):  # accumulated over several forward passes
        gs = torch.cat(gs, 0)
        p.grad_sample = gs
    return gs


def top_fraction_mask(flat: Tensor, keep: float) -> Tensor:
    """Boolean mask of the values kept in each row of ``flat`` (n, d), exact."""
    n, d = flat.shape
    drop = int(math.floor((1.0 - keep) * d + 1e-9))
    if drop <= 0 or n == 0:
        return torch.ones_like(flat, dtype=torch.bool)
    mag = flat.abs()
    threshold = mag.kthvalue(drop, dim=1, keepdim=True).values
    return mag > threshold


def _thresholds(rows: list[Tensor], keep: float, exact: bool, sample_size: int,
                generator: torch.Generator | None) -> Tensor | None:
    """Per-example magnitude threshold (n, 1): values ≤ it are dropped."""
    n = rows[0].shape[0]
    d = sum(r.shape[1] for r in rows)
    if exact:
        drop = int(math.floor((1.0 - keep) * d + 1e-9))
        if drop <= 0:
            return None
        return torch.cat(rows, 1).abs().kthvalue(drop, dim=1, keepdim=True).values
    device = rows[0].device
    pos = torch.randint(0, d, (sample_size,), generator=generator, device=generator.device if generator else "cpu")
    pos = pos.to(device).sort().values
    parts, offset = [], 0
    for r in rows:
        size = r.shape[1]
        sel = pos[(pos >= offset) & (pos < offset + size)] - offset
        if len(sel):
            parts.append(r[:, sel].abs())
        offset += size
    sample = torch.cat(parts, 1)
    drop = int(math.floor((1.0 - keep) * sample.shape[1] + 1e-9))
    if drop <= 0:
        return None
    return sample.kthvalue(drop, dim=1, keepdim=True).values


def compress_grad_samples(params: Iterable[torch.nn.Parameter], keep: float = 0.9, *,
                          exact_limit: int = EXACT_LIMIT, sample_size: int = SAMPLE_SIZE,
                          generator: torch.Generator | None = None) -> None:
    """Zero all but the top ``keep`` fraction (by |value|) of every per-sample gradient,
    in place on ``p.grad_sample`` (Opacus), jointly over ``params``."""
    if not 0.0 < keep <= 1.0:
        raise ValueError(f"keep must be in (0, 1], got {keep}")
    if keep >= 1.0:
        return
    samples = [(p, _flat_grad_sample(p)) for p in params if p.requires_grad]
    samples = [(p, g) for p, g in samples if g is not None]
    if not samples:
        return
    n = samples[0][1].shape[0]
    if n == 0:
        return
    rows = [g.reshape(n, -1) for _, g in samples]
    d = sum(r.shape[1] for r in rows)
    thr = _thresholds(rows, keep, n * d <= exact_limit or d <= sample_size, sample_size, generator)
    if thr is None:
        return
    for p, g in samples:
        r = g.reshape(n, -1)
        masked = r * (r.abs() > thr)
        p.grad_sample = masked.reshape(g.shape)
