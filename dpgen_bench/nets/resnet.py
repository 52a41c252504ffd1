"""A BigGAN-style conditional ResNet generator (Brock et al. 2019), as used by GS-WGAN
(``source/models.py``: ``GeneratorResNet``) and DP-GAN-DPAC (§5.1, "ResNet (adapted
from BigGAN) for the generator").

    [z, e(y)] → linear → base×base×ch₀ → n_up × GBlock(↑2) → norm → ReLU → conv3×3 → tanh

- ``e(y)`` is a shared class embedding (BigGAN); every normalisation in the generator is
  class-conditional: ``(1 + γ(e)) · norm(h) + b(e)`` with linear γ, b (BigGAN's
  conditional BN).
- The normalisation itself is *pixel norm* (each feature vector scaled to unit RMS), as
  in GS-WGAN's ResNet generator, not BatchNorm: it has no batch statistics, so each
  generated image depends on its own (z, y) only, and sampling or ``generate(z)`` in eval
  mode computes exactly the function that was trained.
- GBlock (BigGAN): cnorm → ReLU → up×2 → conv3×3 → cnorm → ReLU → conv3×3, plus the skip
  conv1×1(up×2(x)); channels halve per block (BigGAN), from ``width · 2^(n_up-1)`` down
  to ``width`` (GS-WGAN keeps 4·width throughout).
- Spectral normalisation on every conv / linear (BigGAN and GS-WGAN), optional.

Resolutions: the base grid is found by halving the image size while it stays even and
≥ 4 after halving: 16 → 4 (2 blocks, digits), 28 → 7 (2 blocks, MNIST; GS-WGAN instead
goes 4 → 32 and crops to 28), 32 → 4 (3 blocks, CelebA-32).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.parametrizations import spectral_norm as _sn


def _layout(size: int) -> tuple[int, int]:
    """(base resolution, number of ×2 upsampling blocks) for an image size."""
    base, n_up = size, 0
    while base % 2 == 0 and base // 2 >= 4:
        base //= 2
        n_up += 1
    if n_up == 0:
        raise ValueError(f"ResNet generator: image size {size} cannot be reached by ×2 upsampling from ≥ 4")
    return base, n_up


def pixel_norm(x: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(dim=1, keepdim=True) + eps)


class ConditionalPixelNorm(nn.Module):
    """(1 + γ(e)) · pixel_norm(h) + b(e): BigGAN's class-conditional gain and bias."""

    def __init__(self, channels: int, cond_dim: int):
        super().__init__()
        self.gain = nn.Linear(cond_dim, channels, bias=False)
        self.bias = nn.Linear(cond_dim, channels, bias=False)

    def forward(self, h: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        g = 1 + self.gain(e)[:, :, None, None]
        b = self.bias(e)[:, :, None, None]
        return pixel_norm(h) * g + b


class GBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, cond_dim: int, sn: bool):
        super().__init__()
        wrap = _sn if sn else (lambda m: m)
        self.norm1 = ConditionalPixelNorm(c_in, cond_dim)
        self.conv1 = wrap(nn.Conv2d(c_in, c_out, 3, 1, 1))
        self.norm2 = ConditionalPixelNorm(c_out, cond_dim)
        self.conv2 = wrap(nn.Conv2d(c_out, c_out, 3, 1, 1))
        self.skip = wrap(nn.Conv2d(c_in, c_out, 1, 1, 0))

    def forward(self, x: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.norm1(x, e))
        h = F.interpolate(h, scale_factor=2, mode="nearest")
        h = self.conv1(h)
        h = self.conv2(F.relu(self.norm2(h, e)))
        return h + self.skip(F.interpolate(x, scale_factor=2, mode="nearest"))


class ConditionalResNetGenerator(nn.Module):
    """BigGAN-style conditional generator; output in [-1, 1] at ``image_shape``."""

    def __init__(self, image_shape: tuple[int, int, int], num_classes: int, width: int = 64, latent_dim: int = 10,
                 embed_dim: int = 32, spectral_norm: bool = True):
        super().__init__()
        channels, size, size_w = image_shape
        if size != size_w:
            raise ValueError("ResNet generator: square images only")
        self.base, self.n_up = _layout(size)
        self.num_classes = num_classes
        self.latent_dim = latent_dim
        wrap = _sn if spectral_norm else (lambda m: m)
        chans = [width * 2 ** (self.n_up - 1 - i) for i in range(self.n_up)]  # output channels per block
        self.c0 = chans[0]
        self.embed = nn.Embedding(num_classes, embed_dim)
        self.linear = wrap(nn.Linear(latent_dim + embed_dim, self.c0 * self.base * self.base))
        blocks, c_in = [], self.c0
        for c_out in chans:
            blocks.append(GBlock(c_in, c_out, embed_dim, spectral_norm))
            c_in = c_out
        self.blocks = nn.ModuleList(blocks)
        self.out_norm = ConditionalPixelNorm(c_in, embed_dim)
        self.out = wrap(nn.Conv2d(c_in, channels, 3, 1, 1))

    def forward(self, z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        e = self.embed(y)
        h = self.linear(torch.cat([z, e], 1)).view(len(z), self.c0, self.base, self.base)
        for block in self.blocks:
            h = block(h, e)
        return torch.tanh(self.out(F.relu(self.out_norm(h, e))))
