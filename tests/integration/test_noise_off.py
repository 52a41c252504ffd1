"""``bench run --noise-off``: the diagnostic "same pipeline without noise". The
method sees σ = 0 for every part (so its release is the exact, clipped statistic), the run
keeps its plan (steps, clipping) and records ε = ∞ with the calibrated σ, a caveat, and a
row of its own in the report; it is refused for a non-private method."""

import json
import math

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from dpgen_bench.api import Budget, PrivacyPart
from dpgen_bench.cli import cli
from dpgen_bench.privacy.ledger import PrivacyLedger
from dpgen_bench.report import table as T


def test_ledger_hands_out_zero_noise_and_reports_infinity():
    ledger = PrivacyLedger(Budget(epsilon=1.0, delta=1e-5), [PrivacyPart("a", 5.0, 0.1, 100)])
    ledger.switch_noise_off()
    assert ledger.part("a").noise_multiplier == 0.0
    ledger.spend("a", 100)
    with pytest.raises(Exception, match="more than its calibrated"):
        ledger.spend("a")  # the plan's step count still holds
    rep = ledger.report()
    assert rep.noise_off and math.isinf(rep.epsilon_rdp) and math.isinf(rep.epsilon_prv)
    assert rep.parts[0].noise_multiplier == 5.0 and rep.parts[0].steps == 100  # the σ it replaced
    assert "not private" in rep.caveat
    with pytest.raises(ValueError, match="^a non-private run has no noise to switch off$"):
        PrivacyLedger(Budget(epsilon=math.inf, delta=1e-5), []).switch_noise_off()


def _run(tmp, *args):
    res = CliRunner().invoke(cli, ["run", "-m", "dummy", "--preset", "tiny", "--eps", "1", "--eval", "gen2real_mlp",
                                   "--device", "cpu", "--out", str(tmp), *args])
    assert res.exit_code == 0, res.output
    return tmp


def test_noise_off_releases_the_exact_statistic(tmp_path):
    noisy, clean = _run(tmp_path / "noisy"), _run(tmp_path / "clean", "--noise-off")
    priv = json.loads((clean / "privacy.json").read_text())
    assert priv["noise_off"] is True and priv["epsilon"]["rdp"] == "inf"
    assert priv["parts"][0]["noise_multiplier"] > 1  # the σ of ε = 1, kept in the record
    assert "noise_off" not in json.loads((noisy / "privacy.json").read_text())
    assert json.loads((clean / "config.json").read_text())["noise_off"] is True
    # the dummy method's release without noise is the exact mean of the clipped images
    from dpgen_bench.data import load_dataset

    train = load_dataset("digits", "test").train
    x = train.images.flatten(1)
    c = 1 / 2 ** 0.5
    x = x * (c / x.norm(dim=1, keepdim=True).clamp(min=c))
    exact = torch.stack([x[train.labels == k].mean(0) for k in range(10)]).view(10, 1, 16, 16)
    means = torch.load(clean / "checkpoint.pt")["means"]
    assert torch.allclose(means, exact, atol=1e-5)
    assert not torch.allclose(torch.load(noisy / "checkpoint.pt")["means"], exact, atol=1e-2)
    # the report keeps it apart from the private runs of the same configuration, marked
    long, _ = T.collect(tmp_path)
    labels = set(long["method"])
    assert labels == {"dummy [noise=on]", "dummy [noise=off]"}, labels
    agg = T.aggregate(long)
    text = T.render_markdown(T.layout_b(agg, "digits", 1.0))
    assert "∞" in text and "noise switched off" in text


def test_noise_off_refused_for_a_non_private_method(tmp_path):
    res = CliRunner().invoke(cli, ["run", "-m", "gan", "--preset", "tiny", "--noise-off", "--out", str(tmp_path)])
    assert res.exit_code == 2 and "not private" in res.output and "Traceback" not in res.output
    assert np.all([not p.exists() for p in [tmp_path / "config.json"]])


def test_ledger_switches_off_the_named_parts_only():
    ledger = PrivacyLedger(Budget(epsilon=2.0, delta=1e-5), [PrivacyPart("a", 5.0, 0.1, 100),
                                                             PrivacyPart("b", 4.0, 0.1, 100)])
    ledger.switch_noise_off(["b"])
    assert ledger.part("a").noise_multiplier == 5.0 and ledger.part("b").noise_multiplier == 0.0
    ledger.spend("a", 100)
    ledger.spend("b", 100)
    rep = ledger.report()
    assert rep.noise_off and rep.noise_off_parts == ("b",) and math.isinf(rep.epsilon_rdp)
    a, b = rep.parts
    assert 0 < a.epsilon < 2 and math.isinf(b.epsilon)  # the noised part keeps its own ε
    assert "noise switched off in b" in rep.caveat
    with pytest.raises(Exception, match="not a private part of this run"):
        PrivacyLedger(Budget(epsilon=2.0, delta=1e-5), [PrivacyPart("a", 5.0, 0.1, 100)]).switch_noise_off(["z"])


def test_noise_off_part_through_the_cli(tmp_path):
    args = ["run", "-m", "dpaf", "--preset", "tiny", "--eps", "10", "--eval", "gen2real_mlp", "--device", "cpu"]
    res = CliRunner().invoke(cli, [*args, "--out", str(tmp_path / "r"), "--noise-off-part", "dpagg"])
    assert res.exit_code == 0, res.output
    priv = json.loads((tmp_path / "r" / "privacy.json").read_text())
    assert priv["noise_off"] is True and priv["noise_off_parts"] == ["dpagg"] and priv["epsilon"]["rdp"] == "inf"
    eps = {p["name"]: p["epsilon"] for p in priv["parts"]}
    assert eps["dpagg"] == "inf" and all(0 < eps[n] < 10 for n in ("conv1", "conv2"))
    assert json.loads((tmp_path / "r" / "config.json").read_text())["noise_off_parts"] == ["dpagg"]
    from dpgen_bench.identity import report_identity

    cfg = json.loads((tmp_path / "r" / "config.json").read_text())
    assert report_identity(cfg, priv)["noise"] == "off: dpagg"  # its own row, apart from noise=off and on
    for bad, said in ((["--noise-off-part", "conv9"], "conv9 is not a private part"),
                      (["--noise-off", "--noise-off-part", "dpagg"], "give one")):
        res = CliRunner().invoke(cli, [*args, "--out", str(tmp_path / "bad"), *bad])
        assert res.exit_code == 2 and said in res.output and "Traceback" not in res.output, res.output
