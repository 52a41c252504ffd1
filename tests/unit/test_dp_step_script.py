"""``benchmarks/dp_step.py --json`` (``make bench-dp``): every grad-sample mode with its ratio."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


# times every grad-sample mode in a child process (12 s of a core): -m slow, beside the evidence it regenerates
@pytest.mark.slow
def test_dp_step_json_lists_every_mode_with_a_ratio():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "dp_step.py"), "--json", "--config", "quick",
                          "--repeats", "2", "--threads", "1"], capture_output=True, text=True, check=True, timeout=300)
    rows = json.loads(out.stdout)["configs"]
    modes = {r["mode"]: r for r in rows}
    assert set(modes) >= {"non-private", "hooks", "functorch", "ghost", "bk", "ew"}
    assert all(set(r) >= {"name", "mode", "step_ms", "ratio"} for r in rows)
    assert modes["non-private"]["ratio"] == 1.0
    for mode in ("hooks", "functorch", "ghost", "bk"):
        assert modes[mode]["step_ms"] > 0 and modes[mode]["ratio"] > 0
    assert modes["ew"]["ratio"] is None and modes["ew"]["error"]  # Expanded Weights cannot run this net


def test_dpdm_step_json_times_the_paper_unet_chunk_private_and_not(monkeypatch, capsys):
    """``benchmarks/dpdm_step.py`` (DPDM's paper chunk, bk against non-private), in-process at
    one example of K = 2 rows: every mode timed, rows/s = E·K / step, ratio to non-private."""
    import runpy

    monkeypatch.setattr(sys, "argv", ["dpdm_step.py", "--examples", "1", "--k", "2", "--repeats", "1",
                                      "--modes", "non-private,bk", "--device", "cpu", "--json"])
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    runpy.run_path(str(ROOT / "benchmarks" / "dpdm_step.py"), run_name="__main__")
    out = json.loads(capsys.readouterr().out)
    assert (out["examples"], out["k"], out["device"]) == (1, 2, "cpu")
    rows = {r["mode"]: r for r in out["rows"]}
    assert rows["non-private"]["ratio"] == 1.0 and rows["bk"]["ratio"] > 0
    for r in rows.values():
        assert abs(r["rows_per_s"] - 2 / r["step_s"]) <= 1
