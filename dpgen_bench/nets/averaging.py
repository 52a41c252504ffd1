"""The generator's (or denoiser's) exponential weight average, one helper for every method
(hparams ``ema_decay`` and ``ema_warmup``): the released network is the average,
post-processing of the private training, so it costs no privacy.

An average started at the initial weights keeps ``β^T`` of them after ``T`` updates (22 % at
β = 0.999, T = 1,500: dpgan's ``long`` preset on mnist before this helper). The default warm-up,
``bias-corrected``, is Adam's bias correction applied to the weights: the average is
``Σ_t (1 − β) β^(T−t) θ_t / (1 − β^T)``, the same weights on the iterates as the plain average
with the initial weights' share spread back over them, so the released network carries none of
its random initialisation. In one recursion: at update ``t`` (1, 2, …) the decay is
``1 − (1 − β) / (1 − β^t)``, 0 at ``t = 1`` (the average becomes the first iterate) and → β.
The other two warm-ups reproduce records made before (``late_hparams``): ``none`` (β from the
first update; dpgan, gan, dpdm) and ``uniform`` (GS-WGAN's ``exp_mov_avg``, ``min(1 − 1/(t+1), β)``
as this project called it, which keeps 1/(t+1) of the initial weights during its running mean).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

EmaWarmup = Literal["bias-corrected", "none", "uniform"]
EMA_WARMUPS: tuple[str, ...] = ("bias-corrected", "none", "uniform")


def settle_warmup(hparams, as_before: str) -> None:
    """Without an average (``ema_decay`` 0) there is nothing to warm up: ``ema_warmup`` takes the
    method's "as before" value, so such a run's identity is the one it had before the setting
    existed. For the frozen Hparams dataclasses, in their ``__post_init__``."""
    if hparams.ema_decay == 0:
        object.__setattr__(hparams, "ema_warmup", as_before)


def average_decay(decay: float, step: int, warmup: str = "bias-corrected") -> float:
    """The share of the average kept at its ``step``-th update (1, 2, …) under ``warmup``."""
    if step < 1:
        raise ValueError("step counts updates from 1")
    if warmup == "bias-corrected":
        return 1 - (1 - decay) / (1 - decay ** step) if decay > 0 else 0.0
    if warmup == "uniform":
        return min(1 - 1 / (step + 1), decay)
    if warmup == "none":
        return decay
    raise ValueError(f"ema_warmup must be one of {', '.join(EMA_WARMUPS)}")


def initial_share(decay: float, steps: int, warmup: str = "bias-corrected") -> float:
    """The initial weights' share of the average after ``steps`` updates (0 for ``bias-corrected``)."""
    share = 1.0
    for t in range(1, steps + 1):
        share *= average_decay(decay, t, warmup)
    return share


@torch.no_grad()
def update_average(average: nn.Module, model: nn.Module, decay: float, step: int,
                   warmup: str = "bias-corrected") -> None:
    """``average ← d·average + (1 − d)·model`` for every parameter, ``d = average_decay(decay,
    step, warmup)``; buffers (BatchNorm's running statistics) are copied, as in EDM's and DPDM's
    EMA. Written as ``mul_`` then ``add_``, as gswgan and dpdm always did; dpgan used ``lerp_``
    before this helper, which rounds differently (~1e-7 relative): the average never feeds back
    into training, so its recorded samples move by rounding only (CHANGELOG)."""
    d = average_decay(decay, step, warmup)
    for pa, p in zip(average.parameters(), model.parameters()):
        pa.mul_(d).add_(p.detach(), alpha=1 - d)
    for ba, b in zip(average.buffers(), model.buffers()):
        ba.copy_(b)
