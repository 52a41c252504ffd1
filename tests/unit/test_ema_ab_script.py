"""``benchmarks/ema_ab.py`` on a tiny dpaf run: one training gives the released average, the
last iterate and a further decay, each with gen2real and its within-class spread; the plain
average appears only for the methods whose records kept one; ``--spread-only`` adds spreads to
the row without retraining."""

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
