"""Resume: a run killed mid-training (SIGKILL) and resumed ends with the same privacy
record as an uninterrupted run of the same config and seed; SIGTERM checkpoints and
stops with a clear line."""

import json
import signal
import sys
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


def test_killed_run_resumes_to_the_same_privacy_record(tmp_path, cli_runner):
    ref = tmp_path / "uninterrupted"
    res = cli_runner.invoke(cli, ARGS + ["--out", str(ref)])
    assert res.exit_code == 0, (res.stderr, res.exception)

    out = tmp_path / "killed"
    proc = _spawn(out, {"DPGEN_CHECKPOINT_SECONDS": "0"})
    _wait_for_checkpoint(out, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (out / "eval.json").exists() and not (out / "privacy.json").exists()

    res = cli_runner.invoke(cli, ["run", "--resume", str(out)])
    assert res.exit_code == 0, (res.stderr, res.exception)
    a, b = _privacy(ref), _privacy(out)
    assert a["parts"][0]["steps"] == b["parts"][0]["steps"] == STEPS
    assert a["epsilon"] == b["epsilon"] and a["parts"][0]["noise_multiplier"] == b["parts"][0]["noise_multiplier"]
    assert (out / "eval.json").is_file()
    assert not (out / "resume.pt").exists()  # unreleased state (the noise's generator): gone once complete
    ma = json.loads((ref / "eval.json").read_text())["metrics"]["gen2real_cnn"]
    mb = json.loads((out / "eval.json").read_text())["metrics"]["gen2real_cnn"]
    assert abs(ma - mb) < 0.25  # within seed noise of a tiny model

    res = cli_runner.invoke(cli, ["run", "--resume", str(out)])  # finished: refused
    assert res.exit_code == 2 and "already finished" in res.stderr


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
