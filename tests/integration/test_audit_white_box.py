"""``bench audit --white-box``: gradient canaries inside each private
part's own release, driven through the CLI on a real method. The correct code stays below
the accountant's ε; a planted bug in the part's noise makes the audit exceed it and the
command exit 3 (``PrivacyViolation``). The planted bugs patch the noise where the part draws
it (Opacus' ``_generate_noise`` for DPSGD parts, ``GradientSanitizer.noise`` for sanitisers),
not the audit.

GS-WGAN's mutation is σ/20, not σ/4: at this setting (rate 1/4, 300 releases, ε = 1) its part
was accounted with Theorem 9 of Wang-Balle-Kasiviswanathan (σ = 85, ~5× what the mixture
needs, so σ/4 was still private enough that no audit could flag it). Under
Theorem 27 (now) the same setting calibrates σ = 36; the σ/20 case is kept as it was.

dpmean's and dpmerf's one-shot releases (``privacy.release.GaussianRelease``) hold one canary
per coordinate when they have fewer coordinates than ``--canaries``; their counts (dpmerf's is
one number) are too small and are listed as not observed."""

from __future__ import annotations

import json
from pathlib import Path

import opacus.optimizers.optimizer as opacus_optimizer
import opacus.optimizers.optimizer_fast_gradient_clipping as opacus_fast
import pytest
from click.testing import CliRunner

from dpgen_bench.cli import cli
from dpgen_bench.privacy.release import GaussianRelease
from dpgen_bench.privacy.sanitizer import GradientSanitizer

CASES = {  # method: (settings, the planted noise scale that must be caught)
    "dpgan": (["--set", "steps=300", "--set", "batch_size=256", "--set", "d_width=16"], 0.25),
    "dpsinkhorn": (["--set", "steps=300"], 0.2),  # σ/4: bound 0.94 (curve rejected) with the keyed streams
    "gswgan": (["--set", "steps=300"], 0.05),
    "dpmean": ([], 0.2),  # three parts share ε = 1: each alone is far below it
    "dpmerf": ([], 0.25),
}


def _plant(monkeypatch, scale: float) -> None:
    for mod in (opacus_optimizer, opacus_fast):
        def quieter(std, reference, *a, _real=mod._generate_noise, **k):
            return _real(std * scale, reference, *a, **k)
        monkeypatch.setattr(mod, "_generate_noise", quieter)
    real_noise = GradientSanitizer.noise
    monkeypatch.setattr(GradientSanitizer, "noise", lambda self, like: real_noise(self, like) * scale)
    real_release = GaussianRelease.noise
    monkeypatch.setattr(GaussianRelease, "noise", lambda self, like: real_release(self, like) * scale)


def _audit(tmp_path: Path, method: str, extra: list[str]):
    out = tmp_path / method
    res = CliRunner().invoke(cli, ["audit", "-m", method, "--preset", "tiny", "--eps", "1", "--white-box",
                                   "--canaries", "3000", "--device", "cpu", "--out", str(out), *extra])
    return res, json.loads((out / "audit.json").read_text()) if (out / "audit.json").exists() else None


@pytest.mark.parametrize("method", ["dpsinkhorn", "gswgan", pytest.param("dpgan", marks=pytest.mark.slow)])
def test_white_box_audit_of_the_correct_part_stays_below_the_accountant(tmp_path, method):
    res, audit = _audit(tmp_path, method, CASES[method][0])
    assert res.exit_code == 0, res.output
    (name, bound), = audit["attacks"].items()
    assert name.startswith("white_box_grad_") and 0 <= bound["epsilon_lower_bound"] <= 1.0
    assert audit["violation"] == [] and audit["mode"] == "white_box"
    part = name.removeprefix("white_box_grad_")
    assert audit["parts_observed"][part]["releases"] == 300  # every release of the part carried the canaries
    # GS-WGAN's records are drawn at 1/K: each release's likelihood ratio (privacy.canaries.mixture_log_ratio)
    assert audit["parts_observed"][part]["score"] == ("mixture" if method == "gswgan" else "sum")


@pytest.mark.parametrize("method", ["dpmean", "dpmerf"])
def test_white_box_audit_of_one_shot_releases(tmp_path, method):
    """Every release with room for canaries is observed once (one release, rate 1), with one
    canary per coordinate where it has fewer than 3,000; the correct code stays ≤ ε."""
    res, audit = _audit(tmp_path, method, CASES[method][0])
    assert res.exit_code == 0, res.output
    expect = {"dpmean": ({"class_sums", "class_squares", "class_counts"}, set()),
              "dpmerf": ({"embedding_sum"}, {"count"})}[method]
    assert set(audit["parts_observed"]) == expect[0] and set(audit["parts_not_observed"]) == expect[1]
    for part, seen in audit["parts_observed"].items():
        assert seen["releases"] == 1 and 2 <= seen["count"] <= 3000 and seen["sample_rate"] == 1.0, part
    assert all(0 <= b["epsilon_lower_bound"] <= 1.0 for b in audit["attacks"].values())


# dpgan's case as above (σ/4, 300 steps: ~40 CPU-s) is `slow`; the default suite's twin runs
# the same path (Opacus' DPSGD noise, the D's canaries, the violation exit) with a tenth of the
# noise over 100 steps (~15 CPU-s): bound 1.74 / 1.73 for seeds 0 / 1 against ε = 1 (with σ/4
# at 150 steps it was 1.08 / 1.26: too close to ε to be a test).
FAST_TWINS = {"dpgan-fast": (["--set", "steps=100", "--set", "batch_size=256", "--set", "d_width=16"], 0.1)}


