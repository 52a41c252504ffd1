"""``benchmarks/sample_count.py`` on a tiny finished run: the run's own count is drawn again and
gives the run's recorded gen2real (the script draws the run's samples), another count gives a
row of its own, and a second pass replaces rows instead of adding them."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # 50 s: a run, then the script twice in its own interpreter
def test_the_runs_own_count_reproduces_its_record_and_other_counts_add_rows(tmp_path, results, cli_runner):
    from dpgen_bench.cli import cli

    res = cli_runner.invoke(cli, ["run", "--method", "dpgan", "--dataset", "digits", "--eps", "10", "--preset",
                                  "tiny", "--eval", "gen2real_cnn", "--out", str(tmp_path / "run")])
    assert res.exit_code == 0, (res.output, res.stderr)
    recorded = json.loads((tmp_path / "run" / "eval.json").read_text())["metrics"]["gen2real_cnn"]
    cmd = [sys.executable, str(ROOT / "benchmarks" / "sample_count.py"), str(tmp_path / "run"), "--per-class", "30",
           "--out", str(tmp_path / "rows.json")]
    for _ in range(2):
        subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True, timeout=300,
                       env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
    rows = json.loads((tmp_path / "rows.json").read_text())
    assert [r["per_class"] for r in rows] == [10, 30]  # tiny's own count first
    own, more = rows
    assert own["matches_record"] is True and own["gen2real_cnn"] == recorded
    assert "matches_record" not in more and 0 <= more["gen2real_cnn"] <= 1 and more["within_class_std"] > 0
