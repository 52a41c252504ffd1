"""The README's demo table is rendered, not typed (dpgen_bench/report/demo_table.py, `make
readme-table`): its `long` and `paper` columns, row order and notes are what the committed records
(benchmarks/mnist_runs) and references.csv render now; only the `quick` column, one `make demo` on
the development machine whose records are not committed, is carried over from the block itself."""

from pathlib import Path

import numpy as np
import pytest

from dpgen_bench.errors import UserError
from dpgen_bench.report import demo_table

ROOT = Path(__file__).resolve().parents[2]


def test_the_readme_demo_table_is_what_the_committed_records_render(tmp_path):
    shown = demo_table.block((ROOT / "README.md").read_text())
    assert "| method | ε spent | quick | long | paper | paper's table |" in shown
    assert shown == demo_table.render(tmp_path / "no-runs", shown, ROOT / demo_table.COMMITTED), (
        "the README's demo table is not what the committed records render: `make readme-table` rewrites it")


def test_a_carried_quick_cell_keeps_its_mean_std_and_seeds():
    table = ("| method | ε spent | quick | long |\n|---|---|---|---|\n"
             "| dpkernel | 9.96 / 8.54 | 0.826 ± 0.006 | — |\n| gan | ∞ / ∞ | 0.589 (n=1) | — |\n"
             "| dpac | 9.98 / n/a | — | 0.129 (n=1) |\n")
    rows = demo_table.carried_quick_rows(table)
    kernel = [r["value"] for r in rows if r["method"] == "dpkernel"]
    assert len(kernel) == 3 and round(sum(kernel) / 3, 6) == 0.826
    assert round(float(np.std(kernel, ddof=1)), 6) == 0.006
    gan = next(r for r in rows if r["method"] == "gan")
    assert gan["value"] == 0.589 and gan["eps_rdp"] == float("inf") and gan["preset"] == "quick"
    assert not any(r["method"] == "dpac" for r in rows)  # no quick run: nothing to carry


def test_the_block_is_found_between_its_markers_and_replaced_in_place():
    page = f"intro\n{demo_table.START}\nold\n{demo_table.END}\noutro\n"
    assert demo_table.block(page) == "old\n"
    assert demo_table.replace_block(page, "new\n") == f"intro\n{demo_table.START}\n\nnew\n\n{demo_table.END}\noutro\n"
    with pytest.raises(UserError, match="demo-table"):
        demo_table.block("no markers here")


def test_a_quick_run_under_the_results_replaces_the_carried_cell(tmp_path):
    """`make readme-table` after `make demo`: the demo's own record gives the quick cell and ε
    spent; the methods it did not run keep theirs."""
    from dpgen_bench import store
    from dpgen_bench.config import build_config

    cfg = build_config("dpkernel", "mnist", epsilon=10.0, preset="quick")
    run = tmp_path / "runs" / "dpkernel-quick-s0"
    run.mkdir(parents=True)
    store.write_json(run / "config.json", cfg.to_json())
    store.write_json(run / "privacy.json", {"private": True, "noise_off": False, "caveat": None,
                                            "target": {"epsilon": 10.0, "delta": cfg.delta},
                                            "epsilon": {"rdp": 9.5, "prv": 8.25}})
    store.write_json(run / "eval.json", {"metrics": {"gen2real_cnn": 0.5}})
    previous = ("| method | ε spent | quick | long | paper | paper's table |\n|---|---|---|---|---|---|\n"
                "| dpkernel | 9.96 / 8.54 | 0.834 (n=1) | — | — | — |\n"
                "| dpmean | 10 / 9.32 | 0.790 (n=1) | — | — | — |\n")
    out = demo_table.render(tmp_path / "runs", previous, ROOT / demo_table.COMMITTED)
    assert "| dpkernel | 9.5 / 8.25 | 0.500 (n=1) | — | — | — |" in out
    assert "| dpmean | 10 / 9.32 | 0.790 (n=1) | — | — | — |" in out


def test_a_block_renders_from_its_carried_cells_alone(tmp_path):
    """No demo runs and no committed records (a README copied elsewhere): the carried quick
    cells still render, with the papers' numbers beside them (it was a TypeError)."""
    shown = demo_table.block((ROOT / "README.md").read_text())
    out = demo_table.render(tmp_path / "no-runs", shown, tmp_path / "no-records")
    assert "| dpkernel |" in out and "0.748 ‡" in out
