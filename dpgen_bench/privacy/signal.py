"""How loud one step's noise is against the signal it hides, known before training.

A DP-SGD step releases ``(Σᵢ clip(gᵢ, C) + N(0, σ²C² I_d)) / B``: the clipped mean has
norm ≤ C, the noise's norm is ≈ σ·C·√d / B. Their ratio σ·√d / B depends on the plan
alone (σ, the d noised coordinates, the expected batch B), not on ε directly: a plan with
a ratio far above 1 adds, every step, a vector many times longer than anything the data can
say, and the model can only learn what survives averaging over many steps. It is the number
that told, before any run, that a narrow batch on a small N is noise-bound at every ε.

Each method states its own ratio (``Method.noise_to_signal``): DP-SGD parts use
:func:`dpsgd_noise_to_signal`; a one-shot release of a sum of n records, each moving it by at
most Δ, gives noise σ·Δ·√d on a mean of n, so σ·√d / n (:func:`release_noise_to_signal`);
a sanitiser that noises each record's row (GS-WGAN) or a whole clipped matrix (DP-Sinkhorn)
gives σ_row·√d (the row's noise against its clip bound) or σ_hook·√(B·d) (the matrix's
noise against the one clip bound of the whole matrix).
"""

from __future__ import annotations

import math

import torch


def parameter_count(*modules: torch.nn.Module) -> int:
    """Trainable parameters of ``modules`` (the coordinates DP-SGD noises)."""
    return sum(p.numel() for m in modules for p in m.parameters() if p.requires_grad)


def dpsgd_noise_to_signal(noise_multiplier: float, dim: int, expected_batch: float) -> float:
    """σ·√d / B: the noise's norm on a DP-SGD step's mean update over the clip bound."""
    return float(noise_multiplier) * math.sqrt(dim) / float(expected_batch)


def release_noise_to_signal(noise_multiplier: float, dim: int, records: float) -> float:
    """σ·√d / n: a Gaussian release of a sum of n records (each moving it by ≤ Δ in d
    coordinates), read as their mean: noise σΔ√d / n against a record's Δ."""
    return float(noise_multiplier) * math.sqrt(dim) / max(float(records), 1.0)
