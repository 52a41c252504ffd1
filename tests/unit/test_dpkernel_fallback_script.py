"""``benchmarks/dpkernel_fallback.py``: its per-batch trial on tiny synthetic batches. A
generator collapsed onto one blank image per class makes DPImageBench's K singular: the
dpimagebench draw is dropped (the Cholesky is what fails, in float32 and in float64), while the
sound Gaussian-process draw at the same points still adds noise; distinct, well separated images
are never dropped. The trial builds K with ``methods.dpkernel``'s own functions, so a change there
that the script no longer fits fails here."""

import math
import sys
from pathlib import Path

import torch

from methods.dpkernel import JITTER_START, dpimagebench_gram, gp_draw
from methods.dpkernel import dpimagebench_coeff as step_coeff

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
from dpkernel_fallback import (markdown, measure, noise_outcome, sound_jitter, step_kernel,  # noqa: E402
                               trial)

WIDTHS = (8.0, 16.0)
SHAPE = (1, 4, 4)
CLASSES = 3


def _distinct(n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, *SHAPE, generator=g) * 2 - 1


def test_a_collapsed_generator_makes_the_dpimagebench_draw_drop_its_noise_and_the_sound_one_does_not():
    x, lx = _distinct(4), torch.tensor([0, 1, 2, 0])
    y, ly = -torch.ones(4, *SHAPE), torch.full((4,), 1)  # G drew one blank image for four points of class 1
    # σ = |S| makes coeff = √(2m)/|S|·σ = 2 and the blank block of K·coeff exactly 4 everywhere
    assert step_coeff(WIDTHS, len(x), sigma=4.0) == 2.0
    out = trial(x, lx, y, ly, WIDTHS, CLASSES, sigma=4.0, generator=torch.Generator().manual_seed(0))
    for dtype in ("f32", "f64"):  # an exactly singular K: precision does not save it
        assert out[f"{dtype}_xy"]["dropped"] and out[f"{dtype}_xy"]["cholesky_failed"], out
        assert out[f"{dtype}_xy"]["noise_norm"] == 0.0  # no noise at all: the bare except's zeros
        assert not out[f"{dtype}_xx"]["dropped"], out  # the real block alone is fine
    # the sound draw at the same generated points: noise at every point, of the GP's variance
    # scale²·k(y, y) = scale²·m at each value (equal points: equal values), whatever K is
    vals, grads = gp_draw(y.flatten(1), ly, WIDTHS, scale=0.1, generator=torch.Generator().manual_seed(1), draws=4000)
    assert torch.isfinite(vals).all() and torch.isfinite(grads).all()
    assert (grads.norm(dim=2) > 0).all()
    var = vals.var(dim=0)
    assert torch.allclose(var, torch.full_like(var, 0.01 * len(WIDTHS)), rtol=0.1), var
    assert (vals - vals[:, :1]).abs().max() < 1e-3 * vals.abs().max()
    assert sound_jitter(y, ly, WIDTHS) >= JITTER_START

def test_distinct_separated_images_are_never_dropped_and_the_kernel_is_the_modes():
    x, lx = _distinct(6, seed=2), torch.tensor([0, 1, 2, 0, 1, 2])
    y, ly = _distinct(6, seed=3), torch.tensor([2, 1, 0, 2, 1, 0])
    k = step_kernel(x, lx, y, ly, (0.5,), CLASSES)
    assert k.dtype == torch.float32 and k.shape == (12, 12)
    zs = torch.cat([x.flatten(1), y.flatten(1)])
    onehot = torch.nn.functional.one_hot(torch.cat([lx, ly]), CLASSES).float()
    assert torch.equal(k, dpimagebench_gram(zs, onehot, (0.5,)))
    out = trial(x, lx, y, ly, (0.5,), CLASSES, sigma=1.0, generator=torch.Generator().manual_seed(0))
    assert not any(o["dropped"] for o in out.values()), out
    assert all(o["noise_norm"] > 0 for o in out.values())
    assert noise_outcome(k, step_coeff((0.5,), 6, 1.0), torch.Generator().manual_seed(0))["noise_norm"] > 0
    assert math.isclose(step_coeff((1.0, 2.0), 10, 3.0), 2 / 10 * 3.0)


def test_measure_runs_through_the_harness_and_the_table_renders_the_counts():
    # the harness' own small digits data and tiny preset stand in for mnist (same calls: config, prepare, plan)
    rows = measure("tiny", batches=2, eps=1.0, seed=0, sets=("8", "8,16"), dataset="digits")
    assert [r.bandwidths for r in rows] == ["8", "8,16"] and all(r.batches == 2 for r in rows)
    assert all(set(r.dropped) == {"f32_xy", "f32_xx", "f64_xy", "f64_xx"} for r in rows)
    assert all(r.sigma > 0 for r in rows)
    table = markdown(rows).splitlines()
    assert len(table) == 4 and table[2].startswith("| tiny | init | 32 (")
