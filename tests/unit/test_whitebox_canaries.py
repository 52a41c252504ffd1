"""White-box Dirac canaries in a DPSGD part's own optimizer (issue 30, items 1 and 3): on the
correct part the one-run bound stays below the accountant's ε; with a quarter of the noise
(a planted bug in the part's noise multiplier) it exceeds it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from dpgen_bench.privacy.accounting import calibrate_noise
from dpgen_bench.privacy.audit import best_one_run_bound
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
    return sigma, best_one_run_bound(canaries.scores, canaries.included, delta=DELTA, confidence=0.95)


@pytest.mark.parametrize("mode", ["hooks", "bk"])
def test_the_correct_part_stays_below_the_accountant(mode):
    _, bound = _audit(1.0, mode)
    assert bound["epsilon_lower_bound"] <= EPS


@pytest.mark.parametrize("mode", ["hooks", "bk"])
def test_a_quarter_of_the_noise_is_caught(mode):
    _, bound = _audit(0.25, mode)
    assert bound["epsilon_lower_bound"] > EPS, bound


def test_canaries_are_distinct_coordinates_half_included_and_detach():
    net = nn.Linear(10, 10)
    _, opt = make_private(net, torch.optim.SGD(net.parameters(), lr=0.0), ctx=PartContext(1.0), part="d",
                          max_grad_norm=1.0, expected_batch_size=4)
    original = opt.add_noise
    c = DiracCanaries(opt, 100, 0.5, seed=3)
    assert sum(len(pos) for _, pos, _ in c._blocks) == 100 and 30 < c.included.sum() < 70
    with pytest.raises(ValueError, match="distinct coordinates"):
        DiracCanaries(opt, 111, 0.5, seed=3)
    c.detach()
    assert opt.add_noise == original
    assert np.array_equal(DiracCanaries(opt, 100, 0.5, seed=3).included, c.included)
