"""Sweep workers (local processes and Ray tasks) cap their compute threads: torch's and the
BLAS pool numpy / scipy load with one thread per core (sklearn's MLP evaluators, FID's
matrix square root). Uncapped, two workers on two cores run four spinning threads."""

import json
import os
import subprocess
import sys

import pytest

from dpgen_bench import sweep

PROBE = """
import json, threadpoolctl, torch
from dpgen_bench.sweep import cap_threads
before = {d["internal_api"]: d["num_threads"] for d in threadpoolctl.threadpool_info()}
before["torch"] = torch.get_num_threads()
cap_threads(1)
after = {d["internal_api"]: d["num_threads"] for d in threadpoolctl.threadpool_info()}
after["torch"] = torch.get_num_threads()
print(json.dumps([before, after]))
"""


def test_cap_threads_caps_torch_and_blas():
    if (os.cpu_count() or 1) < 2:
        pytest.skip("one core: every pool starts with one thread")
    env = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")}  # the pools' own defaults
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    before, after = json.loads(out.stdout.splitlines()[-1])
    assert before["torch"] > 1 and before["openblas"] > 1, before  # what a worker starts with
    assert after["torch"] == 1 and after["openblas"] == 1 and after.get("openmp", 1) == 1, after


@pytest.mark.parametrize("entry", ["run_cell", "prepare_cell"])
def test_sweep_cells_cap_their_threads(monkeypatch, entry):
    capped = []
    monkeypatch.setattr(sweep, "cap_threads", capped.append)
    monkeypatch.setattr(sweep.RunConfig, "from_json", staticmethod(lambda j: j))
    monkeypatch.setattr(sweep.runner, "prepare", lambda cfg, root: cfg)
    monkeypatch.setattr(sweep.runner, "execute", lambda p, d, resume: {"metrics": {}, "privacy": {"epsilon": {}}})
    monkeypatch.setattr(sweep.runner, "prepare_evaluators", lambda cfg, root: {})
    fn = getattr(sweep, entry)
    args = ({}, "run") if entry == "run_cell" else ({},)
    fn(*args, None, 1)
    fn(*args, None, None)  # no cap asked (a GPU cell, or in-process): none set
    assert capped == [1]


def test_worker_threads_share_the_cores_and_keep_to_an_asked_cap(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert sweep.worker_threads(3) == 5 and sweep.worker_threads(32) == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert sweep.worker_threads(3) == 2 and sweep.worker_threads(16) == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "junk")
    assert sweep.worker_threads(3) == 5
