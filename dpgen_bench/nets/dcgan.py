"""Conditional DCGAN without BatchNorm, as in "Private GANs, Revisited" (App. B.1, C).

Labels enter both networks as one-hot maps through their own (transposed) convolution,
whose output is concatenated with the image / latent branch, as in the authors' code
(``dcgan.py``: ``deconv1_2`` / ``conv1_2``). LeakyReLU(0.2) everywhere; no custom init
(PyTorch defaults, as the paper says). ``width`` is the paper's d (128 in the paper).

Layouts per image size (the paper's are 28×28 for MNIST/FMNIST, 32×32 for CelebA; the
16×16 one is ours, for digits):

- 28: D 28→14→7→4→1 (kernels 4,4,3,4), G 1→4→7→14→28. D 1.72M, G 2.27M params at
  d=128 (the paper's counts, §4.1).
- 32: the paper's CelebA "small" variant (``DC32Small``), D 32→16→8→4→1, G 1→4→8→16→32;
  D 2.64M, G 3.16M at d=128 (App. C).
- 16: D 16→8→4→1, G 1→4→8→16.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import UserError

# (kernel, stride, padding) of the layers after the first, per image size.
_D_LAYERS = {
    16: [(4, 2, 1)],
    28: [(4, 2, 1), (3, 2, 1)],
    32: [(4, 2, 1), (4, 2, 1)],
}
_G_LAYERS = {
    16: [(4, 2, 1)],
    28: [(3, 2, 1), (4, 2, 1)],
    32: [(4, 2, 1), (4, 2, 1)],
}
SUPPORTED_SIZES = tuple(_D_LAYERS)


def _check_size(size: int) -> None:
    if size not in _D_LAYERS:
        raise ValueError(f"DCGAN supports image sizes {SUPPORTED_SIZES}, got {size}")


class ConditionalDiscriminator(nn.Module):
    def __init__(self, image_shape: tuple[int, int, int], num_classes: int, width: int = 128):
        super().__init__()
        channels, size, _ = image_shape
        _check_size(size)
        self.num_classes = num_classes
        self.image_size = size
        self.conv_image = nn.Conv2d(channels, width // 2, 4, 2, 1)
        self.conv_label = nn.Conv2d(num_classes, width // 2, 4, 2, 1)
        layers: list[nn.Module] = []
        c = width
        for k, s, p in _D_LAYERS[size]:
            layers.append(nn.Conv2d(c, c * 2, k, s, p))
            c *= 2
        self.body = nn.ModuleList(layers)
        self.head = nn.Conv2d(c, 1, 4, 1, 0)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        onehot = F.one_hot(y, self.num_classes).to(x.dtype)[:, :, None, None]
        onehot = onehot.expand(-1, -1, self.image_size, self.image_size)
        h = torch.cat([F.leaky_relu(self.conv_image(x), 0.2), F.leaky_relu(self.conv_label(onehot), 0.2)], 1)
        for layer in self.body:
            h = F.leaky_relu(layer(h), 0.2)
        return self.head(h).flatten()  # logits, one per example


class ConditionalGenerator(nn.Module):
    def __init__(self, image_shape: tuple[int, int, int], num_classes: int, width: int = 128, latent_dim: int = 128):
        super().__init__()
        channels, size, _ = image_shape
        _check_size(size)
        self.num_classes = num_classes
        self.latent_dim = latent_dim
        layers = _G_LAYERS[size]
        c = width * 2 ** (len(layers) - 1)  # channels of each input branch at 4×4
        self.deconv_latent = nn.ConvTranspose2d(latent_dim, c, 4, 1, 0)
        self.deconv_label = nn.ConvTranspose2d(num_classes, c, 4, 1, 0)
        body: list[nn.Module] = []
        c_in = 2 * c
        for i, (k, s, p) in enumerate(layers):
            c_out = width * 2 ** (len(layers) - 1 - i)
            body.append(nn.ConvTranspose2d(c_in, c_out, k, s, p))
            c_in = c_out
        self.body = nn.ModuleList(body)
        self.out = nn.ConvTranspose2d(c_in, channels, 4, 2, 1)

    def forward(self, z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        onehot = F.one_hot(y, self.num_classes).to(z.dtype)[:, :, None, None]
        h = torch.cat(
            [F.leaky_relu(self.deconv_latent(z[:, :, None, None]), 0.2), F.leaky_relu(self.deconv_label(onehot), 0.2)], 1
        )
        for layer in self.body:
            h = F.leaky_relu(layer(h), 0.2)
        return torch.tanh(self.out(h))  # [-1, 1]


def conditional_generator(method: str, image_shape: tuple[int, int, int], num_classes: int, width: int,
                          latent_dim: int) -> ConditionalGenerator:
    """``ConditionalGenerator`` for a method's run; an image size it does not have is one line
    naming the method (a ``UserError``), not a traceback."""
    try:
        return ConditionalGenerator(image_shape, num_classes, width, latent_dim)
    except ValueError as e:
        raise UserError(f"{method}: {e}") from None
