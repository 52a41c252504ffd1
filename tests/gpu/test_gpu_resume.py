"""``--device auto`` on a GPU machine, and a checkpoint written on CUDA: it resumes on CUDA
to the privacy record of an uninterrupted run, and refuses the CPU with the README's line.
(The CPU side of the refusal, with a checkpoint relabelled as CUDA's, is in
tests/integration/test_resume.py.)"""

import json
import signal
import sys
from pathlib import Path

import pytest
import torch

from dpgen_bench.cli import cli

sys.path.insert(0, str(Path(__file__).parents[1] / "integration"))
from test_resume import ARGS, STEPS, _privacy, _spawn, _wait_for_checkpoint  # noqa: E402 - the killed run of ARGS


@pytest.mark.gpu
def test_auto_trains_on_cuda_and_its_checkpoint_resumes_on_cuda_only(tmp_path, cli_runner):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    ref = tmp_path / "uninterrupted"
    res = cli_runner.invoke(cli, [*ARGS, "--device", "auto", "--out", str(ref)])  # the killed run's own arguments
    assert res.exit_code == 0, (res.stderr, res.exception)
    assert json.loads((ref / "env.json").read_text())["device"]["name"].startswith("cuda")

    out = tmp_path / "killed"
    proc = _spawn(out, {"DPGEN_CHECKPOINT_SECONDS": "0"}, ("--device", "auto"))
    _wait_for_checkpoint(out, proc, min_steps=20)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert torch.load(out / "resume.pt", weights_only=True, map_location="cpu")["device"] == "cuda"

    res = cli_runner.invoke(cli, ["run", "--resume", str(out), "--device", "cpu"])
    assert res.exit_code == 2 and "checkpointed on cuda" in res.stderr and "--device cuda" in res.stderr
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in res.stderr, res.stderr  # one error line, no traceback

    res = cli_runner.invoke(cli, ["run", "--resume", str(out)])  # auto: CUDA here
    assert res.exit_code == 0, (res.stderr, res.exception)
    a, b = _privacy(ref), _privacy(out)
    assert a["parts"][0]["steps"] == b["parts"][0]["steps"] == STEPS and a["epsilon"] == b["epsilon"]
    assert json.loads((out / "env.json").read_text())["device"]["name"].startswith("cuda")
