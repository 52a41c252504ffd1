"""``benchmarks/gpu_check.sh``, the GPU machine's one command: its stages run in the order
``STAGES`` gives, and ``BUDGET`` bounds the whole call (a stage's cap is cut to what is left,
a stage with too little left is skipped and says so), so that the records are packed before
the device tool's limit kills the call. Run here with a fake ``PY`` that records its
arguments: no GPU, torch or wheel is needed."""

import os
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"


def _fake_python(tmp_path: Path, slow: str = "") -> Path:
    """A stand-in for python3 that appends its arguments to calls.log; one whose arguments
    contain ``slow`` sleeps for a minute (a stage that would outrun its cap)."""
    fake = tmp_path / "fakepy"
    fake.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> "{tmp_path}/calls.log"\n'
        + (f'case "$*" in *{slow}*) exec sleep 60 ;; esac\n' if slow else "")
        + "exit 0\n")
    fake.chmod(0o755)
    return fake


def _run(tmp_path: Path, **env) -> tuple[subprocess.CompletedProcess, str, float]:
    out = tmp_path / "out"
    full = dict(os.environ, OUT=str(out), WHEELS=str(tmp_path / "no-wheels"), C_RESULTS=str(tmp_path / "runs"))
    full.update(env)
    t0 = time.monotonic()
    proc = subprocess.run(["bash", str(SCRIPT)], cwd=ROOT, env=full, capture_output=True, text=True, timeout=120)
    return proc, (out / "stages.txt").read_text(), time.monotonic() - t0


def test_stages_run_in_the_order_given(tmp_path):
    fake = _fake_python(tmp_path)
    proc, stages, _ = _run(tmp_path, PY=str(fake), STAGES="C P", C_RUNS="dpgan-quick-s0", DEVICE="cpu")
    assert proc.returncode == 0, proc.stderr
    calls = (tmp_path / "calls.log").read_text().splitlines()
    run = next(i for i, c in enumerate(calls) if "dpgen_bench.cli run --method dpgan --preset quick" in c)
    step = next(i for i, c in enumerate(calls) if "benchmarks/dpdm_step.py" in c)
    assert run < step, calls
    assert "--device cpu" in calls[run] and "--dataset mnist-5k" in calls[run]
    assert stages.index("== C_mnist5k") < stages.index("== P_dpdm_step")
    assert "done at" in stages


def test_the_budget_cuts_a_stage_short_and_skips_the_rest(tmp_path):
    fake = _fake_python(tmp_path, slow="dpdm_step.py")
    proc, stages, wall = _run(tmp_path, PY=str(fake), STAGES="P B C", BUDGET="6", RESERVE="1", MIN_STAGE="2")
    assert proc.returncode == 0, proc.stderr
    # P would sleep 60 s under its own cap of 120 s; the budget leaves it at most 5
    p_line = next(line for line in stages.splitlines() if line.startswith("== P_dpdm_step (cap "))
    cap = int(p_line.split("(cap ")[1].split(" s)")[0])
    assert 1 <= cap <= 5, p_line
    assert "P_dpdm_step rc=124" in stages
    assert "== B_presets skipped" in stages and "== C_mnist5k skipped" in stages
    assert "done at" in stages
    assert wall < 20, wall
    calls = (tmp_path / "calls.log").read_text()
    assert "gpu_presets.py" not in calls and "dpgen_bench.cli run" not in calls


def test_an_unknown_stage_is_named_not_ignored(tmp_path):
    fake = _fake_python(tmp_path)
    proc, stages, _ = _run(tmp_path, PY=str(fake), STAGES="X")
    assert proc.returncode == 0, proc.stderr
    assert "unknown stage X" in stages


def test_a_capped_run_finishes_its_checkpoint_before_the_records_are_packed(tmp_path):
    """The cap's SIGTERM reaches stage C's runs (timeout signals its process group); the
    stage waits while they write their resume checkpoints (a real run takes a second or
    more), so the packed records are whole, and partial files (``*.tmp``) stay out."""
    fake = tmp_path / "fakepy"
    fake.write_text(
        "#!/bin/bash\n"
        'case "$*" in *"dpgen_bench.cli run"*) ;; *) exit 0 ;; esac\n'
        'out=""; prev=""; for a in "$@"; do [ "$prev" = "--out" ] && out=$a; prev=$a; done\n'
        'mkdir -p "$out"; echo "{}" > "$out/config.json"; echo partial > "$out/.resume.pt.x1.tmp"\n'
        "trap 'sleep 1; echo \"{}\" > \"$out/interrupted.json\"; exit 130' TERM\n"
        "while :; do sleep 0.1; done\n")
    fake.chmod(0o755)
    proc, stages, wall = _run(tmp_path, PY=str(fake), STAGES="C", C_RUNS="dpgan-quick-s0", BUDGET="6", RESERVE="1",
                              MIN_STAGE="2")
    assert proc.returncode == 0, proc.stderr
    assert "C_mnist5k rc=124" in stages and "done at" in stages and wall < 20
    with tarfile.open(tmp_path / "out" / "mnist5k_runs.tgz") as tar:
        names = set(tar.getnames())
    assert {"runs/dpgan-quick-s0/config.json", "runs/dpgan-quick-s0/interrupted.json"} <= names
    assert not any(n.endswith(".tmp") for n in names), names


