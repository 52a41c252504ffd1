"""``benchmarks/seed_methods.sh``: the curve's sweeps and figure for mnist-5k and mnist, with a
stand-in ``bench`` that records its calls (no training): every grid expands, the report reads
only the script's own cells, and an unknown dataset is one line."""

import os
import stat
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "seed_methods.sh"


def _run(tmp_path: Path, dataset: str) -> tuple[subprocess.CompletedProcess, list[list[str]]]:
    log = tmp_path / "calls.txt"
    stub = tmp_path / "bench"
    stub.write_text(f'#!/usr/bin/env bash\necho "$*" >> {log}\n')
    stub.chmod(stub.stat().st_mode | stat.S_IEXEC)
    env = {**os.environ, "BENCH": str(stub), "OUT": str(tmp_path / "claims"), "DATASET": dataset}
    res = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=300)
    calls = [line.split() for line in log.read_text().splitlines()] if log.exists() else []
    return res, calls


@pytest.mark.parametrize("dataset, cells", [("mnist-5k", 81), ("mnist", 63)])
def test_the_curve_sweeps_its_grids_and_draws_its_own_cells(tmp_path, dataset, cells):
    res, calls = _run(tmp_path, dataset)
    assert res.returncode == 0, res.stderr
    sweeps, report = calls[:-1], calls[-1]
    assert len(sweeps) == 3 and all(c[0] == "sweep" and "--no-report" in c for c in sweeps)
    assert report[:1] == ["report"] and report[report.index("--dataset") + 1] == dataset
    links = tmp_path / f"claims.curve-{dataset}"
    assert report[report.index("--results") + 1] == str(links)
    assert len(list(links.iterdir())) == cells
    assert all(f"-{dataset}-eps" in name.name for name in links.iterdir())


def test_an_unknown_dataset_is_one_line(tmp_path):
    res, calls = _run(tmp_path, "digits")
    assert res.returncode == 2 and res.stderr.strip() == "DATASET must be mnist-5k or mnist" and not calls
