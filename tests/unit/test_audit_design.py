"""The design of ``bench audit`` around the one-run bound: a plan that
does not depend on which canaries were drawn in, one confidence for all attacks together,
no mean of lower bounds in the report, canaries never counted as MIA members, and no
canary sharing an image."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from dpgen_bench import runner
from dpgen_bench.audit_run import per_attack_confidence
from dpgen_bench.config import build_config
from dpgen_bench.data import load_dataset
from dpgen_bench.report import table as T


def _parts(p):
    return [(x.name, x.noise_multiplier, x.sample_rate, x.steps) for x in p.ledger.report().parts]


def test_the_plan_does_not_depend_on_which_canaries_were_drawn_in():
    """Fault 1: N (so q and σ) was N0 + (number included), a function of the inclusion draw."""
    plans, included = [], []
    for seed in range(4):
        p = runner.prepare(build_config("dpgan", "digits", epsilon=1.0, preset="tiny", canaries=200, seed=seed,
                                        device="cpu"))
        included.append(int(p.data.canary_included.sum()))
        assert p.method.info.n_train == 1437 + 200  # N0 + m, every canary counted
        assert len(p.data.train) == 1437 + included[-1]
        plans.append(_parts(p))
    assert len(set(included)) > 1  # the draws differ ...
    assert all(plan == plans[0] for plan in plans)  # ... the mechanism does not
    assert plans[0][0][2] == pytest.approx(32 / (1437 + 200))


def test_each_attack_is_tested_at_beta_over_the_number_of_attacks():
    """Fault 2: three attacks each at 95 % declare a false violation up to 15 % of the time."""
    assert per_attack_confidence(0.95, 3) == pytest.approx(1 - 0.05 / 3)
    assert per_attack_confidence(0.95, 1) == pytest.approx(0.95)
    rng = np.random.default_rng(0)
    # a union bound: simulated attacks with independent uniform p-values exceed β/A in ≤ β of runs
    alarms = (rng.random((20000, 3)) < (1 - per_attack_confidence(0.95, 3))).any(1).mean()
    assert alarms <= 0.05 + 0.005


def _long(values, metric="eps_lb_white_box_D"):
    rows = [{"run_id": f"r{s}", "method": "dpgan", "dataset": "digits", "preset": "tiny", "seed": s, "members": None,
             "eps_target": 1.0, "delta": 1e-5, "eps_rdp": 0.99, "eps_prv": 0.9, "source": "ours", "variant": "{}",
             "caveat": None, "finished": float(s), "run_dir": None, "metric": metric, "value": v}
            for s, v in enumerate(values)]
    return pd.DataFrame(rows)


def test_the_audit_layout_shows_each_seed_and_the_best_never_a_mean():
    """Fault 3: a mean ± std of 95 % lower bounds is not a 95 % bound."""
    tab = T.layout_audit(T.aggregate(_long([0.12, 0.0, 0.41])))
    (line,) = tab.cells
    assert line[1] == "best 0.41 (seeds: 0.12, 0, 0.41)"
    text = T.render_markdown(tab)
    assert "±" not in text and "1 − k·5 %" in text
    assert T.audit_cell([0.3]) == "0.3" and T.audit_cell([math.nan]) == "—"


def test_canaries_are_never_counted_as_mia_members():
    """Fault 4: included canaries (negated, wrong labels) against natural non-members make a
    positive ROC bound with no leak at all."""
    from evaluators.mia import queries

    full = load_dataset("digits", "test")
    data = full.with_members(16, seed=2).with_canaries(60, seed=2, pool=full.train)
    assert len(data.train) > 16  # canaries were drawn in
    members, nonmembers = queries(data)
    assert len(members) == len(nonmembers) == 16
    assert torch.equal(members.images, full.train.images[torch.as_tensor(data.member_indices)])


def test_more_canaries_than_images_is_refused():
    """Fault 5: m above the pool repeated images (replace=True), against the "never share"."""
    data = load_dataset("digits", "test")
    with pytest.raises(ValueError, match="distinct images"):
        data.with_canaries(len(data.train) + 1, seed=0)
    assert len(data.with_canaries(len(data.train), seed=0).canaries) == len(data.train)
