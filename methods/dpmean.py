"""DP class means: the floor every table should carry.

Not a generative model from a paper: each class's mean image (and, with ``variance``, its
per-pixel variance) released once with the Gaussian mechanism, and samples drawn as
independent Gaussian pixels around it. A method that cannot beat this at the same (ε, δ)
has learned nothing about the data beyond its class means.

Mechanism (add/remove adjacency, as every other method here). Pixels are mapped to
[0, 1] (x' = (x + 1) / 2) and each image is clipped to L2 norm C = ``max_grad_norm`` (the
name every method gives its clip bound: a class sum is one DP-SGD step's summed gradient of
½‖x' − θ‖² at θ = 0, whose per-record gradient is −x'). Three releases,
each the Gaussian mechanism on the whole training set (sample rate 1, one step):

- ``class_sums``: S_c = Σ_{i in c} clip(x'_i), sensitivity C (one record changes
  one class's row by at most C in L2);
- ``class_counts``: n_c, sensitivity 1;
- ``class_squares`` (with ``variance``): Q_c = Σ_{i in c} clip(x'_i)², sensitivity C
  (0 ≤ x' ≤ 1, so ‖x'²‖₂ ≤ ‖x'‖₂).

Noise: the RDP of a Gaussian release at sample rate 1 is α / (2σ²), so the three compose to
α / (2σ²) with 1/σ² = Σ_k 1/σ_k². σ is calibrated for one release at the target and part k
gets σ_k = σ / √w_k with the weights ``weights`` (Σ w = 1;
``dpgen_bench.privacy.accounting.gaussian_releases``), so the ledger's composition equals
the target's calibration. Labels are private: counts are released
with noise like the sums. The means are S_c / max(n̂_c, 1), variances
Q_c / max(n̂_c, 1) − mean², floored at ``min_std``²; all of it is post-processing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from dpgen_bench.api import Budget, DataInfo, Method, PrivacyPart, RunContext, Split
from dpgen_bench.privacy import release_noise_to_signal
from dpgen_bench.privacy.accounting import gaussian_releases, release_shares
from dpgen_bench.privacy.release import GaussianRelease
from dpgen_bench.settings import NonNegativeFloat, PositiveFloat, check_declared

SUMS, COUNTS, SQUARES = "class_sums", "class_counts", "class_squares"


@dataclass(frozen=True)
class DPMeanHparams:
    max_grad_norm: PositiveFloat = 4.0  # L2 bound on each image in [0, 1] pixel units
    variance: bool = True  # also release per-pixel variances (else samples are mean + fixed noise)
    weights: str = "0.45,0.1,0.45"  # share of the privacy budget (in 1/σ²) of sums, counts, squares
    min_std: NonNegativeFloat = 0.05  # floor of the per-pixel std of samples ([0, 1] units); the std without variance

    def __post_init__(self):
        check_declared(self)
        w = self.shares()
        if len(w) != 3 or not all(0 <= x <= 1 for x in w) or w[0] == 0 or w[1] == 0 or (self.variance and w[2] == 0):
            raise ValueError("weights must be three non-negative numbers (sums, counts, squares); sums and "
                             "counts (and squares with variance) > 0")

    def shares(self) -> tuple[float, ...]:
        return release_shares(self.weights, "three numbers", unused=None if self.variance else 2)


class DPMean(Method):
    """DP class means (and pixel variances) by the Gaussian mechanism: the floor of every table."""

    name = "dpmean"
    private = True
    conditional = True
    Hparams = DPMeanHparams
    renamed_hparams = {"clip": "max_grad_norm"}  # one name per concept across methods
    is_floor = True  # the figures draw it as a band (dpgen_bench.report.figures)
    presets = {
        # digits: C chosen on the validation part at ε = 10 (benchmarks/presets.md)
        "quick": {"digits": dict(max_grad_norm=8.0, samples_per_class=100), "*": dict(samples_per_class=100)},
        "tiny": {"*": dict(samples_per_class=10)},
    }

    def __init__(self, hparams: DPMeanHparams, info: DataInfo):
        super().__init__(hparams, info)
        self.mean = torch.full((info.num_classes, *info.image_shape), 0.5)
        self.std = torch.full_like(self.mean, hparams.min_std)

    def noise_to_signal(self, part: PrivacyPart) -> float:
        """A class's sum (or squares) of d pixels read as the mean of its ~N/k records; a
        class's count as one number over N/k."""
        per_class = self.info.n_train / self.info.num_classes
        d = 1 if part.name == COUNTS else math.prod(self.info.image_shape)
        return release_noise_to_signal(part.noise_multiplier, d, per_class)

    def plan(self, budget: Budget) -> list[PrivacyPart]:
        shares = dict(zip((SUMS, COUNTS, SQUARES), self.hparams.shares()))
        return gaussian_releases(epsilon=budget.epsilon, delta=budget.delta, shares=shares)

    def fit(self, train: Split, budget: Budget, ctx: RunContext) -> None:
        h, dev, gen = self.hparams, ctx.device, ctx.generator("noise")
        x = ((train.images.to(dev).flatten(1) + 1) / 2).clamp(0, 1)
        x = x * (h.max_grad_norm / x.norm(dim=1, keepdim=True).clamp(min=h.max_grad_norm))  # ‖x'ᵢ‖ ≤ C
        onehot = F.one_hot(train.labels.to(dev), self.info.num_classes).to(x.dtype)

        # each release counts itself in the ledger before its noise is drawn (privacy.release)
        sums = GaussianRelease(ctx, SUMS, h.max_grad_norm, gen)(onehot.T @ x)
        counts = GaussianRelease(ctx, COUNTS, 1.0, gen)(onehot.sum(0)).clamp(min=1.0)[:, None]
        mean = (sums / counts).clamp(0, 1)
        std = torch.full_like(mean, h.min_std)
        if h.variance:
            squares = GaussianRelease(ctx, SQUARES, h.max_grad_norm, gen)(onehot.T @ (x * x))
            std = (squares / counts - mean ** 2).clamp(min=h.min_std ** 2).sqrt()
        shape = (self.info.num_classes, *self.info.image_shape)
        self.mean, self.std = mean.view(shape).cpu(), std.view(shape).cpu()
        ctx.record(noisy_counts=counts.flatten().tolist(), mean_std=float(std.mean()))

    def sample(self, n: int, labels: torch.Tensor | None, rng: torch.Generator):
        if labels is None:
            labels = torch.randint(0, self.info.num_classes, (n,), generator=rng)
        labels = labels.long().cpu()
        x = self.mean[labels] + self.std[labels] * torch.randn(n, *self.info.image_shape, generator=rng)
        return (x.clamp(0, 1) * 2 - 1), labels

    def state_dict(self) -> dict:
        return {"mean": self.mean, "std": self.std}

    def load_state_dict(self, state: dict) -> None:
        self.mean, self.std = state["mean"], state["std"]
