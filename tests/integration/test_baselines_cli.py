"""The baselines end to end through the CLI: dpmean's three releases in privacy.json
within the target, samples per class and a floor far above chance on digits; dpmerf's two
releases and a complete record (tiny preset)."""

import json

import numpy as np
import pytest
from click.testing import CliRunner

from dpgen_bench.cli import cli


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("dpmean") / "run"
    res = CliRunner().invoke(cli, ["run", "-m", "dpmean", "--eps", "1", "--eval", "gen2real_mlp", "--out", str(out),
                                   "--device", "cpu", "--seed", "0"])
    assert res.exit_code == 0, res.output
    return out


def test_privacy_record(run_dir):
    priv = json.loads((run_dir / "privacy.json").read_text())
    parts = {p["name"]: p for p in priv["parts"]}
    assert list(parts) == ["class_sums", "class_counts", "class_squares"]
    assert all(p["steps"] == 1 and p["sample_rate"] == 1.0 for p in parts.values())
    assert 0.99 <= priv["epsilon"]["rdp"] <= 1.0 and priv["epsilon"]["prv"] <= priv["epsilon"]["rdp"]


def test_samples_and_a_floor_above_chance(run_dir):
    s = np.load(run_dir / "samples.npz")
    assert s["images"].shape == (1000, 1, 16, 16) and np.bincount(s["labels"]).tolist() == [100] * 10
    ev = json.loads((run_dir / "eval.json").read_text())
    assert ev["metrics"]["gen2real_mlp"] > 0.3  # chance is 0.1; class means at ε = 1 carry the classes


def test_dpmerf_records_its_two_releases(tmp_path):
    out = tmp_path / "merf"
    res = CliRunner().invoke(cli, ["run", "-m", "dpmerf", "--eps", "2", "--preset", "tiny", "--eval", "gen2real_mlp",
                                   "--out", str(out), "--device", "cpu"])
    assert res.exit_code == 0, res.output
    priv = json.loads((out / "privacy.json").read_text())
    assert [p["name"] for p in priv["parts"]] == ["embedding_sum", "count"] and priv["epsilon"]["rdp"] <= 2.0
    lines = [json.loads(x) for x in (out / "train.jsonl").read_text().splitlines()]
    assert lines and all("mmd2" in x for x in lines)
    assert "gen2real_mlp" in json.loads((out / "eval.json").read_text())["metrics"]
