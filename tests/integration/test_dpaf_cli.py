"""DPAF end to end through the CLI on digits with the tiny preset, at ε = 1 and ε = 10:
the privacy record has its three parts and spends at most the target; eval.json exists."""

import json

import pytest

from dpgen_bench.cli import cli

# its module fixture trains once per process: keep the file on one xdist worker
pytestmark = pytest.mark.xdist_group("dpaf_cli")


@pytest.fixture(scope="module")
def dpaf_runs(tmp_path_factory):
    from click.testing import CliRunner

    root = tmp_path_factory.mktemp("dpaf_runs")
    runner = CliRunner()
    dirs = {}
    for eps in ("1", "10"):
        out = root / f"eps{eps}"
        res = runner.invoke(cli, ["run", "--method", "dpaf", "--dataset", "digits", "--eps", eps, "--preset", "tiny",
                                  "--out", str(out)])
        assert res.exit_code == 0, (res.output, res.exception)
        assert "gen2real_cnn" in res.output
        dirs[float(eps)] = out
    return dirs


@pytest.mark.parametrize("eps", [1.0, 10.0])
def test_privacy_record_has_three_parts_within_the_target(dpaf_runs, eps):
    d = dpaf_runs[eps]
    priv = json.loads((d / "privacy.json").read_text())
    assert priv["private"] and priv["target"]["epsilon"] == eps
    parts = {p["name"]: p for p in priv["parts"]}
    assert list(parts) == ["conv1", "conv2", "dpagg"]
    assert all(p["mechanism"] == "subsampled_gaussian" and p["noise_multiplier"] > 0 for p in parts.values())
    # tiny preset: 𝔹 = 40 batches, μ = 4, 10 classifier batches
    assert (parts["conv1"]["steps"], parts["conv2"]["steps"], parts["dpagg"]["steps"]) == (10, 10, 40)
    assert priv["epsilon"]["rdp"] <= eps
    assert priv["epsilon"]["prv"] <= priv["epsilon"]["rdp"]
    # the canonical split (0.1, ×, 0.1), scaled by one factor until the composition reaches ε
    # (fill_budget, the default): conv1 and DPAGG keep equal shares, conv2* the rest
    assert priv["epsilon"]["rdp"] >= 0.99 * eps
    assert parts["conv1"]["epsilon"] == pytest.approx(parts["dpagg"]["epsilon"], rel=0.02)
    assert parts["conv1"]["epsilon"] < parts["conv2"]["epsilon"] < eps


@pytest.mark.parametrize("eps", [1.0, 10.0])
def test_run_is_complete_and_recorded(dpaf_runs, eps):
    import numpy as np

    d = dpaf_runs[eps]
    ev = json.loads((d / "eval.json").read_text())
    assert "gen2real_cnn" in ev["metrics"] and 0.0 <= ev["metrics"]["gen2real_cnn"] <= 1.0
    s = np.load(d / "samples.npz")
    assert s["images"].shape == (100, 1, 16, 16) and s["images"].min() >= -1 and s["images"].max() <= 1
    lines = [json.loads(x) for x in (d / "train.jsonl").read_text().splitlines()]
    assert {x["phase"] for x in lines} == {"classifier", "gan"}
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["hparams"]["layer_config"] == "C2-C1-×" and cfg["hparams"]["privacy_mode"] == "sound"


def test_privacy_command_prints_the_three_part_plan(cli_runner, results):
    res = cli_runner.invoke(cli, ["privacy", "--method", "dpaf", "--dataset", "digits", "--eps", "1", "--preset",
                                  "tiny"])
    assert res.exit_code == 0, (res.output, res.stderr)
    for name in ("conv1", "conv2", "dpagg"):
        assert f"| {name} | subsampled_gaussian |" in res.output
    assert "composed epsilon" in res.output
    assert not results.exists()


def test_layer_config_and_split_are_settable_from_the_cli(cli_runner, results):
    res = cli_runner.invoke(cli, ["run", "--method", "dpaf", "--dataset", "digits", "--eps", "2", "--preset", "tiny",
                                  "--set", "layer_config=C2-C2-C1", "--set", "image_size=32", "--set",
                                  "budget_split=20%,60%,20%", "--set", "fill_budget=false", "--dry-run",
                                  "--probe-seconds", "0"])
    assert res.exit_code == 0, (res.output, res.stderr)
    plan = json.loads(res.stdout)  # data on stdout; the gradient probe may warn on stderr
    assert plan["config"]["hparams"]["layer_config"] == "C2-C2-C1"
    eps_alone = [p["epsilon"] for p in plan["privacy_plan"]["parts"]]
    assert eps_alone[0] <= 0.4 and eps_alone[1] <= 1.2 and eps_alone[2] <= 0.4  # the paper's additive reading
    assert plan["privacy_plan"]["epsilon"]["rdp"] <= 2.0
    bad = cli_runner.invoke(cli, ["run", "--method", "dpaf", "--dataset", "digits", "--eps", "1", "--preset", "tiny",
                                  "--set", "layer_config=C3-C1-×", "--dry-run", "--probe-seconds", "0"])
    assert bad.exit_code == 2 and "image_size" in bad.stderr  # too deep for 16×16 without resizing


def test_paper_mode_epsilon_carries_its_caveat_into_the_report(dpaf_runs, tmp_path):
    """privacy_mode=paper: the run says its ε is the paper's accounting (stdout, privacy.json),
    and bench report keeps it in its own row with ε spent marked ‡ and the caveat below."""
    from click.testing import CliRunner

    runner = CliRunner()
    out = tmp_path / "runs" / "paper10"
    res = runner.invoke(cli, ["run", "--method", "dpaf", "--dataset", "digits", "--eps", "10", "--preset", "tiny",
                              "--set", "privacy_mode=paper", "--eval", "gen2real_mlp", "--out", str(out)])
    assert res.exit_code == 0, (res.output, res.exception)
    assert "epsilon caveat: dpaf privacy_mode=paper" in res.stdout
    caveat = json.loads((out / "privacy.json").read_text())["caveat"]
    assert "not a DP guarantee" in caveat
    assert json.loads((dpaf_runs[10.0] / "privacy.json").read_text())["caveat"] is None
    sound = tmp_path / "runs" / "sound10"
    import shutil

    shutil.copytree(dpaf_runs[10.0], sound)
    res = runner.invoke(cli, ["report", "--results", str(tmp_path / "runs"), "--layout", "b", "--eps", "10"])
    assert res.exit_code == 0, (res.output, res.stderr)
    rows = {line.split(" | ")[0].lstrip("| "): line for line in res.stdout.splitlines() if line.startswith("| dpaf")}
    assert set(rows) == {"dpaf [privacy_mode=paper]", "dpaf [privacy_mode=sound]"}
    assert "‡" in rows["dpaf [privacy_mode=paper]"] and "‡" not in rows["dpaf [privacy_mode=sound]"]
    assert f"‡ {caveat}" in res.stdout
