"""Opt-in GPU tests (``pytest -m gpu``): one paper-preset run per private method on a
fake MNIST of the real size (60,000 / 10,000 random images in torchvision's IDX layout,
so no download is needed), a few hundred steps each, on CUDA. They check that the run
lands on the GPU, that the record is complete and within budget, and that throughput
(private steps per second of training) is logged; they print it for benchmarks/README.md."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from dpgen_bench.cli import cli
from fake_data import write_idx

pytestmark = pytest.mark.gpu

# method -> --set overrides that cut a paper preset down to a few hundred private steps
SHORT = {
    "dpgan": ["steps=300"],
    "dpaf": ["batches=400", "classifier_batches=100"],
    "gswgan": ["steps=300", "pretrain_steps=2", "num_discriminators=100"],
    "dpac": ["steps=300", "pretrain_steps=2", "num_discriminators=100", "t_c=100"],
}


@pytest.fixture(scope="module")
def fake_mnist(tmp_path_factory) -> Path:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    root = tmp_path_factory.mktemp("data")
    rng = np.random.default_rng(0)
    raw = root / "MNIST" / "raw"
    for split, n in (("train", 60_000), ("t10k", 10_000)):
        write_idx(raw / f"{split}-images-idx3-ubyte", rng.integers(0, 256, (n, 28, 28)))
        write_idx(raw / f"{split}-labels-idx1-ubyte", rng.integers(0, 10, n))
    return root


@pytest.mark.parametrize("method", sorted(SHORT))
def test_paper_preset_runs_on_the_gpu_and_logs_throughput(method, fake_mnist, cli_runner, results):
    args = ["run", "--method", method, "--dataset", "mnist", "--eps", "10", "--preset", "paper", "--device", "cuda",
            "--data-root", str(fake_mnist), "--eval", "gen2real_cnn"]
    for s in SHORT[method]:
        args += ["--set", s]
    res = cli_runner.invoke(cli, args)
    assert res.exit_code == 0, (res.stderr, res.exception)
    (run,) = [d for d in results.iterdir() if d.is_dir()]
    env = json.loads((run / "env.json").read_text())
    assert env["device"].startswith("cuda")
    privacy = json.loads((run / "privacy.json").read_text())
    assert privacy["epsilon"]["rdp"] <= 10.0
    protocol = json.loads((run / "eval.json").read_text())["protocol"]
    throughput = protocol["throughput"]
    assert throughput["private_steps_per_second"] > 0
    print(f"\n{method}: {throughput}")  # noqa: T201 - the figure goes to benchmarks/README.md
