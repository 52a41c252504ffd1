"""Resume for every private method: a run killed with SIGKILL mid-training and resumed with
``bench run --resume`` ends with the same privacy record (steps per part, noise, ε) as an
uninterrupted run of the same config and seed, with the same samples up to floating-point
noise and the same ``train.jsonl`` (the checkpoints restore every generator of randomness,
so a resumed CPU run repeats the uninterrupted one)."""

import json
import signal
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from dpgen_bench.cli import cli

sys.path.insert(0, str(Path(__file__).parent))
from cli_process import CliProcess, wait_until  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]

# (method, --set overrides, ledger part and the steps it must have reached at the kill)
CASES = {
    "dpaf-phase1": ("dpaf", ["batches=80", "classifier_batches=60"], "conv1", 10),
    # with G's average (β = 0.99: ~28 G steps follow the kill, 0.99^28 = 0.75 of it remembered)
    "dpaf-phase2": ("dpaf", ["batches=160", "classifier_batches=10", "ema_decay=0.99"], "dpagg", 24),
    "gswgan": ("gswgan", ["steps=120"], "generator_gradient", 15),
    "dpac": ("dpac", ["steps=50", "t_c=10"], "generator_gradient", 20),  # past t_c: C's real steps counted
    "dpdm": ("dpdm", ["steps=30"], "denoiser", 10),
    # dpgan with the generator's average, which the checkpoint must carry; β = 0.99 so that its
    # memory outlasts the ~100 steps after the kill (with β = 0.9 a plant that drops the
    # restore passed: 0.9^100 forgets it)
    "dpgan-ema": ("dpgan", ["steps=120", "ema_decay=0.99"], "discriminator", 15),
}


def _args(method: str, sets: list[str]) -> list[str]:
    args = ["run", "--method", method, "--dataset", "digits", "--eps", "5", "--preset", "tiny", "--seed", "7"]
    for s in sets:
        args += ["--set", s]
    return args


def _ledger(ckpt: Path) -> dict:
    try:
        return torch.load(ckpt, weights_only=True)["ledger"]
    except Exception:  # noqa: BLE001 - not written yet (the rename is atomic, the file never partial)
        return {}


def _flat_log(run: Path) -> list:
    """``train.jsonl``'s lines without their wall-clock times, numbers flattened in order so
    ``pytest.approx`` compares them (a resumed log must be the uninterrupted one: no line
    written after the last checkpoint repeated, no window that restarts at the resume)."""
    rows = [json.loads(line) for line in (run / "train.jsonl").read_text().splitlines()]
    flat = []

    def walk(v, key=""):
        if isinstance(v, dict):
            for k in sorted(v):
                if k != "time":
                    walk(v[k], f"{key}.{k}")
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            flat.append((key, float(v)))
        else:
            flat.append((key, v))

    for row in rows:
        walk(row)
    return flat


def _assert_same_log(run: Path, ref: Path) -> None:
    a, b = _flat_log(ref), _flat_log(run)
    assert [k for k, _ in b] == [k for k, _ in a]
    for (key, va), (_, vb) in zip(a, b, strict=True):
        assert vb == (pytest.approx(va, rel=1e-4, abs=1e-6) if isinstance(va, float) else va), key


def _spawn_until(out: Path, method: str, sets: list[str], part: str, min_steps: int) -> CliProcess:
    """Start the run in a child process (checkpoint at every chance) and return once its
    checkpoint has ``min_steps`` of ``part`` spent."""
    proc = CliProcess([*_args(method, sets), "--out", str(out)],
                      env={"OMP_NUM_THREADS": "1", "DPGEN_CHECKPOINT_SECONDS": "0"}, cwd=ROOT)
    wait_until(lambda: _ledger(out / "resume.pt").get(part, 0) >= min_steps, proc)
    return proc


