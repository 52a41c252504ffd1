"""Settings added to a method after its runs were recorded (``Method.late_hparams``): at
their "as before" value they are left out of a sweep cell's key and of the report's
configuration identity, so the records made before they existed still match; any other
value makes a new configuration."""

import hashlib
import json

import pytest

from dpgen_bench.config import build_config
from dpgen_bench.registry import methods
from dpgen_bench.report.table import identity
from dpgen_bench.sweep import Cell

# (method, a --set that moves a late setting off its "as before" value)
CASES = [("dpdm", "warmup=central"), ("dpgan", "ema_decay=0.99"), ("gan", "ema_decay=0.99"),
         ("dpmerf", "generator=authors"), ("dpdm", "ema_warmup=bias-corrected"),
         ("gswgan", "ema_warmup=bias-corrected"), ("dpac", "ema_warmup=bias-corrected"),
         ("dpaf", "max_grad_norm_conv2=0.02")]


def test_every_method_with_late_settings_is_covered():
    have = {m for m in methods.names() if methods.attribute(m, "late_hparams")}
    assert have == {m for m, _ in CASES}


@pytest.mark.parametrize("method,change", CASES)
def test_runs_recorded_before_a_late_setting_keep_their_cell_key_and_identity(method, change):
    """A plant: drop the method's late_hparams and this fails."""
    cls = methods.get(method)
    eps = 10.0 if cls.private else None
    now = build_config(method, "digits", epsilon=eps, preset="quick", evaluators=["gen2real_cnn"], device="cpu")
    # the preset as it ran before the late settings existed: each at its "as before" value
    before = [f"{k}={v}" for k, v in cls.late_hparams.items() if now.hparams[k] != v]
    cfg = build_config(method, "digits", epsilon=eps, preset="quick", evaluators=["gen2real_cnn"], device="cpu",
                       sets=before)
    old = cfg.to_json()  # as recorded then: without the late settings, under the names of the time
    former = {new: name for name, new in cls.renamed_hparams.items()}
    old["hparams"] = {former.get(k, k): v for k, v in old["hparams"].items() if k not in cls.late_hparams}
    assert set(cls.late_hparams) <= set(cfg.hparams)
    assert not set(cls.late_hparams) & set(old["hparams"])
    old_key = hashlib.sha1(json.dumps(old, sort_keys=True, default=str).encode()).hexdigest()[:10]
    assert Cell(cfg).key == old_key
    priv = {"target": {"delta": 1e-5}, "private": cls.private}
    assert identity(old, priv) == identity(cfg.to_json(), priv)
    moved = build_config(method, "digits", epsilon=eps, preset="quick", evaluators=["gen2real_cnn"], device="cpu",
                         sets=[*before, change])
    assert Cell(moved).key != old_key and identity(moved.to_json(), priv) != identity(old, priv)
