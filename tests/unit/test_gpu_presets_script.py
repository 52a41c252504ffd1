"""``benchmarks/gpu_presets.py``: every private method's paper preset has a case, the table
says what failed, and (``-m slow``) the script runs end to end on the CPU (``--smoke``)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import gpu_presets  # noqa: E402


def test_every_private_method_with_a_paper_preset_has_a_case_and_a_smoke_setting():
    from dpgen_bench import registry

    private = set()
    for name in registry.methods.names():
        cls = registry.methods.get(name)
        if getattr(cls, "private", True) and "paper" in getattr(cls, "presets", {}):
            private.add(name)
    covered = {m for m, _, _ in gpu_presets.CASES}
    assert private <= covered, private - covered
    assert covered <= set(gpu_presets.SMOKE)


def test_table_has_a_row_per_case_and_names_failures():
    rows = [json.loads(line) for line in (ROOT / "benchmarks" / "gpu_h100" / "gpu_presets.jsonl").read_text().splitlines()]
    rows.append({"method": "dpdm", "dataset": "mnist", "error": "OutOfMemoryError: CUDA out of memory"})
    text = gpu_presets.table(rows)
    lines = text.strip().splitlines()
    assert len(lines) == 2 + len(rows)
    assert "| dpdm | mnist | failed: OutOfMemoryError" in text
    assert "| dpgan | mnist | 171,757 | 19.54 | 1.3 GiB | 2.44 h | 3.52 h (first phases only) |" in text


@pytest.mark.slow
def test_smoke_run_on_the_cpu_writes_rows_and_a_table(tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_presets.py"), "--out", str(tmp_path), "--smoke",
                          "--celeba-n", "100", "--only", "dpsinkhorn"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    (row,) = [json.loads(line) for line in (tmp_path / "gpu_presets.jsonl").read_text().splitlines()]
    assert row["throughput"]["private_steps"] == {"image_gradient": 2} and row["device_name"] == "cpu"
    assert "| dpsinkhorn | mnist |" in (tmp_path / "gpu_presets.md").read_text()