@pytest.fixture
def one_thread():
    """The killed child process runs on one thread; so must the in-process runs compared with
    it, or reductions split differently across threads and the samples drift apart."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# The default suite keeps the two hardest paths (dpaf resumed in phase 2, dpac past t_c,
# which runs GS-WGAN's resume code too); the other two are `slow` to keep the default
# suite's time in CI's budget (they pass: run `pytest -m slow`).
SLOW_CASES = {"dpaf-phase1", "gswgan"}


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.slow) if c in SLOW_CASES else c
                                  for c in sorted(CASES)])
def test_killed_run_resumes_to_the_same_record(case, tmp_path, cli_runner, one_thread):
    method, sets, part, min_steps = CASES[case]
    ref = tmp_path / "uninterrupted"
    res = cli_runner.invoke(cli, _args(method, sets) + ["--out", str(ref)])
    assert res.exit_code == 0, (res.stderr, res.exception)

    out = tmp_path / "killed"
    proc = _spawn_until(out, method, sets, part, min_steps)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (out / "privacy.json").exists(), "the run finished before it was killed: raise its steps"
    assert not (out / "eval.json").exists()  # nothing `bench report` would read as a result
    killed_at = _ledger(out / "resume.pt")

    res = cli_runner.invoke(cli, ["run", "--resume", str(out)])
    assert res.exit_code == 0, (res.stderr, res.exception)
    assert "resuming" in res.stderr
    a = json.loads((ref / "privacy.json").read_text())
    b = json.loads((out / "privacy.json").read_text())
    assert a == b  # same parts, steps, noise multipliers, sample rates and ε
    assert next(p for p in b["parts"] if p["name"] == part)["steps"] > killed_at[part]
    sa, sb = np.load(ref / "samples.npz"), np.load(out / "samples.npz")
    np.testing.assert_array_equal(sa["labels"], sb["labels"])
    np.testing.assert_allclose(sa["images"], sb["images"], atol=1e-4)
    _assert_same_log(out, ref)
    assert (out / "eval.json").is_file()
    assert not (out / "resume.pt").exists()  # unreleased state (the noise's generator): gone once complete
    res = cli_runner.invoke(cli, ["run", "--resume", str(out)])  # finished: refused
    assert res.exit_code == 2 and "already finished" in res.stderr


def test_sigint_during_dpaf_phase2_checkpoints_and_resumes(tmp_path, cli_runner):
    out = tmp_path / "int"
    proc = _spawn_until(out, *CASES["dpaf-phase2"])
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert f"resume with: bench run --resume {out}" in err
    res = cli_runner.invoke(cli, ["run", "--resume", str(out)])
    assert res.exit_code == 0, (res.stderr, res.exception)
    assert json.loads((out / "privacy.json").read_text())["epsilon"]["rdp"] <= 5.0


# GS-WGAN's pretraining (the paper preset's 1,000 discriminators take about a day on a GPU)
# checkpoints too: within a discriminator's pretraining (its throw-away generator and
# optimiser in the checkpoint) and between two discriminators (pretrain_steps = 1 has only
# those). (--set overrides, the pretraining position (k, i) to wait for)
PRETRAIN_CASES = {
    "within-a-discriminator": (["num_discriminators=4", "pretrain_steps=30", "steps=10"], (1, 3)),
    "between-discriminators": (["num_discriminators=16", "pretrain_steps=1", "steps=10"], (5, 0)),
}


def _pretraining_at(ckpt: Path) -> tuple[int, int] | None:
    """(k, i) of a checkpoint written within pretraining, else None."""
    try:
        state = torch.load(ckpt, weights_only=True)["method"]
    except Exception:  # noqa: BLE001 - not written yet
        return None
    return (state["k"], state["i"]) if state.get("phase") == "pretrain" else None


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.slow) if c == "between-discriminators" else c
                                  for c in sorted(PRETRAIN_CASES)])
def test_run_killed_in_gswgan_pretraining_resumes_to_the_same_samples(case, tmp_path, cli_runner, one_thread):
    sets, (k, i) = PRETRAIN_CASES[case]
    ref = tmp_path / "uninterrupted"
    res = cli_runner.invoke(cli, _args("gswgan", sets) + ["--out", str(ref)])
    assert res.exit_code == 0, (res.stderr, res.exception)

    out = tmp_path / "killed"
    proc = CliProcess([*_args("gswgan", sets), "--out", str(out)],
                      env={"OMP_NUM_THREADS": "1", "DPGEN_CHECKPOINT_SECONDS": "0"}, cwd=ROOT)
    wait_until(lambda: (_pretraining_at(out / "resume.pt") or (-1, -1)) >= (k, i), proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    at = _pretraining_at(out / "resume.pt")
    assert at is not None, "the kill came after pretraining: raise pretrain_steps"
    if case == "within-a-discriminator":
        assert at[1] > 0  # the kill landed within D_k's pretraining (30 checkpoints each: all but one are)
    assert _ledger(out / "resume.pt").get("generator_gradient", 0) == 0

    res = cli_runner.invoke(cli, ["run", "--resume", str(out)])
    assert res.exit_code == 0, (res.stderr, res.exception)
    assert "resuming" in res.stderr
    assert not (out / "resume.pt").exists()  # the non-private discriminators do not outlive the run
    assert json.loads((ref / "privacy.json").read_text()) == json.loads((out / "privacy.json").read_text())
    sa, sb = np.load(ref / "samples.npz"), np.load(out / "samples.npz")
    np.testing.assert_array_equal(sa["labels"], sb["labels"])
    np.testing.assert_allclose(sa["images"], sb["images"], atol=1e-4)
    # The samples barely show it (each clipped gradient is small against the noise here): the
    # training log must, line for line (a D_k whose pretraining is redone after the kill
    # logs once: the lines past the checkpoint are cut on resume).
    _assert_same_log(out, ref)
    log = [json.loads(line) for line in (out / "train.jsonl").read_text().splitlines()]
    assert sum(x.get("phase") == "pretrain" for x in log) == int(sets[0].split("=")[1])  # K discriminators


def test_sigterm_in_gswgan_pretraining_checkpoints_and_exits(tmp_path):
    """No checkpoint is due (the default 300 s): the signal alone makes the pretraining loop
    write one and stop, not the 8,000 pretraining iterations left."""
    out = tmp_path / "term"
    sets = ["num_discriminators=4", "pretrain_steps=2000", "steps=10"]
    proc = CliProcess([*_args("gswgan", sets), "--out", str(out)],
                      env={"OMP_NUM_THREADS": "1", "DPGEN_PROGRESS_SECONDS": "0"}, cwd=ROOT)
    wait_until(lambda: "pretraining D_k: step 20/" in proc.stderr_so_far(), proc)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert f"resume with: bench run --resume {out}" in err
    at = _pretraining_at(out / "resume.pt")
    assert at is not None and at[0] == 0, at  # within D_0's 2,000 iterations, not at their end
