"""``poisson_batch``: each of n indices independently with probability q, from the run's own
generator (a sampler that draws a fixed size, another rate or from the global RNG would change
the mechanism the accountant composes, or the run's reproducibility)."""

import math

import pytest
import torch

from dpgen_bench.privacy.dpsgd import poisson_batch

CPU = torch.device("cpu")


def test_sizes_and_inclusions_follow_the_rate():
    n, q, draws = 2_000, 0.05, 400
    gen = torch.Generator().manual_seed(0)
    sizes, counts = [], torch.zeros(n)
    for _ in range(draws):
        idx = poisson_batch(n, q, gen, CPU)
        assert idx.dim() == 1 and idx.dtype == torch.int64
        assert torch.equal(idx, idx.unique()) and (idx.numel() == 0 or (0 <= idx.min() and idx.max() < n))
        sizes.append(idx.numel())
        counts[idx] += 1
    mean, var = sum(sizes) / draws, n * q * (1 - q)
    assert abs(mean - n * q) < 5 * math.sqrt(var / draws)  # Binomial(n, q) sizes
    assert abs(torch.tensor(sizes, dtype=torch.float).var().item() / var - 1) < 0.3  # not a fixed size
    assert abs(counts.mean().item() / draws - q) < 0.002  # every index at rate q
    assert counts.min() > 0  # no index left out of the sampling


@pytest.mark.parametrize("q,expected", [(0.0, 0), (1.0, 10)])
def test_rate_zero_draws_nothing_and_rate_one_everything(q, expected):
    assert poisson_batch(10, q, torch.Generator().manual_seed(1), CPU).numel() == expected


def test_draws_come_from_the_given_generator_only():
    state = torch.random.get_rng_state()
    a = poisson_batch(1_000, 0.1, torch.Generator().manual_seed(7), CPU)
    torch.manual_seed(123)  # the global RNG must not matter
    b = poisson_batch(1_000, 0.1, torch.Generator().manual_seed(7), CPU)
    assert torch.equal(a, b)
    torch.random.set_rng_state(state)
    before = torch.random.get_rng_state()
    poisson_batch(1_000, 0.1, torch.Generator().manual_seed(8), CPU)
    assert torch.equal(before, torch.random.get_rng_state())
