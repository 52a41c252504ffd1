"""``benchmarks/ema_ab.py`` on a tiny dpaf run: one training gives the released average, the
last iterate and a further decay, each with gen2real and its within-class spread; the plain
average appears only for the methods whose records kept one; ``--spread-only`` adds spreads to
the row without retraining."""

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _ema_ab(tmp_path, *extra):
    cmd = [sys.executable, str(ROOT / "benchmarks" / "ema_ab.py"), "--method", "dpaf", "--dataset", "digits",
           "--preset", "tiny", "--set", "ema_decay=0.9", "--set", "batches=12", "--decays", "0.5",
           "--results", str(tmp_path / "runs"), "--out", str(tmp_path / "rows.json"), *extra]
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True, timeout=600,
                   env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
    return json.loads((tmp_path / "rows.json").read_text())


@pytest.mark.slow
def test_one_training_gives_every_average_and_spread_only_keeps_the_accuracies(tmp_path):
    rows = _ema_ab(tmp_path)
    assert len(rows) == 1
    row = rows[0]
    variants = {"bias-corrected", "last_iterate", "bias-corrected 0.5"}
    assert set(row["gen2real_cnn"]) == variants  # no plain average: dpaf never kept one
    assert set(row["within_class_std"]) == variants
    assert 0 < row["within_class_std_real"] < 1
    assert row["g_updates"] == 6  # batches 12, n_critic 2 (tiny)
    # a marker in the accuracies: --spread-only must keep them, not evaluate again
    row["gen2real_cnn"] = {k: -1.0 for k in variants}
    row["within_class_std"] = {}
    (tmp_path / "rows.json").write_text(json.dumps([row]))
    rows = _ema_ab(tmp_path, "--spread-only")
    assert len(rows) == 1 and rows[0]["gen2real_cnn"] == {k: -1.0 for k in variants}
    assert set(rows[0]["within_class_std"]) == variants


def test_merge_adds_other_row_files_replacing_the_same_training(tmp_path, monkeypatch):
    def row(seed, sets, value):
        return {"method": "dpgan", "preset": "long", "seed": seed, "sets": sets, "gen2real_cnn": {"last_iterate": value}}
    out = tmp_path / "ema_ab.json"
    out.write_text(json.dumps([row(0, ["n_d=5"], 0.1), row(0, ["n_d=1"], 0.2)]))
    (tmp_path / "a.json").write_text(json.dumps([row(0, ["n_d=5"], 0.7)]))  # the same training, redone
    gpu = row(0, ["n_d=5"], 0.8) | {"device": "cuda"}  # the same settings on a GPU: a training of its own
    (tmp_path / "b.json").write_text(json.dumps([row(1, ["n_d=5"], 0.6), gpu]))
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))  # as when the script runs (it imports dpaf_gap)
    ema_ab = importlib.import_module("ema_ab")
    monkeypatch.setattr(sys, "argv", ["ema_ab.py", "--out", str(out), "--merge", str(tmp_path / "a.json"),
                                      str(tmp_path / "b.json")])
    ema_ab.main()
    rows = json.loads(out.read_text())
    assert sorted((r["seed"], r["sets"][0], r["gen2real_cnn"]["last_iterate"]) for r in rows) == [
        (0, "n_d=1", 0.2), (0, "n_d=5", 0.7), (0, "n_d=5", 0.8), (1, "n_d=5", 0.6)]


def test_merge_keeps_a_row_of_the_same_preset_name_and_settings_from_another_run(tmp_path, monkeypatch):
    """A preset's name with the same --set is another training once the preset has changed (its run
    has another directory): the new row must not replace the old one's record."""
    def row(run_dir, value):
        return {"method": "dpgan", "dataset": "mnist", "preset": "long", "seed": 0, "sets": ["n_d=5"],
                "run_dir": run_dir, "gen2real_cnn": {"last_iterate": value}}
    out = tmp_path / "ema_ab.json"
    out.write_text(json.dumps([row("results/ema_ab/dpgan-long-nd5-s0", 0.72)]))
    (tmp_path / "a.json").write_text(json.dumps([row("results/ema_ab/dpgan-long-w64-t12k-nd5-s0", 0.33),
                                                 row("results/ema_ab/dpgan-long-nd5-s0", 0.74)]))
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    ema_ab = importlib.import_module("ema_ab")
    monkeypatch.setattr(sys, "argv", ["ema_ab.py", "--out", str(out), "--merge", str(tmp_path / "a.json")])
    ema_ab.main()
    rows = json.loads(out.read_text())
    assert sorted((r["run_dir"], r["gen2real_cnn"]["last_iterate"]) for r in rows) == [
        ("results/ema_ab/dpgan-long-nd5-s0", 0.74), ("results/ema_ab/dpgan-long-w64-t12k-nd5-s0", 0.33)]
