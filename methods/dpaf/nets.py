"""DPAF's networks (DPAF §5.2.1–5.2.2, Figure 4; §6.1 "Canonical Implementation"; App.
A.5 "Choice of cGAN"; App. A.10 for the layer configurations).

Layer configurations ``Cx1-Cx2-Cx3``: x1 convolutions form conv1, x2 conv2*, x3 conv3*
(× = none); two fully connected layers always follow (FC*). Every convolution halves the
feature maps (§5.2.1 / OpenReview §3.1: "the height/width of the feature maps in the
next convolutional layer is half"): kernel 4, stride 2, padding 1 on even sizes, kernel
3, stride 2, padding 1 on odd ones (28 → 14 → 7 → 4). Channels double from layer to
layer (d, 2d, 4d, …), the usual DCGAN discriminator (our reading of "the number of
neurons in the next convolutional layer is half of the one in the current"), with
LeakyReLU(0.2) and no BatchNorm (Opacus needs per-example gradients). Weights start as
N(0, 0.02) (DCGAN; the std the paper uses for random conv1 in §6.2.4).

- Classifier C (phase 1): conv1 – conv2 – SIN – AGG – conv3 – FC – FC – softmax over
  classes (the predicted class proportions of the aggregated batch).
- Discriminator D (phase 2): the transferred conv1 (frozen) – conv2* – SIN – DPAGG /
  AGG / nothing – conv3* – FC* – FC* → one logit. The class label enters through a
  learned embedding (``nn.Embedding``) broadcast over the feature maps and concatenated
  to conv1's output, i.e. at the input of conv2*. The paper feeds it "to the output of
  the input layer" (cDCGAN); with C2/C3 conv1 that layer lies inside the transferred
  conv1, which C trains without labels (see the package docstring), so the label moves
  to the first layer D trains.
- Generator G: the reverse of D (App. A.5, §5.2.2): z (dimension 100) and the one-hot
  label are each mapped by a transposed convolution onto the smallest feature map of D
  and concatenated there, at the input of G's second layer (cDCGAN); then one transposed
  convolution per convolution of D, mirroring its sizes, LeakyReLU(0.2) between them and
  tanh at the output, no BatchNorm: the conditional DCGAN of ``dpgen_bench.nets.dcgan``
  (Private GANs' code). DCGAN's textbook ReLU + BatchNorm G (``g_activation=relu
  g_batchnorm=true``, with ``g_label=embedding`` this class's earlier design) is kept for
  comparison: it ignores z and draws one image per class (the package docstring).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .dpagg import sin

LAYER_CONFIGS = {"C2-C2-C1": (2, 2, 1), "C2-C1-×": (2, 1, 0), "C3-C1-×": (3, 1, 0)}
ASCII_ALIASES = {"C2-C1-x": "C2-C1-×", "C3-C1-x": "C3-C1-×", "C2-C1-X": "C2-C1-×", "C3-C1-X": "C3-C1-×"}


def canonical_config(name: str) -> str:
    name = ASCII_ALIASES.get(name, name)
    if name not in LAYER_CONFIGS:
        raise ValueError(f"unknown layer configuration {name!r} (known: {', '.join(LAYER_CONFIGS)})")
    return name


def parse_config(name: str) -> tuple[int, int, int]:
    return LAYER_CONFIGS[canonical_config(name)]


@dataclass(frozen=True)
class Layout:
    """Feature-map sizes and conv hyperparameters of D/C for one image size and config."""

    image_channels: int
    sizes: tuple[int, ...]  # s_0 = image size, s_l after the l-th convolution
    kernels: tuple[int, ...]  # kernel of each convolution (stride 2, padding 1)
    channels: tuple[int, ...]  # output channels of each convolution
    x1: int
    x2: int
    x3: int

    @property
    def n_layers(self) -> int:
        return len(self.kernels)

    @property
    def conv1_channels(self) -> int:
        return self.channels[self.x1 - 1]

    @property
    def agg_channels(self) -> int:  # m
        return self.channels[self.x1 + self.x2 - 1]

    @property
    def agg_size(self) -> int:  # p
        return self.sizes[self.x1 + self.x2]


def make_layout(image_shape: tuple[int, int, int], config: str, width: int) -> Layout:
    c, h, w = image_shape
    if h != w:
        raise ValueError(f"DPAF's networks need square images, got {h}×{w}")
    x1, x2, x3 = parse_config(config)
    n = x1 + x2 + x3
    sizes, kernels = [h], []
    for _ in range(n):
        s = sizes[-1]
        k = 4 if s % 2 == 0 else 3
        kernels.append(k)
        sizes.append((s + 2 - k) // 2 + 1)
    channels = tuple(width * 2 ** i for i in range(n))
    return Layout(c, tuple(sizes), tuple(kernels), channels, x1, x2, x3)


def check_layout(layout: Layout) -> None:
    """DPAGG needs maps with ≥ 2 values (SIN), and every layer a map ≥ 1."""
    if layout.agg_size * layout.agg_size < 2:
        raise ValueError(f"images of {layout.sizes[0]}×{layout.sizes[0]} are too small for this layer "
                         f"configuration: DPAGG would see {layout.agg_size}×{layout.agg_size} feature maps")


def _conv_stack(in_ch: int, layout: Layout, start: int, stop: int) -> nn.Sequential:
    layers: list[nn.Module] = []
    c = in_ch
    for i in range(start, stop):
        layers += [nn.Conv2d(c, layout.channels[i], layout.kernels[i], 2, 1), nn.LeakyReLU(0.2)]
        c = layout.channels[i]
    return nn.Sequential(*layers)


def dcgan_init(module: nn.Module) -> None:
    for m in module.modules():
        if isinstance(m, (nn.Conv2d, nn.ConvTranspose2d, nn.Linear)):
            nn.init.normal_(m.weight, 0.0, 0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.normal_(m.weight, 1.0, 0.02)
            nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, 0.0, 1.0)


class Conv1(nn.Module):
    """conv1: the first x1 convolutions (shared by C and D; frozen in D)."""

    def __init__(self, layout: Layout):
        super().__init__()
        self.body = _conv_stack(layout.image_channels, layout, 0, layout.x1)

    def forward(self, x):
        return self.body(x)


class Conv2(nn.Module):
    """conv2 of C (no label)."""

    def __init__(self, layout: Layout):
        super().__init__()
        self.body = _conv_stack(layout.conv1_channels, layout, layout.x1, layout.x1 + layout.x2)

    def forward(self, h):
        return self.body(h)


class Conv2Star(nn.Module):
    """conv2* of D: the label embedding joins conv1's output here."""

    def __init__(self, layout: Layout, num_classes: int, label_dim: int):
        super().__init__()
        self.embed = nn.Embedding(num_classes, label_dim)
        self.body = _conv_stack(layout.conv1_channels + label_dim, layout, layout.x1, layout.x1 + layout.x2)

    def forward(self, h, y):
        e = self.embed(y)[:, :, None, None].expand(-1, -1, h.shape[2], h.shape[3])
        return self.body(torch.cat([h, e.to(h.dtype)], 1))


