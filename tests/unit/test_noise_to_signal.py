"""The noise-to-signal ratio of every private part, known before training: each method's
against its closed form, shown by `bench privacy`, in --dry-run's plan and in privacy.json."""

from __future__ import annotations

import json
import math

import pytest

from dpgen_bench import registry, runner
from dpgen_bench.cli import cli
from dpgen_bench.config import build_config
from dpgen_bench.privacy import dpsgd_noise_to_signal, parameter_count, release_noise_to_signal

PRIVATE = ["dpgan", "dpaf", "dpdm", "gswgan", "dpac", "dpsinkhorn", "dpmerf", "dpmean", "dpntk", "dpkernel"]


def _prepared(method: str, dataset: str = "digits", preset: str = "tiny", eps: float = 10.0, **sets):
    cfg = build_config(method, dataset, epsilon=eps, preset=preset, sets=[f"{k}={v}" for k, v in sets.items()])
    return runner.prepare(cfg)


def test_the_closed_forms():
    assert dpsgd_noise_to_signal(0.5, 10_000, 50) == pytest.approx(0.5 * 100 / 50)
    assert release_noise_to_signal(2.0, 784, 400) == pytest.approx(2.0 * 28 / 400)
    assert release_noise_to_signal(2.0, 1, 0) == 2.0  # never divides by less than one record


@pytest.mark.parametrize("method", PRIVATE)
def test_every_private_method_states_a_positive_ratio_for_every_part(method):
    p = _prepared(method)
    for part in p.ledger.planned.values():
        if part.steps:
            assert part.noise_to_signal is not None and math.isfinite(part.noise_to_signal)
            assert part.noise_to_signal > 0, part


def test_dpgan_is_sigma_root_d_over_its_two_b_rows():
    p = _prepared("dpgan")
    part = p.ledger.planned["discriminator"]
    d = sum(t.numel() for t in p.method.D.parameters())
    assert part.noise_to_signal == pytest.approx(part.noise_multiplier * math.sqrt(d) / (2 * 32))  # tiny B = 32


def test_the_ratio_follows_the_batch_and_the_width():
    small, wide, big_batch = (_prepared("dpgan", steps=60, **kw).ledger.planned["discriminator"]
                              for kw in ({}, {"d_width": 16}, {"batch_size": 64}))
    # at a fixed σ the ratio is σ√d/2B: more parameters raise it, a larger batch lowers it
    per_sigma = [p.noise_to_signal / p.noise_multiplier for p in (small, wide, big_batch)]
    assert per_sigma[1] > per_sigma[0] > per_sigma[2]
    assert per_sigma[0] == pytest.approx(2 * per_sigma[2])


def test_release_methods_read_a_class_sum_as_its_mean():
    p = _prepared("dpmean")
    n_c = p.method.info.n_train / p.method.info.num_classes
    sums = p.ledger.planned["class_sums"]
    assert sums.noise_to_signal == pytest.approx(sums.noise_multiplier * math.sqrt(16 * 16) / n_c)
    merf = _prepared("dpmerf")
    emb = merf.ledger.planned["embedding_sum"]
    assert emb.noise_to_signal == pytest.approx(emb.noise_multiplier * math.sqrt(merf.method.hparams.num_features)
                                                / n_c)


def test_gswgan_noise_does_not_shrink_with_the_batch():
    a = _prepared("gswgan").ledger.planned["generator_gradient"]
    b = _prepared("gswgan", batch_size=64).ledger.planned["generator_gradient"]
    # sound mode: per-row noise 2√B·σ against the row's clip bound: a larger batch makes it louder
    assert b.noise_to_signal / b.noise_multiplier > a.noise_to_signal / a.noise_multiplier


def test_dpaf_parts_use_their_own_modules_and_divisors():
    p = _prepared("dpaf")
    h, m = p.method.hparams, p.method
    conv2 = p.ledger.planned["conv2"]
    assert conv2.noise_to_signal == pytest.approx(
        dpsgd_noise_to_signal(conv2.noise_multiplier, parameter_count(m.conv2), 2 * h.mu * h.batch_size))
    agg = p.ledger.planned["dpagg"]
    assert agg.noise_to_signal == pytest.approx(
        agg.noise_multiplier * m.sensitivity * m.info.num_classes / h.batch_size)


def test_bench_privacy_prints_the_column(cli_runner):
    res = cli_runner.invoke(cli, ["privacy", "-m", "dpgan", "--preset", "tiny", "--eps", "10"])
    assert res.exit_code == 0, res.stderr
    lines = res.stdout.splitlines()
    header = next(line for line in lines if line.startswith("| part |"))
    row = next(line for line in lines if line.startswith("| discriminator |"))
    assert header.rstrip(" |").endswith("noise / signal")
    assert float(row.strip(" |").split("|")[-1]) > 0


def test_privacy_json_records_it(cli_runner, results):
    res = cli_runner.invoke(cli, ["run", "-m", "dpmean", "--preset", "tiny", "--eps", "10", "--eval", "gen2real_mlp"])
    assert res.exit_code == 0, res.stderr
    record = json.loads(next(results.glob("*/privacy.json")).read_text())
    ratios = [part["noise_to_signal"] for part in record["parts"]]
    assert len(ratios) == 3 and all(r > 0 for r in ratios)


def test_a_plugin_that_does_not_say_keeps_the_old_record_form():
    p = _prepared("dummy")
    part = next(iter(p.ledger.planned.values()))
    assert part.noise_to_signal is None and "noise_to_signal" not in part.to_json()
    assert registry.methods.get("dummy").noise_to_signal is not None  # the base class's hook