def test_stage_m_starts_the_mnist_paper_runs_resumes_the_cut_and_skips_the_finished(tmp_path):
    fake = _fake_python(tmp_path)
    runs = tmp_path / "mruns"
    (runs / "dpgan-mnist-eps10").mkdir(parents=True)
    (runs / "dpgan-mnist-eps10" / "config.json").write_text("{}")  # cut by an earlier call's cap
    (runs / "dpmerf-mnist-eps10").mkdir()
    for name in ("config.json", "eval.json"):  # finished in an earlier call
        (runs / "dpmerf-mnist-eps10" / name).write_text("{}")
    proc, stages, _ = _run(tmp_path, PY=str(fake), STAGES="M", M_RUNS="dpaf dpmerf dpgan dpdm", M_RESULTS=str(runs))
    assert proc.returncode == 0, proc.stderr
    calls = [c for c in (tmp_path / "calls.log").read_text().splitlines() if "dpgen_bench.cli" in c]
    dpaf = next(c for c in calls if "--method dpaf" in c)
    assert "--preset paper" in dpaf and "--set grad_sample_mode=hooks" in dpaf and "--dataset mnist " in dpaf
    assert "--eps 10" in dpaf and "--device cuda" in dpaf and f"--out {runs}/dpaf-mnist-eps10" in dpaf
    assert any("--method dpdm --preset gpu-short" in c for c in calls)
    assert any(c.endswith(f"run --resume {runs}/dpgan-mnist-eps10 --device cuda") for c in calls), calls
    assert not any("dpmerf" in c for c in calls)
    assert "finished earlier" in (tmp_path / "out" / "M_mnist.log").read_text()
    assert "M_mnist rc=0" in stages
    with tarfile.open(tmp_path / "out" / "mnist_runs.tgz") as tar:
        assert "mruns/dpmerf-mnist-eps10/eval.json" in tar.getnames()


def test_stage_m_variant_runs_apart_from_the_preset_run_with_its_settings(tmp_path):
    fake = _fake_python(tmp_path)
    runs = tmp_path / "mruns"
    (runs / "dpaf-mnist-eps10").mkdir(parents=True)
    for name in ("config.json", "eval.json"):  # the preset's run, finished in an earlier call
        (runs / "dpaf-mnist-eps10" / name).write_text("{}")
    proc, _, _ = _run(tmp_path, PY=str(fake), STAGES="M", M_RUNS="dpaf", M_RESULTS=str(runs),
                      M_TAG="clip", M_SET="--set max_grad_norm_conv2=0.02")
    assert proc.returncode == 0, proc.stderr
    calls = [c for c in (tmp_path / "calls.log").read_text().splitlines() if "dpgen_bench.cli" in c]
    assert len(calls) == 1, calls
    assert "--set max_grad_norm_conv2=0.02" in calls[0] and f"--out {runs}/dpaf-clip-mnist-eps10" in calls[0]


def test_stage_v_runs_each_candidate_and_seed_once_with_its_own_row_file(tmp_path):
    fake = _fake_python(tmp_path)
    runs = tmp_path / "vruns"
    runs.mkdir()
    (runs / "dpgan-long-preset-s1.json").write_text("[]")  # finished in an earlier call
    proc, stages, _ = _run(tmp_path, PY=str(fake), STAGES="V", V_RUNS="preset nd5:n_d=5,lr_g=2e-4",
                           V_SEEDS="0 1", V_RESULTS=str(runs))
    assert proc.returncode == 0, proc.stderr
    calls = [c for c in (tmp_path / "calls.log").read_text().splitlines() if "ema_ab.py" in c]
    assert len(calls) == 3, calls
    preset = next(c for c in calls if "--name dpgan-long-preset-s0" in c)
    # every run keeps a weight average (ema_ab.py needs one; the dpgan long preset has none), first, so
    # that a candidate's own ema_decay wins
    assert f"--out {runs}/dpgan-long-preset-s0.json" in preset
    assert "--method dpgan --preset long --seed 0 --set ema_decay=0.99 --decays" in preset
    for seed in (0, 1):
        nd5 = next(c for c in calls if f"--name dpgan-long-nd5-s{seed}" in c)
        assert f"--seed {seed} --set ema_decay=0.99 --set n_d=5 --set lr_g=2e-4 " in nd5 and f"--results {runs} " in nd5
    assert "V_val rc=0" in stages and (tmp_path / "out" / "val_runs.tgz").is_file()


