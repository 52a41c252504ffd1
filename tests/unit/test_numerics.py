"""Training runs in float32 on CUDA (TF32 off) unless DPGEN_ALLOW_TF32=1; dpgen_bench.numerics
says why (TF32 moved dpgan's clipped update by 1.1e-2 relative on an H100)."""

import contextlib
import json

import pytest
import torch

from dpgen_bench import numerics
from dpgen_bench.cli import cli


@pytest.fixture
def tf32_on():
    before = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = True
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = before


def flags():
    return torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32


def test_exact_float32_turns_tf32_off_on_cuda_only_and_restores_it(tf32_on):
    with numerics.exact_float32("cuda"):
        assert flags() == (False, False)
    assert flags() == (True, True)
    with numerics.exact_float32(torch.device("cuda", 0), allow_tf32=True):
        assert flags() == (True, True)
    with numerics.exact_float32("cpu"):
        assert flags() == (True, True)  # nothing to change on the CPU
    with pytest.raises(RuntimeError), numerics.exact_float32("cuda"):
        raise RuntimeError("restored on the way out of an error too")
    assert flags() == (True, True)


@pytest.mark.parametrize("value,allowed", [(None, False), ("0", False), ("1", True), (" 1 ", True), ("yes", False)])
def test_tf32_is_allowed_only_by_the_variable_set_to_1(monkeypatch, value, allowed):
    if value is None:
        monkeypatch.delenv(numerics.ALLOW_TF32_ENV, raising=False)
    else:
        monkeypatch.setenv(numerics.ALLOW_TF32_ENV, value)
    assert numerics.tf32_allowed() is allowed


def _recorder(state: dict):
    """``exact_float32`` that records its (device type, allow_tf32) calls in ``state["calls"]``
    and whether a block is inside it in ``state["inside"]``."""
    real = numerics.exact_float32

    @contextlib.contextmanager
    def recorder(device, allow_tf32=False):
        state["calls"].append((torch.device(device).type, allow_tf32))
        with real(device, allow_tf32):
            state["inside"] = True
            try:
                yield
            finally:
                state["inside"] = False

    return recorder


@pytest.mark.parametrize("env", [None, "1"])
def test_the_fit_runs_inside_exact_float32(monkeypatch, cli_runner, results, env):
    """The runner wraps the method's fit, its sampling (dpdm samples on fit's device) and each
    evaluator (their classifiers and reference generators train too), and nothing records
    TF32 on the CPU, variable or not."""
    from dpgen_bench import runner
    from methods.dummy import Dummy

    if env:
        monkeypatch.setenv(numerics.ALLOW_TF32_ENV, env)
    state = {"inside": False, "calls": [], "fit_inside": None, "sample_inside": None, "eval_inside": None}
    recorder = _recorder(state)
    fit, sample = Dummy.fit, Dummy.sample

    def spy_fit(self, *a, **k):
        state["fit_inside"] = state["inside"]
        return fit(self, *a, **k)

    def spy_sample(self, *a, **k):
        state["sample_inside"] = state["inside"]
        return sample(self, *a, **k)

    monkeypatch.setattr(runner.numerics, "exact_float32", recorder)
    monkeypatch.setattr(Dummy, "fit", spy_fit)
    monkeypatch.setattr(Dummy, "sample", spy_sample)
    from evaluators.transfer import Gen2RealMLP

    def spy_evaluate(self, inp):
        state["eval_inside"] = state["inside"]
        return {"metrics": {"gen2real_mlp": 0.5}, "protocol": {}}

    monkeypatch.setattr(Gen2RealMLP, "evaluate", spy_evaluate)
    res = cli_runner.invoke(cli, ["run", "--method", "dummy", "--eps", "1", "--eval", "gen2real_mlp", "--device", "cpu"])
    assert res.exit_code == 0, (res.stderr, res.exception)
    assert state["fit_inside"] is True and state["sample_inside"] is True and state["eval_inside"] is True
    assert state["calls"] == [("cpu", False), ("cpu", False), ("cpu", False)]
    (run,) = [d for d in results.iterdir() if d.is_dir()]
    ev = json.loads((run / "eval.json").read_text())
    assert ev["protocol"]["throughput"]["tf32"] is False
    assert json.loads((run / "privacy.json").read_text())["caveat"] is None


def test_evaluator_preparations_run_inside_exact_float32(monkeypatch):
    """``bench sweep``'s shared preparation (the real2gen CNN) trains under the same numerics
    as the evaluation that loads it."""
    from dpgen_bench import runner
    from dpgen_bench.config import build_config
    from evaluators.transfer import Real2GenCNN

    state = {"inside": False, "calls": [], "seen": None}
    recorder = _recorder(state)
    def spy_prepare(self, data, *, seed, device):
        state["seen"] = state["inside"]
        return {"prepared": True}

    monkeypatch.setattr(runner.numerics, "exact_float32", recorder)
    monkeypatch.setattr(Real2GenCNN, "prepare", spy_prepare)
    cfg = build_config("dummy", "digits", epsilon=1.0, preset="tiny", evaluators=("real2gen_cnn",))
    assert runner.prepare_evaluators(cfg) == {"real2gen_cnn": {"prepared": True}}
    assert state["seen"] is True
