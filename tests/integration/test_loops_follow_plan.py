"""The private training loops do what their plans say (a plan that is tested says
nothing of the loop that should follow it). A spy on the Poisson sampler and on the noise every DPSGD optimizer
adds, for every built-in method with such a part: each loop samples the whole training
split at exactly its parts' planned rates, as many times as the parts have steps, and adds
noise of std σ·C with the planned σ. The clipping norm is 0.7, not 1, so that a noise std
that forgot C (or used C²) is visible."""

from __future__ import annotations

import importlib
from collections import Counter

import opacus.optimizers.optimizer as opacus_optimizer
import opacus.optimizers.optimizer_fast_gradient_clipping as opacus_fast
import pytest

from dpgen_bench import runner
from dpgen_bench.config import build_config

CLIP = 0.7
LOOPS = {"dpgan": "methods.dpgan", "dpaf": "methods.dpaf.core", "dpsinkhorn": "methods.dpsinkhorn",
         "dpdm": "methods.dpdm"}
DPSGD_PARTS = {"dpgan": ("discriminator",), "dpaf": ("conv1", "conv2"), "dpsinkhorn": (), "dpdm": ("denoiser",)}
# dpdm with DP-FETA's warm start: the central images' queries sample at their own rate too
VARIANTS = {"dpdm": [["warmup=central", "central_batch=700", "central_sigma=20", "warmup_steps=2"]]}
CASES = [(m, []) for m in sorted(LOOPS)] + [(m, v) for m, vs in VARIANTS.items() for v in vs]


@pytest.mark.parametrize("method,extra", CASES, ids=[m + ("+" + x[0] if x else "") for m, x in CASES])
def test_the_loop_samples_and_noises_as_planned(method, extra, monkeypatch, tmp_path):
    module = importlib.import_module(LOOPS[method])
    draws: list[tuple[int, float]] = []
    stds: list[float] = []
    real_sampler = module.poisson_batch

    def sampler(n, rate, *a, **k):
        draws.append((n, rate))
        return real_sampler(n, rate, *a, **k)

    def noise_spy(real):
        def spy(std, reference, *a, **k):
            stds.append(float(std))
            return real(std, reference, *a, **k)
        return spy

    monkeypatch.setattr(module, "poisson_batch", sampler)
    for mod in (opacus_optimizer, opacus_fast):
        monkeypatch.setattr(mod, "_generate_noise", noise_spy(mod._generate_noise))
    cfg = build_config(method, "digits", epsilon=5.0, preset="tiny", sets=[f"max_grad_norm={CLIP}", *extra], evaluators=[],
                       device="cpu")
    p = runner.prepare(cfg)
    runner.execute(p, tmp_path / "run")
    parts = {x.name: x for x in p.ledger.report().parts}

    # every draw is from the whole training split, at a planned rate, once per planned step
    assert draws and {n for n, _ in draws} == {len(p.data.train)}
    expected = Counter()
    for part in parts.values():
        if part.steps and part.sample_rate < 1:
            expected[part.sample_rate] += part.steps
    assert Counter(rate for _, rate in draws) == expected

    # every DPSGD noise draw has std σ·C of one of the method's DPSGD parts (one per parameter)
    want = {parts[name].noise_multiplier * CLIP for name in DPSGD_PARTS[method]}
    assert set(round(s, 12) for s in stds) == set(round(s, 12) for s in want)