@pytest.mark.parametrize("method", ["dpsinkhorn", "gswgan", pytest.param("dpgan", marks=pytest.mark.slow),
                                    "dpgan-fast", "dpmean", "dpmerf"])
def test_white_box_audit_catches_a_part_with_too_little_noise(tmp_path, monkeypatch, method):
    extra, scale = CASES.get(method) or FAST_TWINS[method]
    method = method.removesuffix("-fast")
    _plant(monkeypatch, scale)
    res, audit = _audit(tmp_path, method, extra)
    assert res.exit_code == 3, res.output
    assert "privacy violation" in res.output and "Traceback" not in res.output
    assert audit["violation"] and all(audit["attacks"][a]["epsilon_lower_bound"] > 1.0 for a in audit["violation"])


# GS-WGAN's two accountants on digits (docs/auditing.md, "GS-WGAN's per-row accounting, rejected"):
# canaries that move all B rows of a release when drawn (rate 1/K), scored by each release's
# likelihood ratio. K = 1,437 (digits' N), T = 1,000, 4,000 canaries, ε = 1: the per-row
# accountant of privacy_mode=paper is rejected (ε-bound 1.1-1.3 and its curve, seeds 0-2),
# the sound one holds (~0). About 100 CPU-s each; the mechanism-level twin in the default
# suite is tests/unit/test_gswgan_white_box.py.
@pytest.mark.slow
@pytest.mark.parametrize("mode", ["paper", "sound"])
def test_white_box_audit_rejects_gswgans_per_row_accounting_and_holds_the_sound_one(tmp_path, mode):
    out = tmp_path / mode
    res = CliRunner().invoke(cli, ["audit", "-m", "gswgan", "--dataset", "digits", "--preset", "quick", "--eps", "1",
                                   "--set", "num_discriminators=1437", "--set", "steps=1000",
                                   "--set", "pretrain_steps=1", "--set", f"privacy_mode={mode}", "--white-box",
                                   "--canaries", "4000", "--device", "cpu", "--out", str(out)])
    audit = json.loads((out / "audit.json").read_text())
    (bound,) = audit["attacks"].values()
    if mode == "paper":
        assert res.exit_code == 3 and "privacy violation" in res.output, res.output
        assert bound["epsilon_lower_bound"] > 1.0 and bound["accountant_curve_rejected"], bound
    else:
        assert res.exit_code == 0, res.output
        assert bound["epsilon_lower_bound"] <= 1.0 and not bound["accountant_curve_rejected"], bound


def test_white_box_audit_observes_every_part_of_dpaf(tmp_path):
    """conv1 and conv2* (DPSGD) and DPAGG (a subsampled Gaussian sum, privacy.release): all three
    hold canaries; DPAGG's tiny aggregate (8 maps of 2×2 = 32 values) one per coordinate."""
    res, audit = _audit(tmp_path, "dpaf", ["--canaries", "200"])
    assert res.exit_code == 0, res.output
    assert audit["parts_not_observed"] == [] and "parts not observed" not in res.output
    assert set(audit["parts_observed"]) == {"conv1", "conv2", "dpagg"}
    dpagg = audit["parts_observed"]["dpagg"]
    assert dpagg["canaries"] == "SanitizerCanaries" and dpagg["count"] < 200 and dpagg["releases"] > 1
    assert all(0 <= b["epsilon_lower_bound"] <= 1.0 for b in audit["attacks"].values())


def test_white_box_audit_names_the_parts_it_cannot_observe(tmp_path):
    """dpmerf's count is one number: no room for canaries; listed, not hidden."""
    res, audit = _audit(tmp_path, "dpmerf", ["--canaries", "200"])
    assert res.exit_code == 0, res.output
    assert audit["parts_not_observed"] == ["count"] and "parts not observed: count" in res.output


def test_white_box_audit_refusals(tmp_path):
    for args, needle in ((["-m", "gan"], "private run"), (["-m", "dpgan", "--eps", "1", "--noise-off"], None)):
        res = CliRunner().invoke(cli, ["audit", "--white-box", "--preset", "tiny", "--out", str(tmp_path / "x"),
                                       *args])
        if needle is None:  # no --noise-off flag on bench audit
            assert res.exit_code == 2
            continue
        assert res.exit_code == 2 and needle in res.output and "Traceback" not in res.output, res.output


def test_more_canaries_than_a_part_can_hold_is_one_line(tmp_path):
    res = CliRunner().invoke(cli, ["audit", "-m", "dpgan", "--preset", "tiny", "--eps", "1", "--white-box",
                                   "--canaries", "10000000", "--device", "cpu", "--out", str(tmp_path / "x")])
    assert res.exit_code == 2 and "use --canaries ≤" in res.output and "Traceback" not in res.output, res.output


def test_white_box_audit_refuses_a_method_without_canaries_before_training(tmp_path, monkeypatch):
    """dpkernel's Gaussian-process release has no canary kind: one line, exit 2, and fit never runs."""
    from methods.dpkernel import DPKernel

    def no_fit(*a, **k):
        raise AssertionError("fit ran before the refusal")

    monkeypatch.setattr(DPKernel, "fit", no_fit)
    res = CliRunner().invoke(cli, ["audit", "-m", "dpkernel", "--preset", "tiny", "--eps", "1", "--white-box",
                                   "--device", "cpu", "--out", str(tmp_path / "x")])
    assert res.exit_code == 2 and "cannot be audited white-box" in res.output, res.output
    assert "Traceback" not in res.output and not (tmp_path / "x").exists()
