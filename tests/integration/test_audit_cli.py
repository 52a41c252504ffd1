"""``bench audit`` end to end: canaries in the training split, audit.json beside a
complete record, bounds never above the accountant's ε, the audit layout of bench report,
and bad input answered in one line. The positive control and the soundness grid over every
private method are slow (``-m slow``)."""

import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from dpgen_bench import registry
from dpgen_bench.cli import cli
from dpgen_bench.data import load_dataset

# its module fixture trains once per process: keep the file on one xdist worker
pytestmark = pytest.mark.xdist_group("audit_cli")


def test_canaries_are_unlike_real_records_and_half_included():
    data = load_dataset("digits", "test")
    aud = data.with_canaries(400, seed=3)
    c, inc = aud.canaries, aud.canary_included
    assert len(c) == 400 and inc.dtype == bool and 150 < inc.sum() < 250
    assert len(aud.train) == len(data.train) + inc.sum()
    assert torch.equal(aud.train.images[len(data.train):], c.images[torch.as_tensor(inc)])
    # every canary is the negative of a training image, and never carries that image's label
    flat = data.train.images.flatten(1)
    nearest = torch.cdist(-c.images.flatten(1), flat).argmin(1)
    assert torch.allclose(-c.images.flatten(1), flat[nearest])
    assert not (data.train.labels[nearest] == c.labels).any()
    assert len(torch.unique(nearest)) == 400  # drawn without replacement: no two canaries share an image
    again = data.with_canaries(400, seed=3)
    assert np.array_equal(again.canary_included, inc) and torch.equal(again.canaries.images, c.images)
    assert not np.array_equal(data.with_canaries(400, seed=4).canary_included, inc)


def test_canaries_under_members_come_from_the_whole_training_split():
    # with --members 16 a member-only pool gave ~8 canaries per image, some equal in image and
    # label (one included, one not): the runner draws them from the whole training split
    from dpgen_bench import runner
    from dpgen_bench.config import build_config

    cfg = build_config("gan", "digits", preset="memorise", members=16, canaries=128, device="cpu")
    p = runner.prepare(cfg)
    c, inc = p.data.canaries, p.data.canary_included
    assert len(c) == 128 and len(p.data.train) == 16 + inc.sum()
    full = load_dataset("digits", "test").train.images.flatten(1)
    nearest = torch.cdist(-c.images.flatten(1), full).argmin(1)
    assert torch.allclose(-c.images.flatten(1), full[nearest]) and len(torch.unique(nearest)) == 128
    members = torch.as_tensor(p.data.member_indices)
    assert torch.equal(p.data.train.images[:16], load_dataset("digits", "test").train.images[members])


@pytest.fixture(scope="module")
def audited(tmp_path_factory):
    out = tmp_path_factory.mktemp("audit") / "run"
    res = CliRunner().invoke(cli, ["audit", "-m", "dpgan", "--preset", "tiny", "--eps", "5", "--canaries", "120",
                                   "--device", "cpu", "--out", str(out)])
    assert res.exit_code == 0, res.output
    return out, res.output


def test_audit_json_beside_a_complete_record(audited):
    out, text = audited
    audit = json.loads((out / "audit.json").read_text())
    assert (out / "eval.json").is_file() and (out / "canaries.npz").is_file()
    assert audit["canaries"] == 120 and 0 < audit["included"] < 120
    assert set(audit["attacks"]) == {"black_box", "white_box_G", "white_box_D"}  # dpgan's D is released
    for a in audit["attacks"].values():
        assert {"epsilon_lower_bound", "confidence", "guesses", "correct"} <= set(a)
        assert 0 <= a["epsilon_lower_bound"] <= audit["epsilon_accountant"]["rdp"] <= 5
        assert a["correct"] <= a["guesses"] <= 120
    assert audit["violation"] == [] and "ε lower bound at 95% for all attacks together" in text
    per = audit["confidence_per_attack"]
    # two tests per attack (the ε-bound, the accountant's curve), Bonferroni over all six
    assert per == pytest.approx(1 - 0.05 / 6) and all(a["confidence"] == per for a in audit["attacks"].values())
    assert all(a["accountant_curve_rejected"] is False and 0 <= a["fdp_gaussian"]["epsilon"] <= 5
               for a in audit["attacks"].values())
    inc = np.load(out / "canaries.npz")["included"]
    assert inc.sum() == audit["included"]
    config = json.loads((out / "config.json").read_text())
    assert config["canaries"] == 120


def test_report_audit_layout(audited):
    out, _ = audited
    res = CliRunner().invoke(cli, ["report", "--results", str(out.parent), "--layout", "audit"])
    assert res.exit_code == 0, res.output
    assert "lower bound: white_box_D" in res.output and "dpgan" in res.output


def test_gswgan_discriminators_are_not_scored():
    gs = registry.methods.get("gswgan")
    assert gs.released_parts == () and registry.methods.get("dpac").released_parts == ()
    assert registry.methods.get("dpgan").released_parts == ("D",) == registry.methods.get("dpaf").released_parts


@pytest.mark.parametrize("args,needle", [
    (["-m", "dpgan", "--eps", "1", "--canaries", "1"], "--canaries must be ≥ 2"),
    (["-m", "dpgan", "--eps", "1", "--confidence", "1.5"], "--confidence"),
    (["-m", "dpgan", "--eps", "0"], "--eps must be > 0"),
    (["-m", "nope", "--eps", "1"], "unknown method"),
    (["-m", "gan", "--eps", "1"], "not private"),
    (["-m", "dpgan", "--eps", "1", "--preset", "tiny", "--canaries", "5000"],
     "--canaries 5000: each canary needs its own image of the training split, which has 1437"),
])
def test_bad_input_one_line(args, needle, tmp_path):
    res = CliRunner().invoke(cli, ["audit", *args, "--out", str(tmp_path / "x")])
    assert res.exit_code == 2 and needle in res.output and "Traceback" not in res.output
    assert not (tmp_path / "x").exists()


@pytest.mark.slow
def test_positive_control_memorising_gan(tmp_path):
    """A non-private GAN that overfits: the bound must reach 1 at 95 % with some
    attack. 16 members + ~128 included canaries (of 256, each image used once), ~3 min on
    one core. Measured: white_box_D 2.6 (101/102 correct, AUC 0.95; black_box 0.95,
    white_box_G 0.95); seed 1: white_box_D 3.0 (153/154), black_box 1.5, white_box_G 1.3."""
    res = CliRunner().invoke(cli, ["audit", "-m", "gan", "--preset", "memorise", "--members", "16", "--canaries",
                                   "256", "--device", "cpu", "--out", str(tmp_path / "gan")])
    assert res.exit_code == 0, res.output
    audit = json.loads((tmp_path / "gan" / "audit.json").read_text())
    assert max(a["epsilon_lower_bound"] for a in audit["attacks"].values()) >= 1, audit["attacks"]


@pytest.mark.slow
@pytest.mark.parametrize("eps", [1, 10])
@pytest.mark.parametrize("method", ["dpgan", "dpaf", "gswgan", "dpac", "dpmean", "dpmerf", "dpsinkhorn"])
def test_soundness_every_private_method(method, eps, tmp_path):
    res = CliRunner().invoke(cli, ["audit", "-m", method, "--eps", str(eps), "--device", "cpu",
                                   "--out", str(tmp_path / method)])
    assert res.exit_code == 0, res.output  # a bound above the accountant's ε exits 3
    audit = json.loads((tmp_path / method / "audit.json").read_text())
    assert all(a["epsilon_lower_bound"] <= audit["epsilon_accountant"]["rdp"] for a in audit["attacks"].values())
