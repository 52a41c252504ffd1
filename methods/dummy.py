"""A tiny method for tests only (hidden from ``bench list``).

It releases per-class mean images through the Gaussian mechanism (clip each image to L2
norm 1, sum, add N(0, σ²)), one release per step, so the ledger and accounting paths are
exercised by a real mechanism. ``overspend`` makes it take more steps than calibrated: the
runner must fail such a run.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dpgen_bench.api import Budget, DataInfo, Method, PrivacyPart, PrivacyReport, RunContext, Split
from dpgen_bench.privacy import calibrate_noise


@dataclass(frozen=True)
class DummyHparams:
    steps: int = 5
    overspend: int = 0


class Dummy(Method):
    """Test-only: Gaussian-mechanism class means."""

    name = "dummy"
    Hparams = DummyHparams
    presets = {"quick": {"*": {}}, "tiny": {"*": {"samples_per_class": 5}}}

    def __init__(self, hparams: DummyHparams, info: DataInfo):
        super().__init__(hparams, info)
        self.means = torch.zeros(info.num_classes, *info.image_shape)

    def plan(self, budget: Budget) -> list[PrivacyPart]:
        sigma = calibrate_noise(target_epsilon=budget.epsilon, target_delta=budget.delta, sample_rate=1.0,
                                steps=self.hparams.steps)
        return [PrivacyPart("class_means", sigma, 1.0, self.hparams.steps)]

    def fit(self, train: Split, budget: Budget, ctx: RunContext) -> PrivacyReport:
        (part,) = ctx.ledger.planned.values()
        x = train.images.flatten(1)
        x = x / x.norm(dim=1, keepdim=True).clamp(min=1.0)
        for _ in range(self.hparams.steps + self.hparams.overspend):
            ctx.ledger.spend(part.name)
            for c in range(self.info.num_classes):
                s = x[train.labels == c].sum(0) + torch.randn(x.shape[1]) * part.noise_multiplier
                self.means[c] = (s / max(1, int((train.labels == c).sum()))).view(self.info.image_shape)
            ctx.record(step=1)
        return ctx.ledger.report()

    def sample(self, n, labels, rng):
        labels = labels if labels is not None else torch.randint(0, self.info.num_classes, (n,), generator=rng)
        return (self.means[labels] + 0.1 * torch.randn(n, *self.info.image_shape, generator=rng)).clamp(-1, 1), labels

    def state_dict(self):
        return {"means": self.means}

    def load_state_dict(self, state):
        self.means = state["means"]
