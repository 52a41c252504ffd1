"""The smallest complete method: per-class mean images released by the Gaussian mechanism.

The example of docs/adding-a-method.md to copy (and a fast method for tests, hidden from
``bench list``). Each row is an image clipped to L2 norm C/√2 followed by the constant
C/√2 (so ‖row‖ ≤ C, C = ``max_grad_norm``); one release is every class's row sum plus
N(0, (σ·C)²): adding or removing one image moves it by at most C in L2, so σ is the noise
multiplier the accountant expects, and the last coordinate is a noisy class count.
``steps`` releases compose; samples are the last release's mean plus N(0, 0.1²) noise.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dpgen_bench.api import Budget, DataInfo, Method, PrivacyPart, RunContext, Split
from dpgen_bench.privacy import calibrate_noise
from dpgen_bench.settings import PositiveFloat, PositiveInt

PART = "class_sums"


@dataclass(frozen=True)
class DummyHparams:
    steps: PositiveInt = 5  # releases of the class sums (a range, declared: bench list settings dummy)
    max_grad_norm: PositiveFloat = 1.0  # L2 bound per image


class Dummy(Method):
    """Gaussian-mechanism class means."""

    name = "dummy"
    Hparams = DummyHparams
    # the suite's preset: a run key only (samples per class: docs/adding-a-method.md, "Run keys")
    presets = {"tiny": {"*": {"samples_per_class": 5}}}

    def __init__(self, hparams: DummyHparams, info: DataInfo):
        super().__init__(hparams, info)
        self.means = torch.zeros(info.num_classes, *info.image_shape)

    def plan(self, budget: Budget) -> list[PrivacyPart]:
        h = self.hparams  # one Gaussian release per step on the whole dataset (sample rate 1)
        sigma = calibrate_noise(epsilon=budget.epsilon, delta=budget.delta, sample_rate=1.0, steps=h.steps)
        return [PrivacyPart(PART, noise_multiplier=sigma, sample_rate=1.0, steps=h.steps)]

    def fit(self, train: Split, budget: Budget, ctx: RunContext) -> None:
        h, noise = self.hparams, ctx.generator("noise")
        sigma = ctx.part(PART).noise_multiplier
        c = h.max_grad_norm / 2 ** 0.5
        x = train.images.flatten(1).to(ctx.device)
        x = torch.cat([x * (c / x.norm(dim=1, keepdim=True).clamp(min=c)),
                       torch.full((len(x), 1), c, device=x.device)], 1)
        onehot = torch.nn.functional.one_hot(train.labels.to(ctx.device), self.info.num_classes).float()
        for step in range(h.steps):
            ctx.spend(PART)  # counted before the release is used
            noise_ = torch.randn(len(onehot.T), x.shape[1], generator=noise, device=x.device)
            sums = onehot.T @ x + sigma * h.max_grad_norm * noise_
            counts = (sums[:, -1:] / c).clamp(min=1)  # the noisy class sizes
            self.means = (sums[:, :-1] / counts).view(-1, *self.info.image_shape).cpu()
            ctx.record(step=step + 1)

    def sample(self, n: int, labels: torch.Tensor | None, rng: torch.Generator):
        if labels is None:
            labels = torch.randint(0, self.info.num_classes, (n,), generator=rng)
        noise = 0.1 * torch.randn(n, *self.info.image_shape, generator=rng)
        return (self.means[labels] + noise).clamp(-1, 1), labels

    def state_dict(self) -> dict:
        return {"means": self.means}

    def load_state_dict(self, state: dict) -> None:
        self.means = state["means"]
