"""White-box Dirac canaries in a DPSGD part's own optimizer: on the
correct part the one-run bound stays below the accountant's ε; with a quarter of the noise
(a planted bug in the part's noise multiplier) it exceeds it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from dpgen_bench.api import PrivacyPart
from dpgen_bench.privacy.accounting import calibrate_noise, privacy_profile
from dpgen_bench.privacy.audit_bounds import best_one_run_bound, profile_rejected
from dpgen_bench.privacy.canaries import DiracCanaries
from dpgen_bench.privacy.dpsgd import make_private, poisson_batch, private_backward
from fake_context import PartContext

EPS, DELTA, Q, T, M, CLIP = 1.0, 1e-5, 0.2, 400, 4000, 0.7


def _audit(noise_scale: float, mode: str, seed: int = 0) -> tuple[float, dict]:
    torch.manual_seed(seed)
    sigma = calibrate_noise(epsilon=EPS, delta=DELTA, sample_rate=Q, steps=T)
    net = nn.Linear(64, 80)  # 5,200 parameters: room for M distinct Dirac coordinates
    ctx = PartContext(sigma * noise_scale)
    gsm, opt = make_private(net, torch.optim.SGD(net.parameters(), lr=0.0), ctx=ctx, part="d", max_grad_norm=CLIP,
                            expected_batch_size=int(Q * 100), grad_sample_mode=mode,
                            noise_generator=torch.Generator().manual_seed(seed + 1))
    canaries = DiracCanaries(opt, M, Q, seed=seed)
    x, y = torch.randn(100, 64), torch.randn(100, 80)
    gen = torch.Generator().manual_seed(seed + 2)
    for _ in range(T):
        idx = poisson_batch(100, Q, gen, torch.device("cpu"))
        opt.zero_grad(set_to_none=True)
        if len(idx):
            loss = ((gsm(x[idx]) - y[idx]) ** 2).mean(1)
            private_backward(gsm, opt, loss)
        else:
            from dpgen_bench.privacy.dpsgd import empty_batch
            empty_batch(gsm)
        opt.step()
    assert ctx.spent == T and canaries.steps == T
    bound = best_one_run_bound(canaries.scores, canaries.included, delta=DELTA, confidence=0.95)
    # the accountant's whole curve for this part (Mahloujifar et al.'s f-DP test)
    profile = privacy_profile([PrivacyPart("d", sigma, Q, T)], DELTA)
    bound["curve_rejected"] = profile_rejected(canaries.scores, canaries.included, profile=profile)["rejected"]
    return sigma, bound


@pytest.mark.parametrize("mode", ["hooks", "bk"])
def test_the_correct_part_stays_below_the_accountant(mode):
    _, bound = _audit(1.0, mode)
    assert bound["epsilon_lower_bound"] <= EPS and not bound["curve_rejected"]


@pytest.mark.parametrize("mode", ["hooks", "bk"])
def test_a_quarter_of_the_noise_is_caught(mode):
    _, bound = _audit(0.25, mode)
    assert bound["epsilon_lower_bound"] > EPS and bound["curve_rejected"], bound


def test_canaries_are_distinct_coordinates_half_included_and_detach():
    net = nn.Linear(10, 10)
    _, opt = make_private(net, torch.optim.SGD(net.parameters(), lr=0.0), ctx=PartContext(1.0), part="d",
                          max_grad_norm=1.0, expected_batch_size=4)
    original = opt.add_noise
    c = DiracCanaries(opt, 100, 0.5, seed=3)
    assert sum(len(pos) for _, pos, _ in c._blocks) == 100 and 30 < c.included.sum() < 70
    from dpgen_bench.errors import UserError

    with pytest.raises(UserError, match="distinct coordinates"):
        DiracCanaries(opt, 111, 0.5, seed=3)
    c.detach()
    assert opt.add_noise == original
    assert np.array_equal(DiracCanaries(opt, 100, 0.5, seed=3).included, c.included)


# ------------------------------------------------------------- gradient sanitisers


def _sanitizer_audit(kind: str, noise_scale: float, seed: int = 0, m: int = 2000) -> dict:
    """The sanitiser's own clip and noise, hook multiplier from the accounted σ as GS-WGAN
    (row-wise: 2√B·σ) and DP-Sinkhorn (whole tensor: 2σ) set it; canaries at rate Q."""
    from methods.dpsinkhorn import BatchGradientSanitizer

    from dpgen_bench.privacy.canaries import SanitizerCanaries
    from dpgen_bench.privacy.sanitizer import GradientSanitizer

    rows, dim = 8, 512
    sigma = calibrate_noise(epsilon=EPS, delta=DELTA, sample_rate=Q, steps=T)
    gen = torch.Generator().manual_seed(seed + 1)
    if kind == "rows":
        san = GradientSanitizer(CLIP, 2 * rows ** 0.5 * sigma * noise_scale, generator=gen, scale=1 / rows)
    else:
        san = BatchGradientSanitizer(CLIP, 2 * sigma * noise_scale, generator=gen)
    canaries = SanitizerCanaries(san, m, Q, seed=seed)
    data = torch.Generator().manual_seed(seed + 2)
    for _ in range(T):
        x = torch.randn(rows, dim, requires_grad=True)
        handle = san.attach(x)
        (x * torch.randn(rows, dim, generator=data)).sum().backward()
        handle.remove()
    assert san.calls == canaries.steps == T
    return best_one_run_bound(canaries.scores, canaries.included, delta=DELTA, confidence=0.95)


@pytest.mark.parametrize("kind", ["rows", "whole"])
def test_a_sanitiser_at_the_accounted_noise_stays_below_the_accountant(kind):
    assert _sanitizer_audit(kind, 1.0)["epsilon_lower_bound"] <= EPS


@pytest.mark.parametrize("kind", ["rows", "whole"])
def test_a_sanitiser_with_a_quarter_of_the_noise_is_caught(kind):
    bound = _sanitizer_audit(kind, 0.25)
    assert bound["epsilon_lower_bound"] > EPS, bound


@pytest.mark.parametrize("m", [40, 150])  # ≤ coordinates: all rows +2C; more: Hadamard signs
def test_sanitiser_canaries_are_orthogonal_worst_case_changes_of_the_clip_geometry(m):
    """Row-wise clipping: one record moves every row by ≤ 2C; one clip of the whole tensor:
    the whole batch by ≤ 2C. Each canary is such a change (from C and the shape, never from
    the noise settings), and canaries are mutually orthogonal."""
    from methods.dpsinkhorn import BatchGradientSanitizer

    from dpgen_bench.privacy.canaries import SanitizerCanaries
    from dpgen_bench.privacy.sanitizer import GradientSanitizer

    batch = torch.zeros(6, 2, 5, 5)  # B = 6 rows (P = 4 Hadamard rows), 50 coordinates per row
    for san, geometry in ((GradientSanitizer(0.7, 123.0), "rows"), (BatchGradientSanitizer(0.7, 123.0), "whole")):
        c = SanitizerCanaries(san, m, 0.5, seed=1)
        c.before_noise(batch)
        d = c.directions()
        flat = d.reshape(m, -1)
        gram = flat @ flat.T
        assert torch.allclose(gram - torch.diag(torch.diag(gram)), torch.zeros_like(gram)), geometry
        if geometry == "rows":
            per_row = d.reshape(m, 6, -1).norm(dim=2)
            assert torch.all(per_row <= 1.4 + 1e-12)
            full = 6 if m <= 50 else 4
            assert torch.allclose(flat.norm(dim=1), torch.full((m,), 1.4 * full ** 0.5, dtype=torch.float64))
        else:
            assert torch.allclose(flat.norm(dim=1), torch.full((m,), 1.4, dtype=torch.float64))
        assert san.canaries is c
        c.detach()
        assert san.canaries is None


def test_sanitiser_canary_scores_read_the_released_batch():
    """A canary's score is ⟨its direction / 2C, released⟩ summed over releases: with no noise
    and a zero gradient, an included, always-sampled canary scores 2C·(its rows) per release."""
    from dpgen_bench.privacy.canaries import SanitizerCanaries
    from dpgen_bench.privacy.sanitizer import GradientSanitizer

    san = GradientSanitizer(0.5, 0.0)
    c = SanitizerCanaries(san, 20, 1.0, seed=0)
    for _ in range(3):
        x = torch.zeros(4, 30, requires_grad=True)
        h = san.attach(x)
        (x * 0).sum().backward()
        h.remove()
    assert np.allclose(c.scores[c.included], 3 * 1.0 * 4) and np.allclose(c.scores[~c.included], 0)
