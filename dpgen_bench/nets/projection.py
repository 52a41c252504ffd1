"""GS-WGAN's discriminator (``DiscriminatorDCGAN`` of its released code) and its DCGAN
trunk, shared by ``gswgan`` and DP-GAN-DPAC's auxiliary classifier."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils.parametrizations import spectral_norm


def conv_trunk(channels: int, width: int, sn: bool) -> nn.Sequential:
    """GS-WGAN's DCGAN trunk: three 5×5 stride-2 convolutions (width, 2w, 4w) with ReLU."""
    wrap = spectral_norm if sn else (lambda m: m)
    return nn.Sequential(
        wrap(nn.Conv2d(channels, width, 5, 2, 2)), nn.ReLU(),
        wrap(nn.Conv2d(width, 2 * width, 5, 2, 2)), nn.ReLU(),
        wrap(nn.Conv2d(2 * width, 4 * width, 5, 2, 2)), nn.ReLU(),
        nn.Flatten(),
    )


def trunk_features(image_shape: tuple[int, int, int], width: int) -> int:
    _, h, w = image_shape
    for _ in range(3):
        h, w = (h + 1) // 2, (w + 1) // 2
    return 4 * width * h * w


class ProjectionDiscriminator(nn.Module):
    """GS-WGAN's ``DiscriminatorDCGAN``: DCGAN trunk, linear critic plus a projection
    term ⟨embed(y), φ(x)⟩ (Miyato & Koyama 2018); spectral norm optional. No batch
    coupling (no BatchNorm), so D(x)ᵢ depends on xᵢ only."""

    def __init__(self, image_shape: tuple[int, int, int], num_classes: int, width: int = 64, sn: bool = True):
        super().__init__()
        wrap = spectral_norm if sn else (lambda m: m)
        feats = trunk_features(image_shape, width)
        self.trunk = conv_trunk(image_shape[0], width, sn)
        self.linear = wrap(nn.Linear(feats, 1))
        self.embed = wrap(nn.Embedding(num_classes, feats))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = self.trunk(x)
        return self.linear(h).flatten() + (self.embed(y) * h).sum(1)
