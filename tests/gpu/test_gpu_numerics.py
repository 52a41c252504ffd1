"""On CUDA a run trains with TF32 off (dpgen_bench.numerics), and ``DPGEN_ALLOW_TF32=1``
trains with it on and records the ε caveat. (The CPU side: tests/unit/test_numerics.py.)"""

import json

import pytest
import torch

from dpgen_bench.cli import cli
from dpgen_bench.numerics import ALLOW_TF32_ENV


@pytest.mark.gpu
@pytest.mark.parametrize("allow", [False, True])
def test_cuda_training_is_float32_unless_tf32_is_allowed(monkeypatch, cli_runner, results, allow):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from methods.dummy import Dummy

    seen = []
    fit = Dummy.fit

    def spy_fit(self, *a, **k):
        seen.append((torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32))
        return fit(self, *a, **k)

    monkeypatch.setattr(Dummy, "fit", spy_fit)
    if allow:
        monkeypatch.setenv(ALLOW_TF32_ENV, "1")
    else:
        monkeypatch.delenv(ALLOW_TF32_ENV, raising=False)
    before = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)
    res = cli_runner.invoke(cli, ["run", "--method", "dummy", "--eps", "1", "--eval", "", "--device", "cuda"])
    assert res.exit_code == 0, (res.stderr, res.exception)
    assert seen == [(allow, allow)]
    assert (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32) == before
    (run,) = [d for d in results.iterdir() if d.is_dir()]
    assert json.loads((run / "eval.json").read_text())["protocol"]["throughput"]["tf32"] is allow
    caveat = json.loads((run / "privacy.json").read_text())["caveat"]
    assert (caveat is not None and ALLOW_TF32_ENV in caveat) is allow
