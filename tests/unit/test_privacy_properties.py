"""Privacy property suite: for every registered private method × preset × dataset of that
preset × ε × δ, the calibrated plan's composed ε (RDP) is ≤ the target and PRV ≤ RDP
(+ tolerance; PRV is n/a for parts sampled without replacement). Calibration only, no
training. The full grid is `slow`; the default suite runs it at ε ∈ {1, 10}, δ = 1e-5, with
PRV at ε = 1."""

import itertools
import math

import pytest

from dpgen_bench import registry
from dpgen_bench.api import Budget, DataInfo
from dpgen_bench.config import resolve_hparams
from dpgen_bench.errors import UserError
from dpgen_bench.privacy import compose_prv, compose_rdp
from dpgen_bench.privacy.accounting import POISSON
from dpgen_bench.data.standard import STANDARD_SPLITS

# The sizes of the datasets the presets name (train split, image shape, classes), so that
# paper presets can be calibrated without the files: the standard splits `bench privacy`
# plans with, plus digits and CelebA-Hair (whose count is read from its label files: an
# order-of-magnitude stand-in here).
DATASETS = {name: (s.n_train, s.image_shape, s.num_classes) for name, s in STANDARD_SPLITS.items()} | {
    "digits": (1437, (1, 16, 16), 10),
    "celeba-hair": (90_000, (3, 64, 64), 3),
}
EPS_ALL = (0.2, 0.5, 1, 2, 5, 10, 50)
DELTA_ALL = (1e-5, 1e-6)


def cases():
    out = []
    for name in registry.methods.names(include_hidden=True):
        cls = registry.methods.get(name)
        if not cls.private:
            continue
        for preset, per_dataset in cls.presets.items():
            for ds in per_dataset:
                out.append((name, preset, "digits" if ds == "*" else ds))
    return out


CASES = cases()


def check(method, preset, dataset, eps, delta, prv_max_steps=None, overrides=None):
    cls = registry.methods.get(method)
    n, shape, k = DATASETS[dataset]
    hp, _ = resolve_hparams(cls, preset, dataset, overrides or {})
    try:
        m = cls(hp, DataInfo(dataset, shape, k, n))
    except ValueError as e:  # an architecture that does not support this size
        pytest.skip(str(e))
    try:
        parts = m.plan(Budget(eps, delta))
    except UserError as e:  # e.g. a fixed noise that allows no step at this ε: refused, never overspent
        # (dpaf's absolute default split (0.1, ×, 0.1) leaves nothing for conv2* at ε = 0.2)
        assert any(s in str(e) for s in ("allows no step", "too low", "leaves nothing")), e
        return
    assert parts and all(p.steps > 0 and p.noise_multiplier > 0 and 0 < p.sample_rate <= 1 for p in parts)
    rdp = compose_rdp(parts, delta)
    assert rdp <= eps, (method, preset, dataset, eps, delta, rdp)
    if any(p.mechanism != POISSON for p in parts):  # prv-accountant has no sampling without replacement
        assert math.isnan(compose_prv(parts, delta))
    elif prv_max_steps is None or sum(p.steps for p in parts) <= prv_max_steps:
        prv = compose_prv(parts, delta)  # NaN only where prv-accountant fails (large ε, low σ)
        assert prv <= rdp + 0.05 * eps + 0.02 or (math.isnan(prv) and eps >= 10), (prv, rdp)


@pytest.mark.parametrize("method,preset,dataset", CASES, ids=["-".join(c) for c in CASES])
@pytest.mark.parametrize("eps", (1, 10))
def test_calibrated_plan_within_target(method, preset, dataset, eps):
    # PRV beside RDP at ε = 1 only (≤ 20,000 steps): prv-accountant's discretisation is ~85 % of
    # a case's time now that the RDP series is fast; the full grid (-m slow) checks it at every ε
    check(method, preset, dataset, eps, 1e-5, prv_max_steps=20_000 if eps == 1 else 0)


@pytest.mark.slow
@pytest.mark.parametrize("method,preset,dataset", CASES, ids=["-".join(c) for c in CASES])
def test_calibrated_plan_within_target_full_grid(method, preset, dataset):
    for eps, delta in itertools.product(EPS_ALL, DELTA_ALL):
        check(method, preset, dataset, eps, delta)


@pytest.mark.slow
@pytest.mark.parametrize("preset,dataset", [c[1:] for c in CASES if c[0] == "dpaf"])
def test_dpaf_percentage_split_full_grid(preset, dataset):
    """The percentage split scales with ε, so small ε (refused by the absolute default) is
    planned and checked too."""
    for eps, delta in itertools.product(EPS_ALL, DELTA_ALL):
        check("dpaf", preset, dataset, eps, delta, overrides={"budget_split": "10%,40%,50%"})


def test_every_dataset_a_preset_names_is_in_the_grid():
    """Every preset of every private method is a case, and check() needs its dataset's size
    here: a dataset missing from DATASETS fails, never skips (until 2026-11-26 cases() dropped
    such presets without a word, and mnist-5k's went unchecked)."""
    named = {c[2] for c in CASES}
    assert named <= set(DATASETS), sorted(named - set(DATASETS))


def test_every_private_method_is_covered():
    covered = {c[0] for c in CASES}
    private = {n for n in registry.methods.names() if registry.methods.get(n).private}
    assert private <= covered
