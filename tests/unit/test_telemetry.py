"""Measured gradient telemetry (dpgen_bench/privacy/telemetry.py): what every kind of private
mechanism reports is the true per-record norm and the exact clipped sum, read before the noise
(plants: reading the noised gradient, or reporting the clip bound instead of the norm, fail here)."""

import math

import pytest
import torch
from torch import nn

from dpgen_bench.privacy.dpsgd import make_private, private_backward, private_chunk
from dpgen_bench.privacy.release import GaussianRelease
from dpgen_bench.privacy.sanitizer import GradientSanitizer
from dpgen_bench.privacy.telemetry import GradientTelemetry, step_stats
from fake_context import PartContext

SIGMA, C = 10.0, 1.0  # loud noise: a telemetry that read the noised gradient would be far off


class ObservedContext(PartContext):
    def __init__(self, noise_multiplier, name="d"):
        super().__init__(noise_multiplier, name)
        self.observed = []

    def observe(self, part, **stats):
        self.observed.append((part, stats))


def _model_and_batch(scale: float, n: int = 12):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 1))
    x, y = torch.randn(n, 5) * scale, torch.randn(n)
    return model, x, y


def _true_per_example(model, x, y):
    """Per-example gradients by autograd, one example at a time: the reference."""
    rows = []
    for i in range(len(x)):
        model.zero_grad()
        ((model(x[i:i + 1]).squeeze(-1) - y[i:i + 1]) ** 2).sum().backward()
        rows.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    model.zero_grad()
    return torch.stack(rows)


@pytest.mark.parametrize("mode", ["hooks", "bk"])
@pytest.mark.parametrize("scale", [0.01, 3.0])  # norms far below C, and above it
@pytest.mark.parametrize("chunks", [1, 3])
def test_dpsgd_part_reports_the_true_norms_and_the_exact_clipped_sum(mode, scale, chunks):
    model, x, y = _model_and_batch(scale)
    ref = _true_per_example(model, x, y)
    norms = ref.norm(dim=1)
    clipped_sum = (ref * (C / norms).clamp(max=1.0)[:, None]).sum(0)
    ctx = ObservedContext(SIGMA)
    gsm, opt = make_private(model, torch.optim.SGD(model.parameters(), lr=0.0), ctx=ctx, part="d",
                            max_grad_norm=C, expected_batch_size=len(x), grad_sample_mode=mode,
                            noise_generator=torch.Generator().manual_seed(1))
    for i, (xc, yc) in enumerate(zip(x.tensor_split(chunks), y.tensor_split(chunks))):
        losses = (gsm(xc).squeeze(-1) - yc) ** 2
        private_chunk(gsm, opt, losses, last=i == chunks - 1)
    assert ctx.spent == 1 and len(ctx.observed) == 1  # one logical step, one observation
    part, s = ctx.observed[0]
    assert part == "d"
    torch.testing.assert_close(s["norms"].sort().values, norms.sort().values, rtol=1e-4, atol=1e-7)
    assert s["clip"] == C
    assert s["clipped_sum_norm"] == pytest.approx(clipped_sum.norm().item(), rel=1e-4)
    d = sum(p.numel() for p in model.parameters())
    assert s["noise_norm"] == pytest.approx(SIGMA * C * math.sqrt(d))
    stats = step_stats(s["norms"], s["clip"], s["clipped_sum_norm"], s["noise_norm"])
    assert stats["median_norm"] == pytest.approx(torch.quantile(norms, 0.5).item(), rel=1e-4)  # not C
    assert stats["clip_fraction"] == pytest.approx((norms > C).float().mean().item())
    # the released (noised) gradient is far from what the telemetry read
    noised = torch.cat([p.grad.flatten() for p in model.parameters()]) * len(x)
    assert (noised - clipped_sum).norm() > 10 * clipped_sum.norm() or scale > 1


def test_sanitizer_reports_the_rows_norms_before_the_noise():
    g = torch.randn(6, 3, 4, generator=torch.Generator().manual_seed(0)) * 0.1
    seen = []
    san = GradientSanitizer(C, SIGMA, generator=torch.Generator().manual_seed(1),
                            observe=lambda part, **s: seen.append((part, s)), part="generator")
    out = san(g)
    (part, s), = seen
    norms = g.flatten(1).norm(dim=1)
    assert part == "generator"
    torch.testing.assert_close(s["norms"], norms)
    assert s["clipped_sum_norm"] == pytest.approx(g.norm().item(), rel=1e-5)  # all rows under C: unclipped
    assert s["noise_norm"] == pytest.approx(SIGMA * C * math.sqrt(g.numel()))
    assert (out - g).norm() > 10 * g.norm()  # the released batch is the noised one


def test_release_reports_the_exact_sum_and_the_records():
    ctx = ObservedContext(SIGMA, name="sums")
    value = torch.tensor([3.0, 4.0])
    out = GaussianRelease(ctx, "sums", 2.0, torch.Generator().manual_seed(0))(value, record_norms=torch.ones(5))
    (part, s), = ctx.observed
    assert s["clipped_sum_norm"] == pytest.approx(5.0) and s["clip"] == 2.0
    assert s["noise_norm"] == pytest.approx(SIGMA * 2.0 * math.sqrt(2)) and len(s["norms"]) == 5
    assert not torch.allclose(out, value)


def test_window_summary_and_the_low_norm_warning(caplog):
    t = GradientTelemetry()
    with caplog.at_level("WARNING", logger="dpgen_bench"):
        for k in range(20):
            t.observe("conv2", norms=torch.full((8,), 0.01 * (k + 1)), clip=1.0, clipped_sum_norm=0.05,
                      noise_norm=1.0)
    warnings = [r for r in caplog.records if "below a tenth of the clip bound" in r.getMessage()]
    assert len(warnings) == 1 and "conv2" in warnings[0].getMessage()  # once per part
    w = t.window()
    assert w["conv2"]["steps"] == 20 and w["conv2"]["noise_to_signal"] == pytest.approx(20.0)
    assert t.window() == {}  # emptied
    s = t.summary()["conv2"]
    assert s["clip_bound"] == 1.0 and s["first"]["median_norm"] == pytest.approx(0.015)
    assert s["last"]["median_norm"] == pytest.approx(0.195) and s["clip_fraction"] == 0.0
    t2 = GradientTelemetry()
    t2.load_state_dict(t.state_dict())  # a resumed run keeps what it measured
    assert t2.summary() == t.summary()


def test_no_warning_when_the_norms_are_at_the_clip_scale(caplog):
    t = GradientTelemetry()
    with caplog.at_level("WARNING", logger="dpgen_bench"):
        t.observe("d", norms=torch.full((8,), 0.5), clip=1.0, clipped_sum_norm=2.0, noise_norm=1.0)
    assert not caplog.records
