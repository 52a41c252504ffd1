"""Under ``bench audit``'s canaries the training split holds the N members plus the canaries
that were drawn in, about half of m, while the plan counts N + m (the one-run theorem needs a
mechanism fixed before the draw). Every Poisson sample a method draws must use the *planned*
rate: a rate computed from the split's size is higher than the one accounted (dpgan's was,
until 2026-11-28: q = 0.0190 for a planned 0.0165 on digits with 500 canaries), so the
recorded ε would not bound the run."""

import pytest
import torch

import dpgen_bench.privacy.dpsgd as dpsgd
from dpgen_bench.config import build_config
from dpgen_bench.context import TrainingContext
from dpgen_bench.runner import prepare


@pytest.mark.parametrize("method, sets", [
    ("dpgan", ["steps=4"]),
    ("dpsinkhorn", ["steps=2"]),
    ("dpdm", ["steps=2"]),
    ("dpdm", ["steps=2", "warmup=central", "warmup_steps=1", "central_queries=1", "central_share=0.3"]),
    ("dpaf", ["batches=4", "classifier_batches=2"]),
])
def test_every_poisson_sample_uses_a_planned_rate(method, sets, monkeypatch):
    cfg = build_config(method, "digits", epsilon=10, preset="tiny", sets=sets, canaries=500, seed=0)
    p = prepare(cfg)
    planned = {name: part.sample_rate for name, part in p.ledger.planned.items()}
    assert len(p.data.train) < p.method.info.n_train  # some canaries were left out
    rates = []
    real = dpsgd.poisson_batch

    def spy(n, q, *args, **kwargs):
        rates.append(q)
        return real(n, q, *args, **kwargs)

    import importlib

    module = importlib.import_module(type(p.method).__module__)
    monkeypatch.setattr(module, "poisson_batch", spy)
    torch.manual_seed(0)
    p.method.fit(p.data.train, p.budget, TrainingContext(torch.device("cpu"), 0, p.ledger))
    assert rates, "no Poisson sample drawn: the spy is on the wrong module"
    assert set(rates) <= set(planned.values()), (rates, planned)
