"""dpdm end to end through the CLI (tiny preset, digits): one Poisson-sampled DP-SGD part in
privacy.json at rate B/N within the target, a training curve, samples and an evaluation.
Resume after a kill: tests/integration/test_resume_methods.py ("dpdm")."""

import json

import numpy as np
from click.testing import CliRunner

from dpgen_bench.cli import cli


def test_dpdm_records_its_one_part_within_the_target(tmp_path):
    out = tmp_path / "dpdm"
    res = CliRunner().invoke(cli, ["run", "-m", "dpdm", "--eps", "2", "--preset", "tiny", "--set", "steps=12",
                                   "--set", "log_every=4", "--eval", "gen2real_mlp", "--out", str(out),
                                   "--device", "cpu"])
    assert res.exit_code == 0, res.output
    priv = json.loads((out / "privacy.json").read_text())
    (part,) = priv["parts"]
    assert part["name"] == "denoiser" and part["mechanism"] == "subsampled_gaussian"
    assert part["steps"] == 12 and abs(part["sample_rate"] - 16 / 1437) < 1e-12 and part["noise_multiplier"] > 0
    assert 0.99 * 2.0 <= priv["epsilon"]["rdp"] <= 2.0 and priv["caveat"] is None
    lines = [json.loads(x) for x in (out / "train.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [4, 8, 12] and all(np.isfinite(x["loss"]) for x in lines)
    s = np.load(out / "samples.npz")
    assert s["images"].shape == (100, 1, 16, 16) and s["images"].min() >= -1 and s["images"].max() <= 1
    assert "gen2real_mlp" in json.loads((out / "eval.json").read_text())["metrics"]


def test_dpdm_is_listed_with_its_presets():
    res = CliRunner().invoke(cli, ["list", "methods"])
    assert res.exit_code == 0 and "dpdm" in res.output


def test_dpdm_with_dp_feta_warm_start_records_both_parts(tmp_path):
    """--set warmup=central: the central images' queries and DP-SGD, both in privacy.json,
    composed within the target; the warm-up's loss in the training curve. Too small a budget
    for the central images alone is one line."""
    out = tmp_path / "feta"
    args = ["run", "-m", "dpdm", "--eps", "4", "--preset", "tiny", "--set", "warmup=central", "--set",
            "central_batch=700", "--set", "central_sigma=12", "--set", "warmup_steps=6", "--set", "log_every=3",
            "--eval", "gen2real_mlp", "--device", "cpu"]
    res = CliRunner().invoke(cli, [*args, "--out", str(out)])
    assert res.exit_code == 0, res.output
    priv = json.loads((out / "privacy.json").read_text())
    central, denoiser = priv["parts"]
    assert central["name"] == "central" and central["steps"] == 5 and central["noise_multiplier"] == 12
    assert abs(central["sample_rate"] - 700 / 1437) < 1e-12
    assert denoiser["name"] == "denoiser" and denoiser["steps"] == 8
    assert 0.99 * 4 <= priv["epsilon"]["rdp"] <= 4 and 0 < central["epsilon"] < denoiser["epsilon"]
    lines = [json.loads(x) for x in (out / "train.jsonl").read_text().splitlines()]
    assert [x["warmup_loss"] for x in lines if "warmup_loss" in x] and np.isfinite(
        [x["warmup_loss"] for x in lines if "warmup_loss" in x]).all()
    res = CliRunner().invoke(cli, [*args[:-2], "--set", "central_sigma=0.5", "--out", str(tmp_path / "low")])
    assert res.exit_code != 0 and "infeasible" in res.output and "Traceback" not in res.output
    assert len(res.output.strip().splitlines()) <= 2
