"""One name per concept across methods (``Method.renamed_hparams``): the generator's weight
average is ``ema_decay``, D's width ``d_width``, the clip bound ``max_grad_norm``. Records,
``--set`` and config files with a former name still load and report as the same
configuration, and a rename changes neither a sweep cell's key nor a run's random streams."""

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from torch import nn

from dpgen_bench import runner
from dpgen_bench.config import build_config, hashed_hparams, stream_key
from dpgen_bench.nets.averaging import update_average
from dpgen_bench.registry import methods
from dpgen_bench.report.table import identity
from dpgen_bench.sweep import Cell

ROOT = Path(__file__).resolve().parents[2]
# a run recorded before the renames (width, g_ema), committed with its sweep cell key in its name
OLD_RECORD = ROOT / "benchmarks" / "mnist_runs" / "sweep-dpgan-mnist-eps10-s0-fc5dc9e8a5"
FORMER = {"g_ema", "ema", "width", "clip"}  # names that meant one of the three concepts


def _fields(method: str) -> set[str]:
    return {f.name for f in dataclasses.fields(methods.get(method).Hparams)}


@pytest.mark.parametrize("method", methods.names(include_hidden=True))
def test_no_method_uses_a_former_name(method):
    assert not _fields(method) & FORMER
    for old, new in methods.get(method).renamed_hparams.items():
        assert old not in _fields(method) and new in _fields(method)


def test_a_record_with_former_names_keeps_its_cell_and_streams():
    raw = json.loads((OLD_RECORD / "config.json").read_text())
    assert {"width", "g_ema"} <= set(raw["hparams"])  # the fixture still holds the former names
    old = runner.recorded_config(OLD_RECORD)
    assert old.hparams["d_width"] == 128 and old.hparams["ema_decay"] == 0.999 and "g_ema" not in old.hparams
    # recorded before the bias-corrected average, n_D = 5 and the width-64 schedule: the preset as it
    # was then (width 128, T = 3,000, n_D = 2, its average 0.999) with the as-before warm-up (late_hparams)
    now = build_config("dpgan", "mnist", epsilon=10, preset="long", seed=0, evaluators=["gen2real_cnn"],
                       sets=["ema_warmup=none", "n_d=2", "ema_decay=0.999", "d_width=128", "g_width=128",
                             "steps=3000"])
    assert now == old and old.hparams["ema_warmup"] == "none"
    assert Cell(now).key == OLD_RECORD.name.rsplit("-", 1)[1]  # a sweep finds the old run finished
    # the streams hash the former names: the old record's raw settings hash the same
    assert hashed_hparams("dpgan", now.hparams) == {k: v for k, v in raw["hparams"].items()}
    assert stream_key(now) == stream_key(old)
    priv = json.loads((OLD_RECORD / "privacy.json").read_text())
    assert identity(raw, priv) == identity(now.to_json(), priv)  # the report: one configuration
    # today's warm-up: another cell and configuration, the same streams (it only post-processes the iterates)
    unbiased = dataclasses.replace(now, hparams={**now.hparams, "ema_warmup": "bias-corrected"})
    assert Cell(unbiased).key != Cell(now).key and stream_key(unbiased) == stream_key(now)
    assert identity(unbiased.to_json(), priv) != identity(raw, priv)


@pytest.mark.parametrize("method,old,new,value", [("dpgan", "g_ema", "ema_decay", 0.9),
                                                   ("dpgan", "width", "d_width", 16),
                                                   ("gswgan", "ema", "ema_decay", 0.9),
                                                   ("dpac", "ema", "ema_decay", 0.9),
                                                   ("dpaf", "width", "d_width", 16),
                                                   ("dpmean", "clip", "max_grad_norm", 2.0)])
def test_a_former_name_still_sets_the_setting(method, old, new, value):
    a = build_config(method, "digits", epsilon=10, preset="quick", sets=[f"{old}={value}"])
    b = build_config(method, "digits", epsilon=10, preset="quick", sets=[f"{new}={value}"])
    assert a == b and a.hparams[new] == value and old not in a.hparams


def test_the_average_is_the_exponential_moving_average_with_buffers_copied():
    torch.manual_seed(0)
    model, average = nn.BatchNorm1d(3), nn.BatchNorm1d(3)
    with torch.no_grad():
        model.weight.normal_(), average.weight.normal_()
        model.running_mean.normal_()
    before = average.weight.detach().clone()
    update_average(average, model, 0.9, 2, "none")
    torch.testing.assert_close(average.weight, 0.9 * before + 0.1 * model.weight.detach())
    assert torch.equal(average.running_mean, model.running_mean)
    update_average(average, model, 0.0, 3)  # decay 0: the model itself
    torch.testing.assert_close(average.weight, model.weight.detach())