class Head(nn.Module):
    """conv3 (x3 convolutions, maybe none) – FC – FC on (aggregated) feature maps."""

    def __init__(self, layout: Layout, fc_width: int, out_features: int):
        super().__init__()
        start = layout.x1 + layout.x2
        self.m, self.p = layout.agg_channels, layout.agg_size
        self.conv3 = _conv_stack(layout.agg_channels, layout, start, layout.n_layers)
        last_c = layout.channels[-1]
        last_s = layout.sizes[-1]
        self.fc1 = nn.Linear(last_c * last_s * last_s, fc_width)
        self.fc2 = nn.Linear(fc_width, out_features)

    def forward(self, a):
        """``a``: (n, m, p, p) maps or (n, m·p·p) flattened aggregates."""
        a = a.reshape(-1, self.m, self.p, self.p)
        h = self.conv3(a).flatten(1)
        return self.fc2(F.leaky_relu(self.fc1(h), 0.2))


class Classifier(nn.Module):
    """C: conv1 – conv2 – SIN – AGG – conv3 – FC – FC; outputs class-proportion logits."""

    def __init__(self, layout: Layout, num_classes: int, fc_width: int, sin_eps: float):
        super().__init__()
        self.conv1 = Conv1(layout)
        self.conv2 = Conv2(layout)
        self.head = Head(layout, fc_width, num_classes)
        self.sin_eps = sin_eps

    def features(self, x):
        return sin(self.conv2(self.conv1(x)), self.sin_eps)

    def forward(self, x):
        """Per-example predictions (AGG over a batch of one: the identity)."""
        return self.head(self.features(x))


