"""GAN-Leaks sanity on digits with 64 members (issue 4): a memorising non-private GAN is
caught, a DPGAN at ε=1 is not."""

import json

import pytest

from dpgen_bench.cli import cli

pytestmark = pytest.mark.slow


def _auc(cli_runner, results, *args):
    res = cli_runner.invoke(cli, ["run", *args, "--dataset", "digits", "--members", "64", "--preset", "quick",
                                  "--eval", "mia_auc_full_black_box,mia_auc_white_box"])
    assert res.exit_code == 0, (res.output, res.stderr, res.exception)
    (d,) = [p for p in results.iterdir() if p.is_dir() and p.name.startswith(args[1])]
    return json.loads((d / "eval.json").read_text())["metrics"]


def test_memorising_gan_is_detected_and_dpgan_is_not(cli_runner, results, monkeypatch, tmp_path):
    monkeypatch.setenv("DPGEN_CACHE", str(tmp_path / "cache"))
    gan = _auc(cli_runner, results, "--method", "gan", "--set", "steps=3000")
    assert gan["mia_auc_full_black_box"] >= 0.9
    dpgan = _auc(cli_runner, results, "--method", "dpgan", "--eps", "1")
    assert abs(dpgan["mia_auc_full_black_box"] - 0.5) <= 0.1
    assert abs(dpgan["mia_auc_white_box"] - 0.5) <= 0.15
