"""Time `bench report` over 1,000 synthetic records (collect → aggregate → render).

    .venv/bin/python benchmarks/report_speed.py
"""

import sys
import tempfile
import time
from pathlib import Path

from dpgen_bench.report import table as T

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the tests' record writer (report_fixtures): tests/ is not a package
from report_fixtures import make_record  # noqa: E402

with tempfile.TemporaryDirectory() as tmp:
    root = Path(tmp) / "runs"
    for i in range(1000):
        make_record(root, f"r{i}", ["dpgan", "dpaf", "gswgan", "dpac"][i % 4], ["digits", "mnist"][i // 500],
                    [1.0, 10.0][(i // 4) % 2], i, {"fid": float(i % 97), "gen2real_cnn": (i % 89) / 89}, rdp=1, prv=1)
    t0 = time.perf_counter()
    long, _ = T.collect(root)
    t1 = time.perf_counter()
    agg = T.aggregate(long)
    text = T.render_markdown(T.layout_a(agg)) + T.render_latex(T.layout_a(agg)) + T.render_csv(T.layout_a(agg))
    t2 = time.perf_counter()
    print(f"1000 records: collect {t1 - t0:.2f} s, aggregate + render (3 formats) {t2 - t1:.2f} s, "
          f"total {t2 - t0:.2f} s")
