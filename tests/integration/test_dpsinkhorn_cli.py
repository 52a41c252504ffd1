"""dpsinkhorn end to end through the CLI (tiny preset, digits): one Poisson-sampled
Gaussian part in privacy.json at rate B/N within the target, a training curve and an
evaluation."""

import json

from click.testing import CliRunner

from dpgen_bench.cli import cli


def test_dpsinkhorn_records_its_one_part_within_the_target(tmp_path):
    out = tmp_path / "sinkhorn"
    res = CliRunner().invoke(cli, ["run", "-m", "dpsinkhorn", "--eps", "2", "--preset", "tiny", "--eval",
                                   "gen2real_mlp", "--out", str(out), "--device", "cpu"])
    assert res.exit_code == 0, res.output
    priv = json.loads((out / "privacy.json").read_text())
    (part,) = priv["parts"]
    assert part["name"] == "image_gradient" and part["mechanism"] == "subsampled_gaussian"
    assert part["steps"] == 30 and abs(part["sample_rate"] - 16 / 1437) < 1e-12 and part["noise_multiplier"] > 0
    assert 0.99 * 2.0 <= priv["epsilon"]["rdp"] <= 2.0 and priv["caveat"] is None
    lines = [json.loads(x) for x in (out / "train.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [10, 20, 30] and all("loss" in x and "grad_norm" in x for x in lines)
    assert "gen2real_mlp" in json.loads((out / "eval.json").read_text())["metrics"]