def test_stage_v_without_the_added_average_when_v_ema_is_empty(tmp_path):
    fake = _fake_python(tmp_path)
    proc, _, _ = _run(tmp_path, PY=str(fake), STAGES="V", V_RUNS="dpaf:ema_decay=0.999", V_METHOD="dpaf",
                      V_EMA="", V_RESULTS=str(tmp_path / "vruns"))
    assert proc.returncode == 0, proc.stderr
    (call,) = [c for c in (tmp_path / "calls.log").read_text().splitlines() if "ema_ab.py" in c]
    assert "--method dpaf " in call and "--set ema_decay=0.999 --decays" in call and call.count("--set") == 1


def test_stage_l_runs_one_three_seed_sweep_per_arm(tmp_path):
    fake = _fake_python(tmp_path)
    proc, stages, _ = _run(tmp_path, PY=str(fake), STAGES="L", L_ARMS=";n_d=5 lr_g=2e-4",
                           L_RESULTS=str(tmp_path / "lruns"))
    assert proc.returncode == 0, proc.stderr
    sweeps = [c for c in (tmp_path / "calls.log").read_text().splitlines() if "dpgen_bench.cli sweep" in c]
    assert len(sweeps) == 2, sweeps
    assert all("--method dpgan " in c and "--seeds 0,1,2 --jobs 3" in c and f"--results {tmp_path}/lruns" in c
               for c in sweeps)
    assert sum("--set n_d=5 --set lr_g=2e-4" in c for c in sweeps) == 1
    assert "L_long rc=0" in stages and (tmp_path / "out" / "long_runs.tgz").is_file()


def test_the_prepared_ladder_call_runs_the_test_seeds_of_both_methods_then_the_val_seeds(tmp_path):
    """benchmarks/README.md's "Next calls, prepared", first call (CLAIMS.md dpgan-ladder)."""
    fake = _fake_python(tmp_path)
    proc, stages, _ = _run(tmp_path, PY=str(fake), STAGES="L V", L_METHODS="dpgan,gan", L_JOBS="6",
                           L_ARMS="d_width=128 g_width=128 n_d=10 steps=12000 ema_decay=0.995", V_SEEDS="1 2",
                           V_RUNS="nd10-t12k:d_width=128,g_width=128,n_d=10,steps=12000 "
                                  "nd20-t12k:d_width=128,g_width=128,n_d=20,steps=12000",
                           L_RESULTS=str(tmp_path / "lruns"), V_RESULTS=str(tmp_path / "vruns"))
    assert proc.returncode == 0, proc.stderr
    calls = (tmp_path / "calls.log").read_text().splitlines()
    (sweep,) = [c for c in calls if "dpgen_bench.cli sweep" in c]
    assert "--method dpgan,gan " in sweep and "--seeds 0,1,2 --jobs 6" in sweep
    assert "--set d_width=128 --set g_width=128 --set n_d=10 --set steps=12000 --set ema_decay=0.995" in sweep
    val = [c for c in calls if "ema_ab.py" in c]
    assert sorted(c.split("--name ")[1].split()[0] for c in val) == [
        "dpgan-long-nd10-t12k-s1", "dpgan-long-nd10-t12k-s2", "dpgan-long-nd20-t12k-s1", "dpgan-long-nd20-t12k-s2"]
    assert calls.index(sweep) < min(calls.index(c) for c in val)  # the test seeds first: the cap cuts the rest
    assert stages.index("L_long rc=0") < stages.index("V_val rc=0")


@pytest.mark.slow
def test_stage_m_on_the_cpu_with_tiny_presets_brings_back_records_and_uint8_samples(tmp_path):
    """The prepared GPU command, run here for real on tiny presets (about 90 s on 2 cores)."""
    import json

    import numpy as np

    runs = tmp_path / "mruns"
    proc, stages, _ = _run(tmp_path, PY=str(ROOT / ".venv" / "bin" / "python"), STAGES="M", DEVICE="cpu",
                           M_PRESET_OVERRIDE="tiny", M_RUNS="dpaf dpmerf dpgan dpdm", M_RESULTS=str(runs))
    assert proc.returncode == 0 and "M_mnist rc=0" in stages, (proc.stderr, stages)
    out = tmp_path / "out"
    for run in ("dpaf", "dpmerf", "dpgan", "dpdm"):
        name = f"{run}-mnist-eps10"
        privacy = json.loads((runs / name / "privacy.json").read_text())
        assert privacy["epsilon"]["rdp"] <= privacy["target"]["epsilon"] == 10
        assert 0 <= json.loads((runs / name / "eval.json").read_text())["metrics"]["gen2real_cnn"] <= 1
        samples = np.load(out / f"samples_{name}.npz")
        assert samples["images"].dtype == np.uint8 and samples["images"].shape[1:] == (1, 28, 28)
    with tarfile.open(out / "mnist_runs.tgz") as tar:
        names = tar.getnames()
    assert "mruns/dpaf-mnist-eps10/privacy.json" in names and not any(n.endswith(".pt") for n in names)
