"""``privacy.release.GaussianRelease``: the one-shot Gaussian release of a sum (dpmean, dpmerf,
DPAF's DPAGG). Its noise is σ·Δ with Δ ≠ 1 (a std that forgot Δ, or squared it, shows), it
counts its step before the noise is drawn, it announces itself to a white-box audit, and its
canaries sit at distinct coordinates, Δ each, scored on the release minus the clean sum."""

import numpy as np
import pytest
import torch

from fake_context import PartContext

from dpgen_bench.privacy.canaries import GradientAudit
from dpgen_bench.privacy.release import GaussianRelease


class _Ctx(PartContext):
    def __init__(self, sigma, audit=None):
        super().__init__(sigma, name="sums")
        self.audit = audit

    def watch(self, name, mechanism):
        if self.audit is not None:
            self.audit.watch(name, self.part(name), mechanism)


def test_noise_std_is_sigma_times_sensitivity_and_the_step_is_counted_first(monkeypatch):
    ctx = _Ctx(0.8)
    rel = GaussianRelease(ctx, "sums", sensitivity=3.5, generator=torch.Generator().manual_seed(0))
    counted_at_draw = []
    real = GaussianRelease.noise
    monkeypatch.setattr(GaussianRelease, "noise", lambda self, like: counted_at_draw.append(ctx.spent) or real(self, like))
    value = torch.full((200_000,), 7.0)
    out = rel(value)
    assert counted_at_draw == [1] and ctx.spent == 1 and rel.calls == 1  # counted before the noise exists
    assert (out - value).std().item() == pytest.approx(0.8 * 3.5, rel=0.01)
    assert abs((out - value).mean().item()) < 0.02
    with pytest.raises(ValueError):
        GaussianRelease(ctx, "sums", sensitivity=0.0, generator=torch.Generator())


def test_canaries_fit_the_release_and_are_scored_on_release_minus_clean_sum():
    """With no noise, an included canary scores exactly Δ at every release it was sampled
    in (the clean sum is subtracted), an excluded one 0; a release smaller than the number
    of canaries gets one per coordinate; one number is too small (not audited)."""
    audit = GradientAudit(m=50, seed=3)
    ctx = _Ctx(0.0, audit)
    rel = GaussianRelease(ctx, "sums", sensitivity=2.5, generator=torch.Generator().manual_seed(1))
    value = torch.randn(20) * 100  # the data's own sums, ≫ Δ
    for _ in range(3):
        rel(value)
    canaries = audit.parts["sums"]
    assert len(canaries.included) == 20 and canaries.steps == 3 and canaries.shift == 2.5  # fit to 20 coordinates
    assert np.allclose(canaries.scores[~canaries.included], 0.0)
    assert np.allclose(canaries.scores[canaries.included], 3 * 2.5)  # sample rate 1: in every release

    audit2 = GradientAudit(m=50, seed=3)
    rel2 = GaussianRelease(_Ctx(0.0, audit2), "sums", sensitivity=1.0, generator=torch.Generator())
    rel2(torch.tensor(5.0))
    assert audit2.parts["sums"].too_small and audit2.parts["sums"].steps == 0
