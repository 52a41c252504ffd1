"""GS-WGAN's white-box audit at the mechanism level, against both of its accountants: the
method's own plan (σ, rate 1/K, compositions per step) and hook noise
(``GSWGAN.hook_noise_multiplier``), the sanitiser, and canaries that move every one of a
release's B rows by 2C when drawn (rate 1/K, ~T/K draws each), scored by each release's
likelihood ratio (``privacy.canaries.mixture_log_ratio``); random rows stand in for D_k's
gradients. GS-WGAN's per-row accounting (``privacy_mode=paper``) is rejected, the sound one
holds. Planted by hand, each of the two bugs below made its test fail (docs/auditing.md):

- canaries that move one row (norm 2C, as if each row were sampled on its own): the audit of
  paper mode no longer rejects;
- the sound mode's hook at paper mode's per-row noise 2σ·C instead of 2√B·σ·C: the audit of
  the sound mode rejects it.

The setting (K = 2,000, T = 1,000, B = 32, 4,000 canaries, ε = 1) is one with a strong effect
and few releases; on digits, through ``bench audit``, see tests/integration/test_audit_white_box.py."""

from __future__ import annotations

import pytest
import torch

from dpgen_bench.api import Budget, DataInfo
from dpgen_bench.audit_run import TESTS_PER_ATTACK, per_attack_confidence
from dpgen_bench.privacy.accounting import privacy_profile
from dpgen_bench.privacy.audit_bounds import best_one_run_bound, profile_rejected
from dpgen_bench.privacy.canaries import SanitizerCanaries
from dpgen_bench.privacy.sanitizer import GradientSanitizer
from methods.gswgan import GSWGAN, GSWGANHparams

EPS, DELTA, K, T, B, M = 1.0, 1e-5, 2000, 1000, 32, 4000
INFO = DataInfo("digits-like", (1, 16, 16), 10, 60_000)  # 256 coordinates × 32 rows: room for M canaries
SMALL = dict(latent_dim=4, g_width=4, d_width=4, embed_dim=4, g_spectral_norm=False, d_spectral_norm=False)


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/unit/conftest.py


def _audit(mode: str, seed: int = 0) -> dict:
    method = GSWGAN(GSWGANHparams(num_discriminators=K, batch_size=B, steps=T, privacy_mode=mode, **SMALL), INFO)
    (part,) = method.plan(Budget(EPS, DELTA))
    san = GradientSanitizer(1.0, method.hook_noise_multiplier(part.noise_multiplier),
                            generator=torch.Generator().manual_seed(seed + 1), scale=1 / B)
    san.canaries_score = "mixture"  # as GSWGAN.fit sets it
    canaries = SanitizerCanaries(san, M, part.sample_rate, seed=seed)
    rows = torch.Generator().manual_seed(seed + 2)
    for _ in range(T):
        san(torch.randn(B, *INFO.image_shape, generator=rows) * 0.1)  # D_k's gradients: rows of norm ~1.6, clipped
    assert canaries.steps == T and part.steps == T * method.compositions_per_step
    confidence = per_attack_confidence(0.95, TESTS_PER_ATTACK)  # one part, as bench audit --white-box tests it
    bound = best_one_run_bound(canaries.scores, canaries.included, delta=DELTA, confidence=confidence)
    profile = privacy_profile([part], DELTA)
    bound["curve_rejected"] = profile_rejected(canaries.scores, canaries.included, profile=profile,
                                               confidence=confidence)["rejected"]
    bound["sigma"] = part.noise_multiplier
    return bound


def test_the_per_row_accounting_of_gswgan_is_rejected():
    """Paper mode: σ = 1.13 at ε = 1 by T·B Theorem-9 compositions; a draw moves the release by
    2C√B against noise 2σC, μ = √B/σ ≈ 5 per draw (the accountant assumes 1/σ per row)."""
    bound = _audit("paper")
    assert bound["epsilon_lower_bound"] > EPS and bound["curve_rejected"], bound


def test_the_sound_accounting_of_gswgan_holds():
    """Sound mode: σ = 0.81 by T Theorem-27 compositions, hook noise 2√B·σC: μ = 1/σ ≈ 1.2 per draw."""
    bound = _audit("sound")
    assert bound["epsilon_lower_bound"] <= EPS and not bound["curve_rejected"], bound


def test_a_canary_moves_every_row_by_2C_and_drawn_canaries_score_high():
    """Directions 2C on every row (one per coordinate and Hadamard sign pattern), and the
    mixture score separates the canaries drawn in a release from the rest."""
    san = GradientSanitizer(0.5, 1.0, generator=torch.Generator().manual_seed(0))
    san.canaries_score = "mixture"
    c = SanitizerCanaries(san, 400, 0.2, seed=0)  # 64 coordinates × 8 sign patterns
    for _ in range(5):
        san(torch.zeros(8, 1, 8, 8))
    d = c.directions().reshape(400, 8, -1)
    assert torch.allclose(d.norm(dim=2), torch.full((400, 8), 1.0, dtype=torch.float64))
    assert c.score_kind == "mixture" and c.steps == 5
    # ~1 draw per included canary at μ = 2C·√8 / C ≈ 2.8: their ratios sum far above the others'
    assert c.scores[c.included].mean() > c.scores[~c.included].mean() + 1
