"""Resume: SIGTERM checkpoints and stops with a clear line; a resume refuses another
config; sweeps resume their cells. (A killed run resumed to the same record, method by
method: test_resume_methods.py.)"""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dpgen_bench.cli import cli

sys.path.insert(0, str(Path(__file__).parent))
from cli_process import CliProcess, wait_until  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
STEPS = 200  # the killed run's D steps
ARGS = ["run", "--method", "dpgan", "--eps", "2", "--preset", "tiny", "--set", f"steps={STEPS}", "--seed", "3"]


def _spawn(out: Path, env_extra: dict, extra_args: tuple[str, ...] = ()) -> CliProcess:
    """``bench ARGS --out OUT`` in a child process (one torch thread), to be killed."""
    return CliProcess([*ARGS, *extra_args, "--out", str(out)], env={"OMP_NUM_THREADS": "1", **env_extra}, cwd=ROOT)


def _wait_for_checkpoint(out: Path, proc: CliProcess, min_steps: int = 40, timeout: float = 240):
    def reached() -> bool:
        if not ((out / "resume.pt").exists() and (out / "train.jsonl").exists()):
            return False
        lines = (out / "train.jsonl").read_text().splitlines()
        return bool(lines) and json.loads(lines[-1])["d_step"] >= min_steps

    wait_until(reached, proc, timeout=timeout, every=0.2)


def _privacy(d: Path) -> dict:
    return json.loads((d / "privacy.json").read_text())


def test_sigterm_checkpoints_and_says_how_to_resume(tmp_path, cli_runner):
    out = tmp_path / "term"
    proc = _spawn(out, {"DPGEN_CHECKPOINT_SECONDS": "0"})
    _wait_for_checkpoint(out, proc, min_steps=20)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130
    assert f"resume with: bench run --resume {out}" in err
    assert (out / "resume.pt").is_file() and not (out / "failed.json").exists()


def test_resume_refuses_a_different_config(tmp_path, cli_runner):
    out = tmp_path / "x"
    proc = _spawn(out, {"DPGEN_CHECKPOINT_SECONDS": "0"})
    _wait_for_checkpoint(out, proc, min_steps=10)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    res = cli_runner.invoke(cli, ["run", "--resume", str(out), "--eps", "5"])
    assert res.exit_code == 2 and "differ from the run's config in epsilon" in res.stderr
    import torch

    state = torch.load(out / "resume.pt", weights_only=True)
    assert state["device"] == "cpu"
    torch.save({**state, "device": "cuda"}, out / "resume.pt")  # as if checkpointed on a GPU machine
    res = cli_runner.invoke(cli, ["run", "--resume", str(out), "--device", "cpu"])
    assert res.exit_code == 2 and "checkpointed on cuda" in res.stderr and "--device cuda" in res.stderr
    (out / "resume.pt").write_bytes(b"truncated")
    res = cli_runner.invoke(cli, ["run", "--resume", str(out)])
    assert res.exit_code == 2 and "cannot read the checkpoint" in res.stderr
    res = cli_runner.invoke(cli, ["run", "--resume", str(tmp_path / "nothing")])
    assert res.exit_code == 2 and "not a run directory" in res.stderr


def test_sweep_resumes_a_killed_cell_from_its_checkpoint(tmp_path, cli_runner):
    from dpgen_bench.sweep import expand

    root = tmp_path / "runs"
    grid = {"method": "dpgan", "eps": "2", "seeds": "3", "preset": "tiny", "set": {"steps": STEPS}}
    (cell,) = expand(grid)
    out = root / cell.run_name
    proc = _spawn(out, {"DPGEN_CHECKPOINT_SECONDS": "0"})  # the same config as the cell (ARGS)
    _wait_for_checkpoint(out, proc, min_steps=40)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    res = cli_runner.invoke(cli, ["sweep", "--method", "dpgan", "--eps", "2", "--seeds", "3", "--preset", "tiny",
                                  "--set", f"steps={STEPS}", "--results", str(root), "--no-report"])
    assert res.exit_code == 0, (res.stderr, res.exception)
    assert "1 interrupted: 1 resumed from a checkpoint" in res.stderr
    assert "resuming" in res.stderr
    assert _privacy(out)["parts"][0]["steps"] == STEPS
    assert not any(p.name.startswith(".failed-") for p in root.iterdir())


