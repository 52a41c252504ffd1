"""DP-MERF: "DP-MERF: Differentially Private Mean Embeddings with Random Features for
Practical Privacy-Preserving Data Generation" (Harder, Adamczewski, Park, AISTATS 2021).

One private release, then no access to data: the labelled data's mean embedding
μ = (1/n) Σᵢ φ(xᵢ) ⊗ onehot(yᵢ) with random Fourier features of a Gaussian kernel,
φ(x) = [cos(Wx), sin(Wx)] / √(D/2), W ∈ R^{D/2 × d} with rows ~ N(0, I / rff_sigma)
(the authors' "sphere" features: ‖φ(x)‖ = 1 for every x, so ‖φ(x) ⊗ y‖ = 1). A
conditional generator is then trained to minimise ‖μ̂ − (1/B) Σⱼ φ(G(zⱼ, yⱼ)) ⊗ yⱼ‖²
with labels drawn uniformly (the authors' balanced-data code), which is post-processing.

Privacy (add/remove adjacency, as every method here; the paper uses replace-one with
sensitivity 2/n for the mean): two Gaussian releases on the whole training set, one step
each at sample rate 1: ``embedding_sum`` S = Σᵢ φ(xᵢ) ⊗ yᵢ (sensitivity 1: one record
adds or removes a unit vector) and ``count`` n (sensitivity 1); μ̂ = Ŝ / max(n̂, 1). Their
noise multipliers share one calibrated σ as in ``dpmean`` (1/σ² = Σ 1/σ_k², weights
``weights``), so the composition is the target's calibration.

Departures from the authors' code (ParkLabML/DP-MERF, ``code_balanced``):
- Pixels enter the features in [0, 1] as there; ``rff_sigma`` default 105 is theirs for
  28×28 MNIST (the kernel's σ² in pixel units); for other sizes the ``quick`` preset scales
  it with the number of pixels (digits 16×16: chosen on the validation part).
- The ``quick`` presets' generator is the conditional DCGAN of ``dpgan`` (``dpgen_bench.nets.dcgan``,
  tanh output mapped to [0, 1]); ``generator="authors"`` (the ``long`` and ``paper`` presets)
  is their ``ConvCondGen`` (``AuthorsGenerator``: FC 200 + two 5×5 convs, batch norm, sigmoid).
  Adam(lr 0.01) with ×0.9 decay per epoch of ⌊n/B⌋ steps and B = 500 as theirs; D = 10,000
  features as theirs. The DCGAN can die on full MNIST: about one seed in three paints every
  pixel black (every output in the flat of the tanh) and never leaves, at the authors'
  schedule too; their generator does not (benchmarks/presets.md, "dpmerf's learning rate on
  mnist").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated

import torch
import torch.nn.functional as F
from torch import nn

from dpgen_bench.api import Budget, DataInfo, Method, PrivacyPart, RunContext, Split
from dpgen_bench.errors import UserError
from dpgen_bench.nets.dcgan import conditional_generator
from dpgen_bench.nets.sampling import ConditionalSampling
from dpgen_bench.privacy import release_noise_to_signal
from dpgen_bench.privacy.accounting import gaussian_releases, release_shares
from dpgen_bench.privacy.release import GaussianRelease
from dpgen_bench.settings import Ge, Interval, PositiveFloat, PositiveInt, check_declared

SUM, COUNT = "embedding_sum", "count"
GENERATORS = ("dcgan", "authors")


class AuthorsGenerator(nn.Module):
    """The DP-MERF authors' conditional generator (``ConvCondGen`` of ParkLabML/DP-MERF,
    written anew): [z, onehot(y)] → linear 200 → batch norm → ReLU → linear c₁·(s/4)² → batch
    norm → c₁ maps of s/4 × s/4 → bilinear ×2 → 5×5 conv to c₂ → ReLU → bilinear ×2 → 5×5
    conv to the image's channels → sigmoid, returned in [−1, 1] as every generator here.
    Their MNIST sizes: c₁, c₂ = 16, 8; s = 28 (7 × 7 maps before upsampling)."""

    def __init__(self, image_shape: tuple[int, int, int], num_classes: int, latent_dim: int,
                 hidden: int = 200, maps: tuple[int, int] = (16, 8), kernel: int = 5):
        super().__init__()
        channels, size, width = image_shape
        if size != width or size % 4:
            raise ValueError(f"the authors' generator needs square images with a side divisible by 4, "
                             f"not {size}×{width}")
        self.num_classes, self.maps, self.side = num_classes, maps, size // 4
        self.fc1 = nn.Linear(latent_dim + num_classes, hidden)
        self.bn1 = nn.BatchNorm1d(hidden)
        self.fc2 = nn.Linear(hidden, maps[0] * self.side ** 2)
        self.bn2 = nn.BatchNorm1d(maps[0] * self.side ** 2)
        self.conv1 = nn.Conv2d(maps[0], maps[1], kernel, padding=kernel // 2)
        self.conv2 = nn.Conv2d(maps[1], channels, kernel, padding=kernel // 2)

    def forward(self, z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = torch.cat([z, F.one_hot(y, self.num_classes).to(z.dtype)], 1)
        h = self.bn2(self.fc2(F.relu(self.bn1(self.fc1(h)))))
        h = h.view(len(h), self.maps[0], self.side, self.side)
        up = dict(scale_factor=2, mode="bilinear", align_corners=True)  # their nn.UpsamplingBilinear2d
        h = F.relu(self.conv1(F.interpolate(h, **up)))
        return 2 * torch.sigmoid(self.conv2(F.interpolate(h, **up))) - 1


@dataclass(frozen=True)
class DPMERFHparams:
    num_features: Annotated[int, Ge(2)] = 10_000  # D (cos and sin of D/2 frequencies)
    rff_sigma: PositiveFloat = 105.0  # Gaussian kernel σ² (pixels in [0, 1]); frequencies ~ N(0, I / rff_sigma)
    weights: str = "0.9,0.1"  # share of the privacy budget (in 1/σ²) of the embedding sum and the count
    batch_size: PositiveInt = 500
    epochs: PositiveInt = 5  # of ⌊n / batch_size⌋ generator steps each
    lr: PositiveFloat = 0.01
    lr_decay: Annotated[float, Interval(0, 1, "(]")] = 0.9  # per epoch
    latent_dim: PositiveInt = 5  # the authors' d_code
    g_width: PositiveInt = 32  # the DCGAN generator's (generator="dcgan")
    generator: str = "dcgan"  # or "authors": their ConvCondGen (FC 200, two 5×5 convs, batch norm, sigmoid)
    log_every: PositiveInt = 50

    def __post_init__(self):
        check_declared(self)
        if self.num_features % 2:
            raise ValueError("num_features must be even")
        if self.generator not in GENERATORS:
            raise ValueError(f"generator must be one of {', '.join(GENERATORS)}")
        w = self.shares()
        if len(w) != 2 or not all(0 < x <= 1 for x in w):
            raise ValueError("weights must be two positive numbers (embedding sum, count)")

    def shares(self) -> tuple[float, ...]:
        return release_shares(self.weights)


def random_features(x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """φ(x) = [cos(Wx), sin(Wx)] / √(D/2): unit L2 norm per row (x flattened, in [0, 1])."""
    proj = x.flatten(1) @ freqs.T
    return torch.cat([proj.cos(), proj.sin()], 1) / math.sqrt(freqs.shape[0])


def label_embedding(phi: torch.Tensor, labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Σᵢ φᵢ ⊗ onehot(yᵢ) as a (classes, D) matrix."""
    return F.one_hot(labels, num_classes).to(phi.dtype).T @ phi


