"""``bench sweep --engine ray`` on a two-node Ray cluster on localhost: a head
node and a second node started with ``ray start``, one CPU each. The sweep spreads its cells
over both nodes, writes the records a local sweep writes, and resumes a cell that was killed
after its first checkpoint. Slow (about 85 s of a worker, its Ray daemons beside it): the default
suite runs `--engine ray` on a local instance (test_sweep.py); ``ray stop`` ends every Ray process
of this machine, so both Ray test files share one xdist worker."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from dpgen_bench.cli import cli

ray = pytest.importorskip("ray")
pytestmark = [pytest.mark.xdist_group("ray"), pytest.mark.slow]
sys.path.insert(0, str(Path(__file__).parent))
from test_resume import _privacy, _spawn, _wait_for_checkpoint  # noqa: E402 - the killed run of ARGS

RAY = Path(sys.executable).with_name("ray")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ray(*args: str, tmp: Path) -> None:
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    res = subprocess.run([str(RAY), *args], env=env, cwd=tmp, capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.fixture
def two_nodes(tmp_path, monkeypatch, ray_exclusive):
    if not RAY.exists() and shutil.which("ray") is None:
        pytest.skip("the ray command is not installed")
    # a local cluster without token authentication (Ray ≥ 2.5x may otherwise expect a token
    # the second node and the driver do not have)
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    port = _free_port()
    address = f"127.0.0.1:{port}"
    try:
        _ray("start", "--head", f"--port={port}", "--num-cpus=1", "--num-gpus=0", "--include-dashboard=false",
             "--disable-usage-stats", tmp=tmp_path)
        _ray("start", f"--address={address}", "--num-cpus=1", "--num-gpus=0", "--resources={\"second_node\": 1}",
             "--disable-usage-stats", tmp=tmp_path)
        ray.init(address=address)
        assert len([n for n in ray.nodes() if n["Alive"]]) == 2
        yield address
    finally:
        ray.shutdown()
        subprocess.run([str(RAY), "stop", "--force"], capture_output=True, timeout=120)


def test_a_sweep_spreads_over_two_nodes_and_resumes_a_killed_cell(two_nodes, tmp_path, cli_runner):
    from dpgen_bench.sweep import expand

    root = tmp_path / "runs"
    (killed,) = expand({"method": "dpgan", "eps": "2", "seeds": "3", "preset": "tiny", "set": {"steps": 200}})
    proc = _spawn(root / killed.run_name, {"DPGEN_CHECKPOINT_SECONDS": "0"})  # the same config as that cell
    _wait_for_checkpoint(root / killed.run_name, proc, min_steps=40)
    proc.send_signal(signal.SIGKILL)
    proc.wait()

    res = cli_runner.invoke(cli, ["sweep", "--method", "dpgan", "--eps", "2", "--seeds", "3,4", "--preset", "tiny",
                                  "--set", "steps=200", "--results", str(root), "--engine", "ray",
                                  "--address", two_nodes, "--no-report"])
    assert res.exit_code == 0, (res.stderr, res.exception)
    assert "1 interrupted: 1 resumed from a checkpoint" in res.stderr
    nodes = set(re.findall(r"done dpgan digits ε=2 seed=\d in [0-9.]+s on node (\w+)", res.stderr))
    assert len(nodes) == 2, res.stderr  # one cell on each node
    # the records a local sweep writes: complete, the full planned steps, config as the grid says
    for seed in (3, 4):
        (run,) = [d for d in root.iterdir() if d.is_dir() and json.loads((d / "config.json").read_text())["seed"] == seed]
        assert (run / "eval.json").exists() and not (run / "failed.json").exists()
        assert _privacy(run)["parts"][0]["steps"] == 200
    assert not any(p.name.startswith(".failed-") for p in root.iterdir())
