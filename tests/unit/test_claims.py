"""benchmarks/claims.py: every arm of claims.yaml is a valid sweep grid, and the verdicts
follow from the numbers (Welch t-test, chance, ranges, the paper's order)."""

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec_ = importlib.util.spec_from_file_location("claims", ROOT / "benchmarks" / "claims.py")
claims = importlib.util.module_from_spec(spec_)
sys.modules["claims"] = claims  # dataclasses look their module up
spec_.loader.exec_module(claims)

SPEC = {"chance": {"gen2real_cnn": 0.1}, "chance_margin": 0.05, "alpha": 0.05}


def arm(name, values, ref=None, metric="gen2real_cnn"):
    a = claims.Arm(name, cells=[None] * len(values), ref=ref)
    a.values[metric] = list(values)
    a.eps = [(9.9, 9.0)] * len(values)
    return a


def test_every_arm_of_the_file_expands_to_cells():
    spec = claims.load_claims(ROOT / "benchmarks" / "claims.yaml")
    ids = [c["id"] for c in spec["claims"]]
    assert {"n-d-steps", "adaptive-n-d", "mia", "dpac-vs-gswgan", "ordering", "dpaf-ablations"} <= set(ids)
    for claim in spec["claims"]:
        arms = claims.build_arms(spec, claim)
        for a in arms.values():
            assert len(a.cells) == 3, (claim["id"], a.name)  # three seeds each
        for exp in claim["expect"]:  # every expectation names arms that exist
            for key in ("better", "than", "arm"):
                assert exp.get(key) is None or exp[key] in arms, (claim["id"], exp)
            assert all(o in arms for o in exp.get("of", []))


def test_better_reproduced_reversed_inconclusive_and_chance():
    good, bad = arm("a", [0.70, 0.72, 0.71]), arm("b", [0.50, 0.52, 0.49])
    assert claims.check_better(SPEC, "gen2real_cnn", good, bad)[0] == claims.REPRODUCED
    assert claims.check_better(SPEC, "gen2real_cnn", bad, good)[0] == claims.NOT_REPRODUCED
    noisy = arm("c", [0.40, 0.80, 0.60])
    assert claims.check_better(SPEC, "gen2real_cnn", noisy, arm("d", [0.55, 0.62, 0.58]))[0] == claims.INCONCLUSIVE
    assert claims.check_better(SPEC, "gen2real_cnn", arm("e", [0.12, 0.13, 0.11]),
                               arm("f", [0.09, 0.1, 0.1]))[0] == claims.UNTESTABLE
    assert claims.check_better(SPEC, "gen2real_cnn", arm("g", [0.7]), bad)[0] == claims.MISSING


def test_lower_is_better_metrics_are_turned_round():
    low, high = arm("low", [20.0, 21.0, 19.5], metric="fid"), arm("high", [60.0, 62.0, 61.0], metric="fid")
    assert claims.check_better(SPEC, "fid", low, high)[0] == claims.REPRODUCED


def test_at_least_best_and_range():
    arms = {"1": arm("1", [0.5, 0.52, 0.51]), "5": arm("5", [0.70, 0.71, 0.69]), "ad": arm("ad", [0.3, 0.31, 0.29])}
    exp = {"kind": "at_least_best", "metric": "gen2real_cnn", "arm": "ad", "of": ["1", "5"]}
    assert claims.check(SPEC, exp, arms)[0][0] == claims.NOT_REPRODUCED
    arms["ad"] = arm("ad", [0.69, 0.72, 0.70])
    assert claims.check(SPEC, exp, arms)[0][0] == claims.REPRODUCED
    rng = {"kind": "range", "metric": "gen2real_cnn", "arm": "5", "min": 0.5}
    assert claims.check(SPEC, rng, arms)[0][0] == claims.REPRODUCED
    assert claims.check(SPEC, {**rng, "arm": "1", "min": 0.6}, arms)[0][0] == claims.NOT_REPRODUCED


def test_paper_order_reads_the_reference_table():
    # DPAF Table 1, MNIST ε = 10: dpsinkhorn 0.832 > gswgan 0.808 > dpmerf 0.674
    arms = {"sk": arm("sk", [0.8, 0.81, 0.82], ref="dpsinkhorn"), "gs": arm("gs", [0.6, 0.61, 0.62], ref="gswgan"),
            "merf": arm("merf", [0.9, 0.91, 0.9], ref="dpmerf")}
    exp = {"kind": "paper_order", "metric": "gen2real_cnn",
           "reference": {"paper": "dpaf", "table": "Table 1", "dataset": "mnist", "eps": 10, "metric": "gen2real_cnn"}}
    out = claims.check(SPEC, exp, arms)
    assert out[0][0] is None and "sk 0.832 > gs 0.808 > merf 0.674" in out[0][1]
    verdicts = [v for v, _ in out[1:]]
    assert verdicts == [claims.REPRODUCED, claims.NOT_REPRODUCED, claims.NOT_REPRODUCED]
    assert claims.claim_verdict(out) == "partly reproduced"


@pytest.mark.parametrize("verdicts,expected", [
    ([claims.REPRODUCED, claims.REPRODUCED], claims.REPRODUCED),
    ([claims.UNTESTABLE, claims.UNTESTABLE], claims.UNTESTABLE),
    ([claims.REPRODUCED, claims.UNTESTABLE], claims.REPRODUCED + " where testable"),
    ([claims.NOT_REPRODUCED, claims.UNTESTABLE], claims.NOT_REPRODUCED),
    ([claims.REPRODUCED, claims.MISSING], claims.REPRODUCED + " (1 check not run yet)"),
    ([claims.MISSING, claims.MISSING], claims.MISSING),
    ([claims.INCONCLUSIVE, claims.UNTESTABLE], claims.INCONCLUSIVE),
])
def test_claim_verdict(verdicts, expected):
    assert claims.claim_verdict([(v, "") for v in verdicts]) == expected


def test_render_writes_every_claim_from_records(tmp_path):
    spec = claims.load_claims(ROOT / "benchmarks" / "claims.yaml")
    claim = next(c for c in spec["claims"] if c["id"] == "n-d-steps")
    arms = claims.build_arms(spec, claim)
    for a in arms.values():
        claims.read_arm(a, tmp_path)  # nothing there yet
    text = claims.render(spec, [claim], {claim["id"]: arms}, tmp_path, None)
    assert "**not run yet**" in text and "| n_D = 10 | 0/3 | — | — |" in text


def test_claims_md_is_in_the_repo_covers_every_claim_and_is_linked():
    text = (ROOT / "benchmarks" / "CLAIMS.md").read_text()
    spec = claims.load_claims(ROOT / "benchmarks" / "claims.yaml")
    for claim in spec["claims"]:
        assert f'<a id="{claim["id"]}"></a>' in text, claim["id"]
    assert "benchmarks/CLAIMS.md" in (ROOT / "README.md").read_text()
    assert "claims.py --run" in (ROOT / "Makefile").read_text()


def test_reference_rows_use_our_method_names():
    from dpgen_bench.report.references import load_references

    methods = set(load_references()["method"])
    assert {"dpmerf", "dpsinkhorn"} <= methods and not {"dp-merf", "dp-sinkhorn"} & methods