class DPMERF(ConditionalSampling, Method):
    """DP-MERF: one DP release of a random-feature mean embedding, a generator matched to it."""

    name = "dpmerf"
    private = True
    conditional = True
    Hparams = DPMERFHparams
    # settings added after runs were recorded, at their "as before" value (config.stable_hparams)
    late_hparams = {"generator": "dcgan"}
    presets = {
        # digits: rff_sigma scaled from MNIST's 105 by 256/784 pixels, chosen on val (benchmarks/presets.md)
        "quick": {"digits": dict(rff_sigma=34.0, epochs=10, batch_size=200, samples_per_class=100),
                  # the authors' MNIST rff_sigma and D (benchmarks/presets.md, "dpmerf", mnist-5k)
                  "mnist-5k": dict(epochs=10, batch_size=200, samples_per_class=100),
                  # one epoch (300 G steps), lr chosen on val (benchmarks/presets.md, "dpmerf's learning rate on mnist")
                  "mnist": dict(epochs=1, batch_size=200, lr=3e-3, samples_per_class=100)},
        "tiny": {"*": dict(num_features=200, epochs=2, batch_size=32, g_width=8, samples_per_class=10)},
        # the authors' settings and generator (presets.md, "dpmerf's learning rate on mnist"; docs/provenance.md)
        "long": {"mnist": dict(generator="authors", samples_per_class=100)},
        "paper": {"mnist": dict(generator="authors", samples_per_class=6000),
                  "fashion-mnist": dict(generator="authors", rff_sigma=127.0, samples_per_class=6000)},
    }

    def __init__(self, hparams: DPMERFHparams, info: DataInfo):
        super().__init__(hparams, info)
        h = hparams
        if h.generator == "authors":
            try:
                self.G = AuthorsGenerator(info.image_shape, info.num_classes, h.latent_dim)
            except ValueError as e:
                raise UserError(f"{self.name}: {e}") from None
        else:
            self.G = conditional_generator(self.name, info.image_shape, info.num_classes, h.g_width, h.latent_dim)
        self.freqs = torch.empty(0)  # the random features: drawn from the run's seed in fit

    def noise_to_signal(self, part: PrivacyPart) -> float:
        """A class's embedding (D features) read as the mean of its ~N/k records; the count
        (one number) as the mean of N."""
        if part.name == COUNT:
            return release_noise_to_signal(part.noise_multiplier, 1, self.info.n_train)
        per_class = self.info.n_train / self.info.num_classes
        return release_noise_to_signal(part.noise_multiplier, self.hparams.num_features, per_class)

    def plan(self, budget: Budget) -> list[PrivacyPart]:
        shares = dict(zip((SUM, COUNT), self.hparams.shares()))
        return gaussian_releases(epsilon=budget.epsilon, delta=budget.delta, shares=shares)

    def release(self, train: Split, ctx: RunContext) -> tuple[torch.Tensor, torch.Tensor]:
        """The two private releases (Ŝ, n̂); draws the run's random features first."""
        h, dev, k = self.hparams, ctx.device, self.info.num_classes
        noise, features = ctx.generator("noise"), ctx.generator("features", offset=2)
        d = math.prod(self.info.image_shape)
        # the features are public randomness (data-independent), drawn from the run's seed
        self.freqs = torch.randn(h.num_features // 2, d, generator=features, device=dev) / math.sqrt(h.rff_sigma)
        x = (train.images.to(dev) + 1) / 2
        labels = train.labels.to(dev)
        phi_sum = torch.zeros(k, h.num_features, device=dev)
        for i in range(0, len(x), 4096):  # bounded memory: n × D features are never held at once
            phi_sum += label_embedding(random_features(x[i:i + 4096], self.freqs), labels[i:i + 4096], k)

        # sensitivity 1 for both (‖φ(x)‖ = 1, one row per class); each release counts itself in
        # the ledger before its noise is drawn (privacy.release)
        return (GaussianRelease(ctx, SUM, 1.0, noise)(phi_sum),
                GaussianRelease(ctx, COUNT, 1.0, noise)(torch.tensor(float(len(x)), device=dev)))

    def fit(self, train: Split, budget: Budget, ctx: RunContext) -> None:
        h, dev, k = self.hparams, ctx.device, self.info.num_classes
        s_hat, n_hat = self.release(train, ctx)
        n_hat = n_hat.clamp(min=1.0)
        target = s_hat / n_hat  # everything below is post-processing
        data_gen = ctx.generator("latent", offset=1)
        self.G.to(dev).train()
        opt = torch.optim.Adam(self.G.parameters(), lr=h.lr)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=h.lr_decay)
        per_epoch = max(1, int(n_hat.item()) // h.batch_size)
        bar = ctx.progress(total=h.epochs * per_epoch, desc=f"{self.name} generator steps")
        step = 0
        for _ in range(h.epochs):
            for _ in range(per_epoch):
                z = torch.randn(h.batch_size, h.latent_dim, generator=data_gen, device=dev)
                y = torch.randint(0, k, (h.batch_size,), generator=data_gen, device=dev)
                fake = (self.G(z, y) + 1) / 2
                emb = label_embedding(random_features(fake, self.freqs), y, k) / h.batch_size
                loss = ((target - emb) ** 2).sum()
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                step += 1
                bar.update(1)
                if step % h.log_every == 0:
                    ctx.record(step=step, mmd2=loss.item(), lr=sched.get_last_lr()[0])
            sched.step()
        bar.close()
        self.G.cpu().eval()
        self.freqs = self.freqs.cpu()


    def state_dict(self) -> dict:
        return {"G": self.G.state_dict(), "freqs": self.freqs}

    def load_state_dict(self, state: dict) -> None:
        self.G.load_state_dict(state["G"])
        self.freqs = state["freqs"]
