"""The README's demo table: what ``make demo`` prints (``bench report --layout tiers --dataset
mnist --eps 10 --also benchmarks/mnist_runs --with-references``), written into the README between
``<!-- demo-table:start -->`` and ``<!-- demo-table:end -->`` by ``make readme-table``:

    python -m dpgen_bench.report.demo_table [README] [--results DIR]

Every cell is rendered from run records and ``references.csv`` but one: the ``quick`` column is
this machine's ``make demo`` runs (under ``--results``, else $DPGEN_RESULTS, else results/runs),
whose records are not committed. A method with no such run keeps the quick cell and ε spent the
block shows now, read back as one record per seed; so new ``long`` records re-render the table
without a new demo, and ``tests/unit/test_demo_table.py`` checks that the block is what the
committed records and references render now."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import pandas as pd

from .. import store
from ..config import build_config
from ..errors import UserError
from .references import load_references
from .table import (CAVEAT_MARK, ID_COLS, Table, cell_values, collect, label_variants, layout_tiers, record_rows,
                    render_markdown)

DATASET, EPS, METRIC = "mnist", 10.0, "gen2real_cnn"
COMMITTED = Path("benchmarks") / "mnist_runs"  # `make demo`'s --also, relative to the repository root
START, END = "<!-- demo-table:start -->", "<!-- demo-table:end -->"
README = Path(__file__).resolve().parents[2] / "README.md"


def block(text: str) -> str:
    """The text between the markers (without them); a page without one pair is an error."""
    if text.count(START) != 1 or text.count(END) != 1 or text.index(START) > text.index(END):
        raise UserError(f"expected one {START} … {END} pair")
    return text.split(START, 1)[1].split(END, 1)[0].strip("\n") + "\n"


def replace_block(text: str, new: str) -> str:
    block(text)  # checks the markers
    head, rest = text.split(START, 1)
    return f"{head}{START}\n\n{new.strip()}\n\n{END}{rest.split(END, 1)[1]}"


def _cells(table_text: str) -> tuple[list[str], dict[str, dict[str, str]]]:
    """(column names, method → column → cell text) of a markdown table's rows."""
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in table_text.splitlines()
            if line.startswith("|")]
    if not rows:
        return [], {}
    return rows[0], {r[0]: dict(zip(rows[0], r)) for r in rows[2:]}


def _number(text: str) -> float:
    return math.inf if text == "∞" else math.nan if text == "n/a" else float(text)


def carried_quick_rows(previous: str) -> list[dict]:
    """Record rows (``table.record_rows``) of the quick cells a block shows: per method, one
    record per seed whose values have the cell's mean and std, at the cell's ε spent."""
    header, rows = _cells(previous)
    if "quick" not in header:
        return []
    out = []
    for method, cells in rows.items():
        values = cell_values(cells["quick"], 3)
        if values is None:
            if cells["quick"] != "—":
                raise UserError(f"{method}'s quick cell {cells['quick']!r} cannot be carried over: re-run make demo")
            continue
        if CAVEAT_MARK in cells["ε spent"]:
            raise UserError(f"{method}'s quick run carries a caveat, which a carried cell cannot: re-run make demo")
        rdp, prv = (_number(x) for x in cells["ε spent"].split(" / "))
        private = math.isfinite(rdp)
        cfg = build_config(method, DATASET, epsilon=EPS if private else None, preset="quick")
        for seed, value in enumerate(values):
            run_id = f"carried-{method}-s{seed}"
            rec = {"config": {**cfg.to_json(), "seed": seed, "run_id": run_id},
                   "privacy": {"private": private, "noise_off": False,
                               "target": {"epsilon": EPS if private else math.inf, "delta": cfg.delta},
                               "epsilon": {"rdp": rdp, "prv": prv}, "caveat": None},
                   "eval": {"metrics": {METRIC: float(value)}}}
            out += record_rows(rec, run_id)
    return out


def render(results: Path | None, previous: str = "", committed: Path = COMMITTED) -> str:
    """The block: the tiers table of the runs under ``results`` and ``committed`` with the
    papers' numbers, the quick cells of methods without a quick run there carried over from
    ``previous`` (the block as it stands), and each note under it as its own paragraph."""
    roots = [r for r in (results, committed) if r is not None and r.is_dir()]
    empty = pd.DataFrame(columns=ID_COLS + ["metric", "value", "source"])
    found = collect(*roots)[0] if roots else label_variants(empty)
    mine = layout_tiers(found, DATASET, EPS, METRIC) if len(found) else None  # what the runs here show
    have = {row[0] for row, cells in zip(mine.rows, mine.cells) if "quick" in mine.columns
            and cells[mine.columns.index("quick")] != "—"} if mine else set()
    carried = pd.DataFrame([r for r in carried_quick_rows(previous) if r["method"] not in have],
                           columns=empty.columns)
    runs = pd.concat([found.assign(method=found["base_method"]).drop(columns="base_method"), carried],
                     ignore_index=True)
    full = pd.concat([label_variants(runs), load_references()], ignore_index=True)
    full["eps_target"] = full["eps_target"].astype(float)  # an empty frame's column is object: no runs here
    tab = layout_tiers(full, DATASET, EPS, METRIC)
    if not tab.rows:
        raise UserError(f"no runs on {DATASET} to render under {', '.join(map(str, roots)) or 'no directory'}")
    table = render_markdown(Table(tab.title, tab.row_header, tab.rows, tab.columns, tab.cells))
    return "\n\n".join([table.rstrip("\n")] + tab.notes) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dpgen_bench.report.demo_table", description=__doc__.split("\n\n")[0])
    p.add_argument("readme", nargs="?", type=Path, default=README)
    p.add_argument("--results", type=Path, default=None,
                   help="the demo's runs (else $DPGEN_RESULTS, else results/runs)")
    args = p.parse_args(argv)
    text = args.readme.read_text(encoding="utf-8")
    try:
        new = render(store.results_root(args.results), block(text), args.readme.resolve().parent / COMMITTED)
        with store.atomic_open(args.readme, "w") as f:
            f.write(replace_block(text, new))
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote the demo table into {args.readme}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