class Generator(nn.Module):
    """G: the reverse of D (see the module docstring). ``label``: how the class enters, a
    one-hot map through its own transposed convolution (cDCGAN, as Private GANs' code
    does) or a learned ``nn.Embedding`` of ``label_dim``; ``activation``: LeakyReLU(0.2)
    or ReLU after every hidden layer; ``batchnorm``: DCGAN's BatchNorm before it.

    The defaults (one-hot, LeakyReLU, no BatchNorm) are those of ``dpgen_bench.nets.dcgan``:
    with ReLU + BatchNorm (DCGAN's textbook G, this class's earlier design) G learns to
    ignore z and draws one image per class (the methods/dpaf docstring)."""

    def __init__(self, layout: Layout, num_classes: int, width: int, latent_dim: int, label_dim: int,
                 batchnorm: bool = False, activation: str = "leaky_relu", label: str = "onehot"):
        super().__init__()
        if activation not in ("leaky_relu", "relu"):
            raise ValueError(f"unknown activation {activation!r} (leaky_relu or relu)")
        if label not in ("onehot", "embedding"):
            raise ValueError(f"unknown label input {label!r} (onehot or embedding)")
        n = layout.n_layers
        sizes, kernels = layout.sizes, layout.kernels
        top = width * 2 ** (n - 1)  # channels of each branch at the smallest map
        s_top = sizes[-1]
        self.latent_dim, self.num_classes, self.label = latent_dim, num_classes, label
        if label == "embedding":
            self.embed = nn.Embedding(num_classes, label_dim)
        self.proj_z = nn.ConvTranspose2d(latent_dim, top, s_top, 1, 0)
        self.proj_y = nn.ConvTranspose2d(num_classes if label == "onehot" else label_dim, top, s_top, 1, 0)
        norm = (lambda c: nn.BatchNorm2d(c)) if batchnorm else (lambda c: nn.Identity())
        act = (lambda: nn.LeakyReLU(0.2)) if activation == "leaky_relu" else nn.ReLU
        self.norm_z, self.norm_y, self.act = norm(top), norm(top), act()
        body: list[nn.Module] = []
        c_in = 2 * top
        for i in reversed(range(n)):  # mirror of D's i-th convolution: sizes[i+1] → sizes[i]
            last = i == 0
            c_out = layout.image_channels if last else width * 2 ** (i - 1)
            body.append(nn.ConvTranspose2d(c_in, c_out, kernels[i], 2, 1))
            if not last:
                body += [norm(c_out), act()]
            c_in = c_out
        self.body = nn.Sequential(*body)

    def forward(self, z, y):
        e = F.one_hot(y, self.num_classes).to(z.dtype) if self.label == "onehot" else self.embed(y).to(z.dtype)
        hz = self.act(self.norm_z(self.proj_z(z[:, :, None, None])))
        hy = self.act(self.norm_y(self.proj_y(e[:, :, None, None])))
        return torch.tanh(self.body(torch.cat([hz, hy], 1)))


def sensitivity_of(layout: Layout) -> float:
    return math.sqrt(layout.agg_channels) * layout.agg_size
