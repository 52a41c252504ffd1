"""Paper-preset runs at the real MNIST size (60,000 / 10,000 random images in
torchvision's IDX layout, so no download is needed), one per private method.

- ``-m gpu`` (opt-in, needs CUDA): a few hundred private steps each on the GPU. They check
  that the run lands on the GPU, that the record is complete and within budget, and that
  throughput (private steps per second of training) is logged; they print it for
  benchmarks/README.md.
- ``-m slow`` (CPU twin): the same code path (full-size data, paper preset, paper-width
  networks, record, throughput) for a couple of steps on the CPU, so the GPU tests cannot
  rot unnoticed on a machine without a GPU. Only the device and the step counts differ.
"""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from dpgen_bench.cli import cli
from fake_data import write_idx

# method -> --set overrides that cut a paper preset down to a few hundred private steps (GPU)
SHORT = {
    "dpgan": ["steps=300"],
    "dpaf": ["batches=400", "classifier_batches=100"],
    "gswgan": ["steps=300", "pretrain_steps=2", "num_discriminators=100"],
    "dpac": ["steps=300", "pretrain_steps=2", "num_discriminators=100", "t_c=100"],
    "dpdm": ["steps=2"],  # B = 4,096 × K = 32 rows a step in 64 chunks: ~24 s a step (H200, 2026-11-27)
}
# ... and to a couple of steps (the CPU twin; paper width is slow on the CPU)
TINY = {
    "dpgan": ["steps=2"],
    "dpaf": ["batches=8", "classifier_batches=2"],  # 𝔹 ≥ μ = 8: conv2* takes one step
    "gswgan": ["steps=2", "pretrain_steps=1", "num_discriminators=10"],
    "dpac": ["steps=2", "pretrain_steps=1", "num_discriminators=10", "t_c=1"],  # C is used at t = 2
    "dpdm": ["steps=2", "batch_size=16", "noise_multiplicity=2", "max_physical_batch=8", "sampler_steps=3"],
}


@pytest.fixture(autouse=True)
def _own_cache(tmp_path_factory, monkeypatch):
    """The decoded 60,000-image cache goes to a temporary $DPGEN_CACHE, not ~/.cache."""
    monkeypatch.setenv("DPGEN_CACHE", str(tmp_path_factory.getbasetemp() / "dpgen_cache"))


@pytest.fixture(scope="module")
def fake_mnist(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("data")
    rng = np.random.default_rng(0)
    raw = root / "MNIST" / "raw"
    for split, n in (("train", 60_000), ("t10k", 10_000)):
        write_idx(raw / f"{split}-images-idx3-ubyte", rng.integers(0, 256, (n, 28, 28)))
        write_idx(raw / f"{split}-labels-idx1-ubyte", rng.integers(0, 10, n))
    return root


def run_paper_preset(method, device, overrides, data_root, cli_runner, results, tmp_path, samples_per_class=None):
    """One ``bench run --preset paper`` on the fake MNIST; returns (env, privacy, throughput)."""
    args = ["run", "--method", method, "--dataset", "mnist", "--eps", "10", "--preset", "paper", "--device", device,
            "--data-root", str(data_root), "--eval", "gen2real_cnn"]
    for s in overrides:
        args += ["--set", s]
    if samples_per_class is not None:
        cfg = tmp_path / "run.json"
        cfg.write_text(json.dumps({"samples_per_class": samples_per_class}))
        args += ["--config", str(cfg)]
    res = cli_runner.invoke(cli, args)
    assert res.exit_code == 0, (res.stderr, res.exception)
    (run,) = [d for d in results.iterdir() if d.is_dir()]
    env = json.loads((run / "env.json").read_text())
    privacy = json.loads((run / "privacy.json").read_text())
    assert privacy["epsilon"]["rdp"] <= 10.0
    ev = json.loads((run / "eval.json").read_text())
    assert 0.0 <= ev["metrics"]["gen2real_cnn"] <= 1.0
    throughput = ev["protocol"]["throughput"]
    assert sum(throughput["private_steps"].values()) > 0
    assert throughput["private_steps_per_second"] > 0
    return env, privacy, throughput


@pytest.mark.gpu
@pytest.mark.parametrize("method", sorted(SHORT))
def test_paper_preset_runs_on_the_gpu_and_logs_throughput(method, fake_mnist, cli_runner, results, tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    env, _, throughput = run_paper_preset(method, "cuda", SHORT[method], fake_mnist, cli_runner, results, tmp_path,
                                          samples_per_class=100)  # not 6,000: the steps are timed, not the samples
    assert env["device"]["name"].startswith("cuda") and env["device"]["gpu"]
    print(f"\n{method}: {throughput}")  # noqa: T201 - the figure goes to benchmarks/README.md


@pytest.mark.slow
@pytest.mark.parametrize("method", sorted(TINY))
def test_paper_preset_cpu_twin(method, fake_mnist, cli_runner, results, tmp_path):
    env, privacy, _ = run_paper_preset(method, "cpu", TINY[method], fake_mnist, cli_runner, results, tmp_path,
                                       samples_per_class=10)
    assert env["device"]["name"] == "cpu"
    assert all(0 < part["steps"] <= 8 for part in privacy["parts"])  # the cut reached the method
