"""benchmarks/mnist_long.sh passes its knobs (EPS, SET) to `bench sweep` as flags, and leaves the
tiers table to the runs it was written for (ε = 10, the presets as they are)."""

import os
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "mnist_long.sh"


def _run(tmp_path: Path, **env) -> list[list[str]]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    log = tmp_path / "calls"
    fake = tmp_path / "python"  # stands in for the venv's python: records each call's arguments
    fake.write_text(f'#!/usr/bin/env bash\nprintf "%s\\n" "$@" > "{log}.$(date +%s%N)"\n')
    fake.chmod(0o755)
    runs = tmp_path / "runs"
    (runs / "sweep-dpaf-mnist-eps10-s0-abc").mkdir(parents=True)
    for name in ("config.json", "env.json", "privacy.json", "eval.json", "resume.pt"):
        (runs / "sweep-dpaf-mnist-eps10-s0-abc" / name).write_text("{}")
    subprocess.run(["bash", str(SCRIPT)], check=True, env={
        **os.environ, "PY": str(fake), "RUNS": str(runs), "OUTDIR": str(tmp_path / "out"), "METHODS": "dpaf", **env})
    calls = [p.read_text().splitlines() for p in sorted(tmp_path.glob("calls.*"))]
    # the JSON records only, never a checkpoint
    assert sorted(p.name for p in (tmp_path / "out" / "sweep-dpaf-mnist-eps10-s0-abc").iterdir()) == [
        "config.json", "env.json", "eval.json", "privacy.json"]
    return calls


def _flag(call: list[str], flag: str) -> list[str]:
    return [call[i + 1] for i, a in enumerate(call) if a == flag]


def test_an_ablation_arm_passes_each_setting_and_skips_the_tiers_table(tmp_path):
    (sweep,) = _run(tmp_path, SET="gc=false mu=8", SEEDS="1")
    assert sweep[:3] == ["-m", "dpgen_bench.cli", "sweep"]
    assert _flag(sweep, "--set") == ["gc=false", "mu=8"]
    assert _flag(sweep, "--eps") == ["10"] and _flag(sweep, "--seeds") == ["1"]
    assert _flag(sweep, "--preset") == ["long"]


def test_other_budgets_reach_the_sweep_and_the_default_run_prints_the_table(tmp_path):
    (sweep,) = _run(tmp_path, EPS="1,100")
    assert _flag(sweep, "--eps") == ["1,100"] and _flag(sweep, "--set") == []
    sweep, report = _run(tmp_path / "default")
    assert _flag(sweep, "--eps") == ["10"] and report[2] == "report"
