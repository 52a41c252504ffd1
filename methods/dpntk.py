"""DP-NTK: "Differentially Private Neural Tangent Kernels for Privacy-Preserving Data
Generation" (Yang, Adamczewski, Sutherland, Li, Park, 2023; arXiv 2303.01687).

DP-MERF (``methods/dpmerf.py``) with the random Fourier features replaced by the normalised
empirical-NTK features of an untrained network f: φ(x) = ∇_θ f(x) / ‖∇_θ f(x)‖, where
f(x) = Σ_c f_c(x) sums the network's k outputs (the authors' ``grad_outputs`` of ones).
φ(x) has one coordinate per parameter of f: D = (d + 1)·w + (w + 1)·k for the
one-hidden-layer network (``widths="w"``; d pixels, k classes), e.g. D = 636,010 for
28×28 MNIST at the authors' w = 800, and D = (d + 1)·w₁ + (w₁ + 1)·w₂ + (w₂ + 1)·k for two
layers (``widths="w1,w2"``). ‖φ(x)‖ = 1 for every x: the bias of the output layer alone
gives ‖∇_θ f(x)‖ ≥ √k > 0, so the normalisation never divides by zero.

Paper to code: the method's four steps as the authors' code runs them (``MNIST/dp_ntk.py``,
``dp_ntk_mean_emb1.py``, ``dp_ntk_gen.py``, ``models/ntk.py`` of ``Justinyangjy/DP-NTK``):

1. Draw f's parameters θ at random ("untrained network"): PyTorch's default ``nn.Linear``
   initialisation, U(±1/√fan_in) for weights and biases, as the authors' networks get it,
   drawn here from the run's ``features`` stream (``_init_ntk``): public randomness, like
   dpmerf's frequencies, stored in ``checkpoint.pt``.
2. Mean embedding of the labelled data, μ = (1/n) Σᵢ φ(xᵢ) ⊗ onehot(yᵢ) (a k × D matrix,
   one row per class): ``class_embedding``. The per-example gradients are computed in
   batches with ``torch.func`` (``functional_call`` + ``vmap`` + ``grad``:
   ``per_example_grads``), ``chunk`` examples at a time so that memory stays bounded
   (``chunk`` rows of D floats; the authors loop over the examples one at a time).
3. Privatise μ with the Gaussian mechanism (``release``).
4. Train a conditional generator G to minimise ‖μ̂ − (1/B) Σⱼ φ(G(zⱼ, yⱼ)) ⊗ onehot(yⱼ)‖²
   (the squared MMD of the NTK features, through the same φ), labels uniform, Adam
   (``fit``). It reads μ̂ only: post-processing, no further privacy cost.

Privacy (add/remove adjacency, as every method here). Two Gaussian releases on the whole
training set, one step each at sample rate 1, counted in the ledger before their noise is
drawn (``privacy.release.GaussianRelease``): ``embedding_sum`` S = Σᵢ φ(xᵢ) ⊗ onehot(yᵢ),
sensitivity 1 (adding or removing a record adds or removes the unit vector φ(x) in one row
of S, so S moves by exactly 1 in L2), and ``count`` n, sensitivity 1. Their noise
multipliers share one calibrated σ as dpmerf's (1/σ² = Σ 1/σ_k², split by ``weights``), so
the two compose to the target's calibration. μ̂ = Ŝ / max(n̂, 1). θ and the generator's
latent draws do not depend on the data, and G's training reads the data only through μ̂,
so G, its samples and the checkpoint are post-processing of the two releases.

Departures from the authors' code (``Justinyangjy/DP-NTK``, ``MNIST/``; DPImageBench's
``models/dp_ntk.py`` and configs for the labelled CelebA; docs/provenance.md, "dpntk"):
- Accounting: the authors release the mean μ with N(0, (2σ/n)²) per coordinate
  (replace-one, Δ = 2/n with n = 60,000 public; σ from autodp's ``gaussian_mech``).
  Here n is released too (add/remove, as for every method here), with σ calibrated by RDP.
  DPImageBench halves Opacus' σ and multiplies by 2/n (std σ/n, i.e. Δ = 1/n with n public,
  whatever its ``half_sensitivity`` flag says) and, because ``calc_mean_emb1`` stops after
  the first batch of its shuffled loader, embeds only 5,000 records of the training set.
- The authors' MNIST script adds the ε = 0.2, 1 and 10 noises to one tensor in turn
  (``noise_mean_emb1 = mean_emb1`` aliases it), so their ε = 10 embedding carries all three
  noises; here one release at the run's ε.
- The generator is the conditional DCGAN of ``dpgan`` (tanh output mapped to [0, 1]), as
  in dpmerf, instead of their ``ConvCondGen`` (FC 200, FC 16·7·7, two 5×5 convs, batch
  norm, sigmoid); DPImageBench uses its own BigGAN-style generator (z 60).
- The batch embedding is exact for any batch: a batch larger than ``chunk`` takes two
  passes (the embedding without graph, then each chunk's gradient against the full
  residual). DPImageBench's ``n_splits`` instead averages the losses of sub-batches,
  a different objective.
- The authors' learning-rate schedule is kept (``StepLR`` stepped when step % interval = 0,
  so already after step 0); their early stop at a loss ≤ 1e-4 is not (at ε = 10 on MNIST the
  release's noise alone has squared norm ≈ 5.5e-4: it cannot fire). Their generator batch
  is ``--batch-size`` (5,000), not ``--gen-batch-size`` (100, used only to synthesise).
- The NTK network has k outputs (the authors' ``output_size=n_classes``); DPImageBench gives
  it max(k, 1000) outputs (its ImageNet pretraining label space), which changes φ.
- CelebA: the paper's runs are unconditional (one class, ``fc_2l`` of widths 3000 and 200);
  the ``paper`` preset of the labelled ``celeba-gender-32`` takes DPImageBench's configs.
- The ``quick`` presets narrow f to widths 50-100 (D ≈ 27k-80k) so that one CPU core embeds
  60,000 images in seconds; everything else is the method as above (the settings tried, and
  what limits them on mnist: benchmarks/presets.md, "dpntk").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap

from dpgen_bench.api import Budget, DataInfo, Method, PrivacyPart, RunContext, Split
from dpgen_bench.nets.dcgan import conditional_generator
from dpgen_bench.nets.sampling import ConditionalSampling
from dpgen_bench.privacy import release_noise_to_signal
from dpgen_bench.privacy.accounting import gaussian_releases, release_shares
from dpgen_bench.privacy.release import GaussianRelease
from dpgen_bench.settings import Interval, NonNegativeInt, PositiveFloat, PositiveInt, check_declared

SUM, COUNT = "embedding_sum", "count"
# floats of per-example features held at once when ``chunk`` is 0 (auto): 16 MiB on a CPU
# (cache-sized: faster than larger chunks there), 1 GiB on a GPU
AUTO_CHUNK_FLOATS = {"cpu": 2**22, "cuda": 2**28}


@dataclass(frozen=True)
class DPNTKHparams:
    widths: str = "800"  # hidden widths of f: "w" (fc_1l) or "w1,w2" (fc_2l)
    weights: str = "0.9,0.1"  # share of the privacy budget (in 1/σ²) of the embedding sum and the count
    batch_size: PositiveInt = 5000  # generator batch B
    steps: PositiveInt = 2000  # generator steps
    lr: PositiveFloat = 0.01
    lr_decay: Annotated[float, Interval(0, 1, "(]")] = 0.9
    decay_every: PositiveInt = 1500  # StepLR stepped after every step t with t % decay_every == 0 (t from 0)
    latent_dim: PositiveInt = 5  # the authors' d_code
    g_width: PositiveInt = 32
    chunk: NonNegativeInt = 0  # examples per vmap call (memory only); 0: auto from D and the device
    log_every: PositiveInt = 100

    def __post_init__(self):
        check_declared(self)
        w = self.layer_widths()
        if not 1 <= len(w) <= 2 or min(w) < 1:
            raise ValueError("widths must be one or two positive integers, e.g. '800' or '32,256'")
        s = self.shares()
        if len(s) != 2 or not all(0 < x <= 1 for x in s):
            raise ValueError("weights must be two positive numbers (embedding sum, count)")

    def layer_widths(self) -> tuple[int, ...]:
        try:
            return tuple(int(x) for x in str(self.widths).split(","))
        except ValueError:
            raise ValueError(f"widths must be integers separated by ',', got {self.widths!r}") from None

    def shares(self) -> tuple[float, ...]:
        return release_shares(self.weights)


class NTKNet(nn.Module):
    """The authors' f on one example (flattened): ``fc_1l`` fc1 → ReLU → LayerNorm → fc2;
    ``fc_2l`` fc1 → ReLU → fc2 → LayerNorm → fc3 (their ``NTK_TL``: no ReLU after fc2). The
    LayerNorms have no affine parameters."""

    def __init__(self, in_dim: int, widths: tuple[int, ...], out_dim: int, device=None):
        super().__init__()
        dims = (in_dim, *widths, out_dim)
        self.layers = nn.ModuleList(nn.Linear(a, b, device=device) for a, b in zip(dims[:-1], dims[1:]))

    def forward(self, x: Tensor) -> Tensor:
        h = x.reshape(-1)
        *hidden, head = self.layers
        for i, layer in enumerate(hidden):
            h = layer(h)
            if i == 0:
                h = torch.relu(h)
        h = F.layer_norm(h, h.shape[-1:])
        return head(h)


def _init_ntk(net: NTKNet, generator: torch.Generator) -> dict[str, Tensor]:
    """θ: every weight and bias ~ U(±1/√fan_in) (``nn.Linear``'s default), from ``generator``."""
    params = {}
    for name, p in net.named_parameters():
        layer = net.get_submodule(name.rsplit(".", 1)[0])
        bound = 1.0 / math.sqrt(layer.in_features)
        u = torch.rand(p.shape, generator=generator, device=generator.device)
        params[name] = (2 * u - 1) * bound
    return params


def per_example_grads(net: NTKNet, params: dict[str, Tensor], x: Tensor) -> dict[str, Tensor]:
    """∇_θ Σ_c f_c(xᵢ) for every row of ``x``, one tensor (B, *shape) per parameter
    (``torch.func``: ``vmap`` over ``grad`` of a ``functional_call``). Differentiable in ``x``."""

    def f(p, xi):
        return functional_call(net, p, (xi,)).sum()

    return vmap(grad(f), in_dims=(None, 0))(params, x)


def ntk_features(net: NTKNet, params: dict[str, Tensor], x: Tensor) -> Tensor:
    """φ(xᵢ) = ∇_θ f(xᵢ) / ‖∇_θ f(xᵢ)‖ as a (B, D) matrix (parameters in ``params``' order)."""
    g = per_example_grads(net, params, x)
    flat = torch.cat([v.flatten(1) for v in g.values()], 1)
    return flat / flat.norm(dim=1, keepdim=True)


def class_embedding(net: NTKNet, params: dict[str, Tensor], x: Tensor, labels: Tensor, k: int) -> Tensor:
    """Σᵢ φ(xᵢ) ⊗ onehot(yᵢ) as a (k, D) matrix: ``onehot.T @ ntk_features`` computed per
    parameter block (the per-example gradients are read twice, never copied into one matrix)."""
    g = per_example_grads(net, params, x)
    norms = torch.stack([v.flatten(1).pow(2).sum(1) for v in g.values()]).sum(0).sqrt()
    w = F.one_hot(labels, k).to(x.dtype).T / norms  # (k, B): the class of each row, over its norm
    return torch.cat([w @ v.flatten(1) for v in g.values()], 1)


class DPNTK(ConditionalSampling, Method):
    """DP-NTK: one DP release of an NTK-feature mean embedding, a generator matched to it."""

    name = "dpntk"
    private = True
    conditional = True
    Hparams = DPNTKHparams
    bookkeeping_hparams = Method.bookkeeping_hparams | {"chunk"}
    presets = {
        # f narrowed from width 800 (D ≈ 27k-80k) for one CPU core; chosen on val (docs/methods.md, "dpntk")
        "quick": {"digits": dict(widths="100", batch_size=100, steps=300, samples_per_class=100),
                  "mnist-5k": dict(widths="100", batch_size=100, steps=120, samples_per_class=100),
                  "mnist": dict(widths="50", batch_size=100, steps=200, samples_per_class=100)},
        "tiny": {"*": dict(widths="8", batch_size=32, steps=8, g_width=8, log_every=2, samples_per_class=10)},
        # the authors' MNIST code; CelebA-Gender from DPImageBench's configs (docs/provenance.md, "dpntk")
        "paper": {"mnist": dict(samples_per_class=6000),
                  "fashion-mnist": dict(samples_per_class=6000),
                  "celeba-gender-32": dict(widths="32,256", latent_dim=60, decay_every=2001, delta=1e-6,
                                           samples_per_class=30_000)},
    }

    def __init__(self, hparams: DPNTKHparams, info: DataInfo):
        super().__init__(hparams, info)
        h = hparams
        self.G = conditional_generator(self.name, info.image_shape, info.num_classes, h.g_width, h.latent_dim)
        # f's shape only (no memory): θ is drawn from the run's seed in fit
        self.ntk = NTKNet(math.prod(info.image_shape), h.layer_widths(), info.num_classes, device="meta")
        self.ntk_params: dict[str, Tensor] = {}

    @property
    def feature_dim(self) -> int:
        """D: the number of parameters of f."""
        return sum(p.numel() for p in self.ntk.parameters())

    def noise_to_signal(self, part: PrivacyPart) -> float:
        """A class's embedding (D features) read as the mean of its ~N/k records; the count
        (one number) as the mean of N."""
        if part.name == COUNT:
            return release_noise_to_signal(part.noise_multiplier, 1, self.info.n_train)
        per_class = self.info.n_train / self.info.num_classes
        return release_noise_to_signal(part.noise_multiplier, self.feature_dim, per_class)

    def plan(self, budget: Budget) -> list[PrivacyPart]:
        shares = dict(zip((SUM, COUNT), self.hparams.shares()))
        return gaussian_releases(epsilon=budget.epsilon, delta=budget.delta, shares=shares)

    def chunk_size(self, device: torch.device) -> int:
        if self.hparams.chunk:
            return self.hparams.chunk
        floats = AUTO_CHUNK_FLOATS["cuda" if device.type == "cuda" else "cpu"]
        return max(1, floats // self.feature_dim)

    def draw_ntk(self, ctx: RunContext) -> None:
        """θ from the run's ``features`` stream (public randomness, independent of the data)."""
        self.ntk_params = _init_ntk(self.ntk, ctx.generator("features", offset=2))

    def release(self, train: Split, ctx: RunContext) -> tuple[Tensor, Tensor]:
        """The two private releases (Ŝ, n̂); draws f's parameters first."""
        dev, k = ctx.device, self.info.num_classes
        noise = ctx.generator("noise")
        self.draw_ntk(ctx)
        x = (train.images.to(dev) + 1) / 2  # pixels in [0, 1], as the authors'
        labels = train.labels.to(dev)
        chunk = self.chunk_size(dev)
        s = torch.zeros(k, self.feature_dim, device=dev)
        bar = ctx.progress(total=math.ceil(len(x) / chunk), desc=f"{self.name} data embedding")
        with torch.no_grad():
            for i in range(0, len(x), chunk):
                s += class_embedding(self.ntk, self.ntk_params, x[i:i + chunk], labels[i:i + chunk], k)
                bar.update(1)
        bar.close()
        # sensitivity 1 for both (‖φ(x)‖ = 1 in one row of S; one record in the count); each
        # release counts itself in the ledger before its noise is drawn (privacy.release)
        return (GaussianRelease(ctx, SUM, 1.0, noise)(s),
                GaussianRelease(ctx, COUNT, 1.0, noise)(torch.tensor(float(len(x)), device=dev)))

    def batch_loss(self, fake: Tensor, y: Tensor, target: Tensor, chunk: int) -> Tensor:
        """‖target − (1/B) Σⱼ φ(fakeⱼ) ⊗ yⱼ‖², with its gradient accumulated into ``fake``'s
        graph (backward is called here). Exact for any B: a batch larger than ``chunk`` takes a
        pass without graph for the embedding, then one backward per chunk against the residual."""
        k, b = self.info.num_classes, len(fake)
        if b <= chunk:
            loss = ((target - class_embedding(self.ntk, self.ntk_params, fake, y, k) / b) ** 2).sum()
            loss.backward()
            return loss.detach()
        with torch.no_grad():
            emb = sum(class_embedding(self.ntk, self.ntk_params, fake[i:i + chunk], y[i:i + chunk], k)
                      for i in range(0, b, chunk)) / b
            resid = emb - target
        x = fake.detach().requires_grad_(True)
        for i in range(0, b, chunk):
            part = class_embedding(self.ntk, self.ntk_params, x[i:i + chunk], y[i:i + chunk], k) / b
            part.backward(2 * resid)  # d‖emb − target‖² / d emb, the chunk's share through φ
        fake.backward(x.grad)
        return (resid ** 2).sum()

    def fit(self, train: Split, budget: Budget, ctx: RunContext) -> None:
        h, dev, k = self.hparams, ctx.device, self.info.num_classes
        s_hat, n_hat = self.release(train, ctx)
        target = s_hat / n_hat.clamp(min=1.0)  # everything below is post-processing
        latent = ctx.generator("latent", offset=1)
        chunk = self.chunk_size(dev)
        self.G.to(dev).train()
        opt = torch.optim.Adam(self.G.parameters(), lr=h.lr)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=h.lr_decay)
        bar = ctx.progress(total=h.steps, desc=f"{self.name} generator steps")
        for step in range(h.steps):
            z = torch.randn(h.batch_size, h.latent_dim, generator=latent, device=dev)
            y = torch.randint(0, k, (h.batch_size,), generator=latent, device=dev)
            opt.zero_grad(set_to_none=True)
            loss = self.batch_loss((self.G(z, y) + 1) / 2, y, target, chunk)
            opt.step()
            bar.update(1)
            if (step + 1) % h.log_every == 0:
                ctx.record(step=step + 1, mmd2=loss.item(), lr=sched.get_last_lr()[0])
            if step % h.decay_every == 0:  # the authors' schedule: also after the first step
                sched.step()
        bar.close()
        self.G.cpu().eval()
        self.ntk_params = {n: p.cpu() for n, p in self.ntk_params.items()}


    def state_dict(self) -> dict:
        return {"G": self.G.state_dict(), "ntk": dict(self.ntk_params)}

    def load_state_dict(self, state: dict) -> None:
        self.G.load_state_dict(state["G"])
        self.ntk_params = dict(state["ntk"])
