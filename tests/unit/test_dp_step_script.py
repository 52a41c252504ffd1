"""``benchmarks/dp_step.py --json`` (``make bench-dp``): every grad-sample mode with its ratio."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


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
