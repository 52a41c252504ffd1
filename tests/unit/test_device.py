"""CUDA code paths that can be checked without a GPU (this project's CI has none): the
failure modes a static audit found, each reproduced with the CPU stand-in that fails the
same way (a tensor that refuses numpy conversion, a patched device count)."""

from __future__ import annotations

import pytest
import torch

from dpgen_bench.api import Split
from dpgen_bench.errors import UserError
from dpgen_bench.runner import resolve_device


def test_subset_takes_a_tensor_index_without_going_through_numpy(monkeypatch):
    """``poisson_batch`` returns indices on the run's device; numpy cannot read a CUDA
    tensor ("can't convert cuda:0 device type tensor to numpy"), which stopped every dpgan
    and gan run on CUDA at the first step."""
    split = Split(torch.randn(10, 1, 2, 2), torch.arange(10))

    def no_numpy(*_a, **_k):
        raise TypeError("can't convert cuda:0 device type tensor to numpy")

    monkeypatch.setattr(torch.Tensor, "__array__", no_numpy)
    monkeypatch.setattr(torch.Tensor, "numpy", no_numpy)
    sub = split.subset(torch.tensor([1, 3, 7]))
    assert sub.labels.tolist() == [1, 3, 7]
    assert torch.equal(sub.images, split.images[[1, 3, 7]])


def test_subset_still_takes_numpy_and_lists():
    import numpy as np

    split = Split(torch.randn(5, 1, 2, 2), torch.arange(5))
    assert split.subset(np.array([4, 0])).labels.tolist() == [4, 0]
    assert split.subset([2]).labels.tolist() == [2]


@pytest.fixture
def one_fake_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)


def test_resolve_device_checks_the_gpu_index(one_fake_gpu):
    assert resolve_device("cuda") == torch.device("cuda")
    assert resolve_device("cuda:0") == torch.device("cuda:0")
    assert resolve_device("auto") == torch.device("cuda")
    with pytest.raises(UserError, match=r"1 CUDA device\(s\) \(cuda:0 to cuda:0\)"):
        resolve_device("cuda:1")


def test_resolve_device_refuses_unsupported_and_unknown_devices():
    with pytest.raises(UserError, match="only cpu and cuda"):
        resolve_device("meta")
    with pytest.raises(UserError, match="unknown device"):
        resolve_device("gpu0")
    assert resolve_device("cpu") == torch.device("cpu")


def test_fid_extraction_turns_tf32_off_on_cuda_and_restores_it():
    """cuDNN convolutions default to TF32 on recent GPUs (~1e-3 relative change in the
    Inception features): extraction runs in full fp32 and puts the flags back."""
    from evaluators.inception import ExtractionPlan, extraction_mode

    before = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = True
    try:
        with extraction_mode(ExtractionPlan(device="cuda", num_threads=None)):
            assert not torch.backends.cudnn.allow_tf32 and not torch.backends.cuda.matmul.allow_tf32
        assert torch.backends.cudnn.allow_tf32 and torch.backends.cuda.matmul.allow_tf32
        with extraction_mode(ExtractionPlan(device="cpu", num_threads=None)):  # nothing to change on the CPU
            assert torch.backends.cudnn.allow_tf32
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = before


def test_environment_names_the_gpu_of_the_chosen_index(monkeypatch):
    from dpgen_bench import store

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d: f"GPU{torch.device(d).index}")
    monkeypatch.setattr(torch.backends.cudnn, "version", lambda: 90000)
    env = store.environment("cuda:1")
    assert env["device"]["name"] == "cuda:1" and env["device"]["gpu"] == "GPU1"


def test_environment_names_the_cpu_and_its_kernels():
    """Another CPU type draws other numbers from the same seed: the record says which CPU it was."""
    from dpgen_bench import store

    env = store.environment("cpu")
    assert env["device"]["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert env["device"]["cpu"] == store.cpu_model() and isinstance(env["device"]["cpu"], (str, type(None)))


def test_local_sweep_workers_are_spread_over_the_visible_gpus(monkeypatch, one_fake_gpu):
    import multiprocessing as mp
    import os

    from dpgen_bench import sweep

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert sweep.visible_gpus() == ["0", "1"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3, 5,7")
    gpus = sweep.visible_gpus()
    assert gpus == ["3", "5", "7"]
    counter = mp.get_context("spawn").Value("i", 0)
    seen = []
    for _ in range(4):  # four workers start, one after another
        sweep._pin_worker_gpu(counter, gpus)
        seen.append(os.environ["CUDA_VISIBLE_DEVICES"])
    assert seen == ["3", "5", "7", "3"]


def test_no_gpus_to_spread_over_without_cuda(monkeypatch):
    from dpgen_bench import sweep

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert sweep.visible_gpus() == []
