"""The generator's (or denoiser's) exponential weight average, one helper for every method
(hparam ``ema_decay``): the released network is the average, post-processing of the
private training, so it costs no privacy."""

from __future__ import annotations

import torch
from torch import nn


@torch.no_grad()
def update_average(average: nn.Module, model: nn.Module, decay: float) -> None:
    """``average ← decay·average + (1 − decay)·model`` for every parameter; buffers
    (BatchNorm's running statistics) are copied, as in EDM's and DPDM's EMA. Written as
    ``mul_`` then ``add_``, as gswgan and dpdm always did; dpgan used ``lerp_`` before this
    helper, which rounds differently (~1e-7 relative): the average never feeds back into
    training, so its recorded samples move by rounding only (CHANGELOG)."""
    for pa, p in zip(average.parameters(), model.parameters()):
        pa.mul_(decay).add_(p.detach(), alpha=1 - decay)
    for ba, b in zip(average.buffers(), model.buffers()):
        ba.copy_(b)
