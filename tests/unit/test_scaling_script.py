"""benchmarks/scaling.py: a tiny grid end to end (JSON fields, ratios, peak RSS, figure), and
the skip rule on made-up estimates."""

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

import scaling  # noqa: E402

FIELDS = {"method", "part", "width", "batch", "mode", "step_ms", "ratio", "peak_rss_mib"}


# times real DP steps of three methods (14 s of a core): -m slow, beside the evidence it regenerates
@pytest.mark.slow
def test_tiny_grid_json_and_figure(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    fig = tmp_path / "scaling.png"
    rc = scaling.main(["--methods", "dpgan,dpsinkhorn,dpmean", "--batches", "8", "--widths", "quick",
                       "--repeats", "2", "--warmup", "1", "--threads", "1", "--json", "--figure", str(fig)])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    rows = out["configs"]
    expected = {(m, 8, mode) for m in ("dpgan", "dpsinkhorn") for mode in scaling.PARTS[m].modes}
    assert {(r["method"], r["batch"], r["mode"]) for r in rows} == expected
    for r in rows:
        assert FIELDS <= set(r), r
        assert r["width"] == "quick" and "skipped" not in r and "error" not in r, r
        assert r["step_ms"] > 0 and r["ratio"] > 0, r
        assert r["peak_rss_mib"] > 0 and r["rss_increase_mib"] >= 0, r
        if r["mode"] == "non-private":
            assert r["ratio"] == 1.0
    assert "dpmean" in out["notes"] and "nothing is measured" in out["notes"]["dpmean"]
    assert fig.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the markdown table, rendered again from the JSON without measuring
    saved = tmp_path / "scaling.json"
    saved.write_text(json.dumps(out))
    assert scaling.main(["--from-json", str(saved)]) == 0
    table = capsys.readouterr().out
    assert "| width | B | non-private ms |" in table and "**dpmean**" in table and "(×" in table


def test_plan_modes_drops_expensive_private_modes_then_the_configuration():
    modes = ("non-private", "bk", "hooks")
    t = {"non-private": 1.0, "bk": 1.5, "hooks": 4.0}
    none = dict.fromkeys(modes)
    # unknown estimates (first batch): everything runs
    assert scaling.plan_modes(modes, none, none, 10, 60, 1e6) == (list(modes), {})
    # 10 steps of all three: 65 s > 60; without hooks: 25 s
    run, skipped = scaling.plan_modes(modes, t, none, 10, 60, 1e6)
    assert run == ["non-private", "bk"] and set(skipped) == {"hooks"}
    # not even non-private + bk fits: the whole configuration goes (never non-private alone)
    run, skipped = scaling.plan_modes(modes, t, none, 10, 20, 1e6)
    assert run == [] and set(skipped) == set(modes)
    # memory: hooks over the limit is dropped whatever the time
    mem = {"non-private": 100.0, "bk": 120.0, "hooks": 5000.0}
    run, skipped = scaling.plan_modes(modes, t, mem, 1, 1e6, 1000)
    assert run == ["non-private", "bk"] and "MiB" in skipped["hooks"]


def test_extrapolation_is_a_clamped_power_law():
    assert scaling._extrapolate([], 64) is None
    assert scaling._extrapolate([(32, 1.0)], 64) == pytest.approx(2.0)  # linear from one point
    assert scaling._extrapolate([(32, 1.0), (64, 4.0)], 128) == pytest.approx(16.0)  # quadratic
    assert scaling._extrapolate([(32, 1.0), (64, 1.1)], 128) == pytest.approx(2.2)  # at least linear
