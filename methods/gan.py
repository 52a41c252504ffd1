"""Non-private reference GAN (ε = ∞): the same conditional DCGAN and training loop as
``dpgan`` without clipping or noise, as the non-private rows of Private GANs Table 2
(App. B.1: 45K steps, n_D = 1, B = 128, Poisson sampling kept)."""

from __future__ import annotations

from dpgen_bench.api import Budget, PrivacyPart
from dpgen_bench.errors import UserError

from .dpgan import DPGAN


class GAN(DPGAN):
    """Non-private conditional DCGAN (ε = ∞), the reference row of every table."""

    name = "gan"
    private = False
    presets = {
        "quick": {"digits": dict(DPGAN.presets["quick"]["digits"], n_d=1),
                  # dpgan's digits nets, T = 1,000: dpgan's narrower ones are for the noise (benchmarks/presets.md)
                  "mnist-5k": dict(DPGAN.presets["quick"]["digits"], steps=1000, n_d=1),
                  # B = 32: as good on val in 2/3 of B = 64's time (presets.md, "The demo on full MNIST")
                  "mnist": dict(DPGAN.presets["quick"]["digits"], steps=1000, n_d=1, batch_size=32)},
        # dpgan's `long` networks and schedule without the noise: that column's non-private reference (presets.md)
        "long": {"mnist": dict(DPGAN.presets["long"]["mnist"])},
        "tiny": {"*": dict(DPGAN.presets["tiny"]["*"], n_d=1)},
        # copies a small member set: MIA's and `bench audit`'s positive control (benchmarks/presets.md, "gan")
        "memorise": {"digits": dict(DPGAN.presets["quick"]["digits"], n_d=1, steps=5000, g_width=64,
                                    lr_g=1e-3, lr_d=2e-4)},
        "paper": {
            "mnist": dict(batch_size=128, steps=45_000, n_d=1, samples_per_class=6000),
            "fashion-mnist": dict(batch_size=128, steps=45_000, n_d=1, samples_per_class=6000),
            "celeba-gender-32": dict(batch_size=128, steps=45_000, n_d=1, samples_per_class=30_000),
        },
    }

    def plan(self, budget: Budget) -> list[PrivacyPart]:
        if self.hparams.steps is None:
            raise UserError(f"'{self.name}' needs --set steps=N")
        return []
