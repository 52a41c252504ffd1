"""A small class-conditional DDPM++-style U-Net for denoising (DPDM, Dockhorn et al. 2023).

The authors' MNIST network (``nv-tlabs/DPDM`` configs: nf = 32, channel multipliers
(1, 2, 2), 2 residual blocks per level, attention at the 7×7 level, ~1.75 M parameters),
written with the layer kinds the book-keeping DP-SGD path clips exactly
(``dpgen_bench/privacy/fastclip.py``): Conv2d, GroupNorm with affine weights, Linear on
vectors (noise-level and label embeddings) and on sequences (attention's projections),
Embedding. No BatchNorm (DP-SGD needs per-example gradients) and no layer called twice.

Inputs: the preconditioned image c_in·x, the noise embedding c_noise (one number per
image: EDM's ln(σ)/4) and the label. ``nf``, ``ch_mult``, ``num_res_blocks`` and
``attn_resolutions`` are the authors' knobs; the ``quick`` presets shrink them.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def _groups(c: int) -> int:
    """GroupNorm groups: the largest of 32, 16, 8, 4, 2, 1 that divides c and leaves ≥ 2
    channels per group where it can (the authors use 32 groups at nf = 32 and up)."""
    for g in (32, 16, 8, 4, 2, 1):
        if c % g == 0 and (c // g >= 2 or g == 1):
            return g
    return 1


class FourierNoiseEmbedding(nn.Module):
    """Positional (sinusoidal) embedding of the scalar noise input, as DDPM++ / EDM."""

    def __init__(self, dim: int, max_positions: int = 10_000):
        super().__init__()
        self.dim, self.max_positions = dim, max_positions

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        half = self.dim // 2
        freqs = torch.exp(-math.log(self.max_positions) * torch.arange(half, device=x.device, dtype=x.dtype) / half)
        args = x[:, None] * freqs[None] * 1000.0  # c_noise = ln(σ)/4 is O(1): spread it out
        return torch.cat([args.cos(), args.sin()], 1)


class ResBlock(nn.Module):
    def __init__(self, cin: int, cout: int, emb_dim: int, dropout: float):
        super().__init__()
        self.norm1 = nn.GroupNorm(_groups(cin), cin)
        self.conv1 = nn.Conv2d(cin, cout, 3, padding=1)
        self.emb = nn.Linear(emb_dim, cout)
        self.norm2 = nn.GroupNorm(_groups(cout), cout)
        self.dropout = nn.Dropout(dropout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1)
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else None

    def forward(self, x: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        h = h + self.emb(F.silu(emb))[:, :, None, None]
        h = self.conv2(self.dropout(F.silu(self.norm2(h))))
        return (x if self.skip is None else self.skip(x)) + h / math.sqrt(2)


class Attention(nn.Module):
    """Single-head self-attention over the H·W positions (Linear layers on sequences)."""

    def __init__(self, c: int):
        super().__init__()
        self.norm = nn.GroupNorm(_groups(c), c)
        self.qkv = nn.Linear(c, 3 * c)
        self.proj = nn.Linear(c, c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, c, hh, ww = x.shape
        seq = self.norm(x).flatten(2).transpose(1, 2)  # n, HW, c
        q, k, v = self.qkv(seq).chunk(3, dim=2)
        w = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(c), dim=2)
        out = self.proj(w @ v).transpose(1, 2).reshape(n, c, hh, ww)
        return x + out / math.sqrt(2)


class ConditionalUNet(nn.Module):
    def __init__(self, image_shape: tuple[int, int, int], num_classes: int, nf: int = 32,
                 ch_mult: tuple[int, ...] = (1, 2, 2), num_res_blocks: int = 2,
                 attn_resolutions: tuple[int, ...] = (7,), dropout: float = 0.0):
        super().__init__()
        c_img, res, _ = image_shape
        emb_dim = 4 * nf
        self.noise_embed = FourierNoiseEmbedding(nf)
        self.emb1 = nn.Linear(nf, emb_dim)
        self.emb2 = nn.Linear(emb_dim, emb_dim)
        self.label = nn.Embedding(num_classes, emb_dim)
        self.conv_in = nn.Conv2d(c_img, nf, 3, padding=1)
        self.down = nn.ModuleList()
        chans, c = [nf], nf
        for level, mult in enumerate(ch_mult):
            for _ in range(num_res_blocks):
                block = nn.ModuleList([ResBlock(c, nf * mult, emb_dim, dropout)])
                c = nf * mult
                if res in attn_resolutions:
                    block.append(Attention(c))
                self.down.append(block)
                chans.append(c)
            if level < len(ch_mult) - 1:
                self.down.append(nn.ModuleList([nn.Conv2d(c, c, 3, stride=2, padding=1)]))
                chans.append(c)
                res = (res + 1) // 2
        self.mid1 = ResBlock(c, c, emb_dim, dropout)
        self.mid_attn = Attention(c)
        self.mid2 = ResBlock(c, c, emb_dim, dropout)
        self.up = nn.ModuleList()
        for level, mult in reversed(list(enumerate(ch_mult))):
            for _ in range(num_res_blocks + 1):
                block = nn.ModuleList([ResBlock(c + chans.pop(), nf * mult, emb_dim, dropout)])
                c = nf * mult
                if res in attn_resolutions:
                    block.append(Attention(c))
                self.up.append(block)
            if level > 0:
                self.up.append(nn.ModuleList([nn.Conv2d(c, c, 3, padding=1)]))  # after a 2× nearest upsample
                res = res * 2
        self.norm_out = nn.GroupNorm(_groups(c), c)
        self.conv_out = nn.Conv2d(c, c_img, 3, padding=1)

    def forward(self, x: torch.Tensor, c_noise: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        emb = self.emb2(F.silu(self.emb1(self.noise_embed(c_noise)))) + self.label(labels)
        h = self.conv_in(x)
        skips = [h]
        for block in self.down:
            if isinstance(block[0], ResBlock):
                h = block[0](h, emb)
                if len(block) > 1:
                    h = block[1](h)
            else:
                h = block[0](h)
            skips.append(h)
        h = self.mid2(self.mid_attn(self.mid1(h, emb)), emb)
        for block in self.up:
            if isinstance(block[0], ResBlock):
                skip = skips.pop()
                h = block[0](torch.cat([h, skip], 1), emb)
                if len(block) > 1:
                    h = block[1](h)
            else:
                h = F.interpolate(h, scale_factor=2, mode="nearest")
                h = block[0](h[:, :, :skips[-1].shape[2], :skips[-1].shape[3]])
        return self.conv_out(F.silu(self.norm_out(h)))
