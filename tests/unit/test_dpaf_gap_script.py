"""``benchmarks/dpaf_gap.py``: the diagnostic of DPAF's no-noise gap, on a tiny run, and its
within-class spread measure against hand-made sets."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from dpgen_bench.cli import cli

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
from dpaf_gap import within_class_std  # noqa: E402


def test_within_class_std_is_zero_for_one_image_per_class_and_the_pixel_std_otherwise():
    rng = np.random.default_rng(0)
    protos = rng.uniform(-1, 1, size=(3, 1, 4, 4))
    labels = np.repeat(np.arange(3), 50)
    assert within_class_std(protos[labels], labels) == pytest.approx(0.0, abs=1e-12)  # a collapsed generator
    noisy = protos[labels] + rng.normal(0, 0.2, size=(150, 1, 4, 4))
    assert within_class_std(noisy, labels) == pytest.approx(0.2, rel=0.1)
    # classes are averaged, not pooled: the spread between class means does not count
    far = protos[labels] * 100
    assert within_class_std(far, labels) == pytest.approx(0.0, abs=1e-10)


def test_the_script_reads_a_noise_off_run(tmp_path):
    out = tmp_path / "run"
    res = CliRunner().invoke(cli, ["run", "-m", "dpaf", "--preset", "tiny", "--eps", "10", "--noise-off",
                                   "--eval", "gen2real_mlp", "--device", "cpu", "--out", str(out)])
    assert res.exit_code == 0, res.output
    line = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "dpaf_gap.py"), str(out)],
                          capture_output=True, text=True, check=True, timeout=300).stdout
    row = json.loads(line)
    assert row["noise_off"] is True and row["mu"] >= 1
    assert 0 <= row["D_batch_mean_auc"] <= 1 and 0 <= row["Dhat_single_auc"] <= 1
    real, fake = row["within_class_std_real_fake"]
    assert 0.1 < real < 1 and 0 <= fake < 1  # digits' real spread is ≈ 0.25
