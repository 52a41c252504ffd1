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
    # measured by make demo and the claims runs, 2026-11-25 (Method.preset_seconds)
    preset_seconds = {"quick": {"mnist-5k": 93}}
    presets = {
        "quick": {"digits": dict(DPGAN.presets["quick"]["digits"], n_d=1),
                  # mnist-5k: the width-32 nets for T = 1,000 steps (0.65 gen2real CNN on the
                  # validation part, ~100 s on one core; dpgan's narrower quick nets are tuned for the noise)
                  "mnist-5k": dict(DPGAN.presets["quick"]["digits"], steps=1000, n_d=1)},
        "tiny": {"*": dict(DPGAN.presets["tiny"]["*"], n_d=1)},
        # A GAN that memorises a small member set (``--members 64``): the positive control
        # of the GAN-Leaks sanity check. The quick preset's D overpowers G on 64 images
        # (d_fake_acc = 1) and G never copies them (full black-box AUC 0.62-0.71 at
        # 3K-12K steps); a wider, faster G with a slower D does (0.96 at 5K steps). Also the
        # positive control of ``bench audit`` (``--members 16 --canaries 256``: ε ≥ 2.6 at 95 %).
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
