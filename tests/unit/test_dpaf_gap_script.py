"""``benchmarks/dpaf_gap.py``: the diagnostic of DPAF's no-noise gap, on a tiny run, and its
within-class spread measure against hand-made sets."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
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


# a dpaf run in a child process (12 s of a core): -m slow, beside the evidence it regenerates
@pytest.mark.slow
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
    assert -1 <= row["D_gradient_alignment_real"] <= 1


def test_the_direction_field_measure_is_one_for_a_linear_critic_and_lower_for_a_curved_one():
    from dpaf_gap import gradient_alignment
    import torch

    g = torch.Generator().manual_seed(0)
    images = torch.rand(60, 1, 4, 4, generator=g) * 2 - 1
    labels = torch.arange(60) % 3
    w = torch.randn(1, 1, 4, 4, generator=g)
    linear = lambda x, y: (x * w).flatten(1).sum(1)  # noqa: E731  the same gradient everywhere
    assert gradient_alignment(linear, images, labels, n=20) == pytest.approx(1.0, abs=1e-5)
    centre = torch.zeros(1, 1, 4, 4)
    curved = lambda x, y: -((x - centre) ** 2).flatten(1).sum(1)  # noqa: E731  gradients point at the centre
    assert gradient_alignment(curved, images, labels, n=20) < 0.5


def test_the_collapse_script_runs_its_switches(capsys):
    """``benchmarks/dpaf_collapse.py``: DPAF's networks as a plain GAN, a few steps, both G's
    and both of D's inputs; one JSON line per seed with the spread measure. Its ``main`` is
    called here (the script's own command line is the dpaf_gap test's subprocess above: a
    fresh interpreter costs ~7 CPU-s of imports)."""
    from dpaf_collapse import main

    threads = torch.get_num_threads()
    for extra in ([], ["--agg", "--freeze-conv1", "--g-activation", "relu", "--g-batchnorm", "--g-label", "embedding"]):
        try:
            assert main(["--dataset", "digits", "--steps", "3", "--seeds", "0,1", "--width", "4", "--g-width", "4",
                         *extra]) == 0
        finally:
            torch.set_num_threads(threads)  # the script takes one thread
        rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        assert [r["seed"] for r in rows] == [0, 1]
        assert all(0 <= r["within_class_std"] < 1 and 0.1 < r["within_class_std_real"] < 1 for r in rows)
        assert rows[0]["agg"] == ("--agg" in extra) and rows[0]["g_batchnorm"] == ("--g-batchnorm" in extra)