def test_sigterm_stops_a_sweep_not_only_its_cell(tmp_path, cli_runner, monkeypatch):
    """A sweep stopped by a signal ends after its running cell's checkpoint (it went on to the
    next cell, and the next, each stopped in turn by nothing); the same command resumes."""
    results = tmp_path / "runs"
    args = ["sweep", "--method", "dpgan", "--eps", "2", "--preset", "tiny", "--set", f"steps={STEPS}",
            "--seeds", "0,1", "--eval", "gen2real_mlp", "--no-report"]
    proc = CliProcess(args, env={"OMP_NUM_THREADS": "1", "DPGEN_CHECKPOINT_SECONDS": "0",
                                 "DPGEN_RESULTS": str(results)}, cwd=ROOT)
    wait_until(lambda: any(results.glob("*/resume.pt")), proc, timeout=240, every=0.2)
    (first,) = [p.parent for p in results.glob("*/resume.pt")]
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "interrupted: checkpoint written; the same bench sweep command resumes" in err
    assert [p.name for p in results.iterdir()] == [first.name]  # the next cell never started
    assert (first / "resume.pt").is_file() and not (first / "failed.json").exists()
    monkeypatch.setenv("DPGEN_RESULTS", str(results))
    res = cli_runner.invoke(cli, args)
    assert res.exit_code == 0, (res.stderr, res.exception)
    assert "2 cells, 0 already complete, 2 to run (1 interrupted: 1 resumed from a checkpoint)" in res.stderr
    assert len(list(results.glob("*/eval.json"))) == 2


def _children(pid: int) -> list[int]:
    """The live processes whose parent is ``pid`` (Linux /proc)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            out.append(int(stat.parent.name))
    return out


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
@pytest.mark.parametrize("to", ["sweep", "group"])
def test_sigterm_to_a_parallel_sweep_stops_its_workers_after_their_checkpoints(tmp_path, to):
    """SIGTERM to a ``--jobs 2`` sweep, by ``kill PID`` (the sweep only) or to its process group
    (Ctrl-C's way): both workers' cells checkpoint, the sweep exits 130 and no worker outlives
    it. Before, ``kill PID`` killed the sweep at once and its workers trained on, unseen, until
    their cells ended; a worker must also not get the signal twice (the second means "stop now",
    without a checkpoint)."""
    results = tmp_path / "runs"
    args = ["sweep", "--method", "dpgan", "--eps", "2", "--preset", "tiny", "--set", "steps=4000",
            "--seeds", "0,1", "--jobs", "2", "--eval", "gen2real_mlp", "--no-report"]
    # a real process (CliProcess's children are daemonic: they may not start workers)
    proc = subprocess.Popen([sys.executable, "-m", "dpgen_bench.cli", *args], cwd=ROOT, text=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1", "DPGEN_CHECKPOINT_SECONDS": "0",
                                 "DPGEN_RESULTS": str(results)})
    t0 = time.time()
    while len(list(results.glob("*/resume.pt"))) < 2:
        assert proc.poll() is None, proc.communicate()[1]
        assert time.time() - t0 < 240, "no checkpoints"
        time.sleep(0.2)
    workers = _children(proc.pid)
    assert workers, "no worker processes"
    (os.kill if to == "sweep" else os.killpg)(proc.pid, signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=120)  # orphaned workers would hold stderr open: a timeout
        assert proc.returncode == 130, err
        assert "interrupted: checkpoint written; the same bench sweep command resumes" in err
        left = workers
        for _ in range(50):  # the resource tracker exits when it sees the sweep gone
            left = [w for w in left if Path(f"/proc/{w}").exists()]
            if not left:
                break
            time.sleep(0.1)
        assert not left, [Path(f"/proc/{w}/cmdline").read_bytes().replace(b"\0", b" ")[:200] for w in left]
    finally:  # a failed run must not leave workers training
        for w in [proc.pid, *workers]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(w, signal.SIGKILL)
    for run in results.iterdir():
        assert (run / "resume.pt").is_file() and not (run / "eval.json").exists() and not (run / "failed.json").exists()
