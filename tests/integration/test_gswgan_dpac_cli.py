"""GS-WGAN and DP-GAN-DPAC end to end through the CLI on digits (tiny preset, ε = 10),
and their calibrated privacy plans at ε ∈ {1, 10} (no training)."""

import json
import math
import re

import numpy as np
import pytest
import torch

from dpgen_bench.cli import cli

# its module fixture trains once per process: keep the file on one xdist worker
pytestmark = pytest.mark.xdist_group("gswgan_dpac_cli")

METHODS = ("gswgan", "dpac")


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from click.testing import CliRunner

    root = tmp_path_factory.mktemp("gswgan_runs")
    try:
        runner = CliRunner(mix_stderr=False)
    except TypeError:  # click ≥ 8.2 keeps stderr apart by default
        runner = CliRunner()
    out = {}
    for method in METHODS:
        res = runner.invoke(cli, ["run", "--method", method, "--dataset", "digits", "--eps", "10", "--preset", "tiny",
                                  "--results", str(root / method)])
        assert res.exit_code == 0, (res.output, res.stderr, res.exception)
        (d,) = [p for p in (root / method).iterdir() if p.is_dir()]
        out[method] = d
    return out


@pytest.mark.parametrize("method", METHODS)
def test_run_records_one_sanitised_part_within_the_target(runs, method):
    d = runs[method]
    for f in ("config.json", "privacy.json", "train.jsonl", "eval.json", "samples.npz", "grid.png", "checkpoint.pt"):
        assert (d / f).is_file(), f
    priv = json.loads((d / "privacy.json").read_text())
    (part,) = priv["parts"]  # DPAC's classifier steps are inside the same mechanism
    assert part["name"] == "generator_gradient" and part["mechanism"] == "subsampled_gaussian_wor_t27"
    assert part["sample_rate"] == pytest.approx(1 / 4)  # tiny preset: K = 4 discriminators
    assert part["steps"] == 30
    assert priv["epsilon"]["rdp"] <= priv["target"]["epsilon"] == 10.0
    prv = priv["epsilon"]["prv"]  # prv-accountant has no sampling without replacement: n/a
    assert math.isnan(float(prv))  # JSON has no NaN: written as the string "nan"
    s = np.load(d / "samples.npz")
    assert s["images"].shape == (100, 1, 16, 16) and s["images"].dtype == np.float32
    assert s["images"].min() >= -1 and s["images"].max() <= 1
    assert sorted(set(s["labels"].tolist())) == list(range(10))
    assert "gen2real_cnn" in json.loads((d / "eval.json").read_text())["metrics"]
    state = torch.load(d / "checkpoint.pt", weights_only=True)
    assert set(state) == {"G"}  # the discriminators (and C) are never released
    lines = [json.loads(x) for x in (d / "train.jsonl").read_text().splitlines()]
    steps = [x for x in lines if "step" in x]
    assert [x["step"] for x in steps] == [5, 10, 15, 20, 25, 30]
    assert len([x for x in lines if x.get("phase") == "pretrain"]) == 4
    if method == "dpac":  # tiny: t_c = 10, n_r = 2 real-data classifier steps per iteration
        assert "c_real_steps" not in steps[0] and steps[-1]["c_real_steps"] == (30 - 10) * 2
    else:
        assert all("c_real_steps" not in x for x in lines)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("eps", ["1", "10"])
def test_privacy_plan_meets_the_target(cli_runner, results, method, eps):
    res = cli_runner.invoke(cli, ["privacy", "--method", method, "--dataset", "digits", "--eps", eps])
    assert res.exit_code == 0, (res.output, res.stderr, res.exception)
    rows = [line for line in res.output.splitlines() if line.startswith("| generator_gradient |")]
    assert len(rows) == 1 and len([x for x in res.output.splitlines() if x.startswith("| ")]) == 2
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    assert cells[1] == "subsampled_gaussian_wor_t27" and float(cells[3]) == pytest.approx(1 / 50, abs=1e-5)
    composed = float(re.search(r"composed epsilon: ([0-9.]+) \(RDP", res.output).group(1))
    assert 0.95 * float(eps) <= composed <= float(eps)
    assert not results.exists()  # nothing trained, nothing written


@pytest.mark.parametrize("mode", ["paper", "sound"])
def test_dry_run_shows_the_caveat_the_run_will_record(cli_runner, results, mode):
    """``--dry-run``'s privacy plan carries every caveat the run records in privacy.json: with
    privacy_mode=paper, that its ε is GS-WGAN's own accounting (runner.run_caveat); none otherwise."""
    res = cli_runner.invoke(cli, ["run", "--method", "gswgan", "--dataset", "digits", "--eps", "10", "--preset", "tiny",
                                  "--set", f"privacy_mode={mode}", "--dry-run", "--probe-seconds", "0",
                                  "--probe-steps", "0"])
    assert res.exit_code == 0, (res.output, res.stderr, res.exception)
    caveat = json.loads(res.stdout)["privacy_plan"]["caveat"]
    if mode == "sound":
        assert caveat is None
        return
    assert caveat.startswith("gswgan privacy_mode=paper: ε is GS-WGAN's accounting") and "not a DP guarantee" in caveat
    assert not results.exists()  # nothing trained, nothing written
