"""``bench claims`` (dpgen_bench/claims.py): every arm of claims.yaml is a valid sweep grid on
every dataset, the verdicts follow from the numbers (Welch t-test, chance, ranges, the paper's
order), and CLAIMS.md keeps one block per dataset (a block not rendered this time is kept verbatim)."""

import copy
from pathlib import Path

import pytest
import yaml

from dpgen_bench import claims
from dpgen_bench.cli import cli

ROOT = Path(__file__).resolve().parents[2]

SPEC = {"chance": {"gen2real_cnn": 0.1}, "chance_margin": 0.05, "alpha": 0.05}
CLAIMS_YAML = ROOT / "benchmarks" / "claims.yaml"
# claims.yaml's defaults before it listed datasets: the digits run directories under results/claims
# were named from these, so the digits cells must keep those names
OLD_DEFAULTS = {"dataset": "digits", "seeds": [0, 1, 2], "preset": "quick", "eval": ["gen2real_cnn", "real2gen_cnn"]}


def bench_claims(*args: str, claims_file: Path = None) -> int:
    """The exit code of ``bench claims CLAIMS_FILE ARGS`` (claims.yaml unless given); its
    stderr is the test's (capsys)."""
    try:
        cli(["claims", str(claims_file or CLAIMS_YAML), *args])
    except SystemExit as e:
        return e.code
    raise AssertionError("bench did not exit")


def arm(name, values, ref=None, metric="gen2real_cnn"):
    a = claims.Arm(name, cells=[None] * len(values), ref=ref)
    a.values[metric] = list(values)
    a.eps = [(9.9, 9.0)] * len(values)
    return a


def test_every_arm_of_the_file_expands_to_cells_on_every_dataset():
    spec = claims.load_claims(CLAIMS_YAML)
    ids = [c["id"] for c in spec["claims"]]
    assert {"n-d-steps", "adaptive-n-d", "mia", "dpac-vs-gswgan", "ordering", "dpaf-ablations"} <= set(ids)
    assert spec["datasets"] == ["digits", "mnist-5k", "mnist"]
    for claim in spec["claims"]:
        # the small datasets' claims on both; full MNIST's own claims (hour-long arms) on it alone
        assert claims.claim_datasets(spec, claim) in (["digits", "mnist-5k"], ["mnist"]), claim["id"]
        assert "1,437" not in claim["title"], claim["id"]  # titles are dataset-neutral; the N is in the scale
        for dataset in claims.claim_datasets(spec, claim):
            assert claims.scale_text(claim, dataset).startswith(dataset), (claim["id"], dataset)
            arms = claims.build_arms(spec, claim, dataset)
            for name, a in arms.items():
                # three seeds each; one where the scale text says so (a diagnostic beside a 3-seed arm)
                seeds = 1 if "seed 0 only" in claims.scale_text(claim, dataset) else 3
                assert len(a.cells) == seeds, (claim["id"], dataset, a.name)
                assert {c.config.dataset for c in a.cells} == {dataset}
            for exp in claim["expect"]:  # every expectation names arms that exist
                for key in ("better", "than", "arm"):
                    assert exp.get(key) is None or exp[key] in arms, (claim["id"], exp)
                assert all(o in arms for o in exp.get("of", []))


def test_digits_cells_keep_their_run_names():
    spec = claims.load_claims(CLAIMS_YAML)
    by_id = {c["id"]: c for c in spec["claims"]}
    for claim_id, arm_name in [("small-n", "dpmerf"), ("small-n", "gan (ε = ∞)"), ("small-n", "dpac, noise off"),
                               ("n-d-steps", "n_D = 5, T = 6000"), ("dpac-vs-gswgan", "gswgan, paper mode"),
                               ("mia", "gan (memorise)"), ("mia", "dpgan"), ("ordering", "dpsinkhorn"),
                               ("dpaf-ablations", "μ = 1")]:
        arm = by_id[claim_id]["arms"][arm_name]
        old = claims.expand({**OLD_DEFAULTS, **{k: v for k, v in arm.items() if k not in ("ref", "per_dataset")}})
        new = claims.build_arms(spec, by_id[claim_id], "digits")[arm_name].cells
        assert [c.run_name for c in new] == [c.run_name for c in old], (claim_id, arm_name)
        assert all(c.run_name.startswith(f"sweep-{arm['method']}-digits-") for c in new)


def test_per_dataset_replaces_arm_keys_on_that_dataset_only():
    spec = claims.load_claims(CLAIMS_YAML)
    mia = next(c for c in spec["claims"] if c["id"] == "mia")
    digits = claims.build_arms(spec, mia, "digits")["gan (memorise)"].cells[0].config
    mnist = claims.build_arms(spec, mia, "mnist-5k")["gan (memorise)"].cells[0].config
    # gan has no memorise preset for mnist-5k: the quick preset set to the memorise values
    assert (digits.preset, mnist.preset) == ("memorise", "quick") and mnist.hparams == digits.hparams


def test_load_claims_rejects_a_dataset_outside_the_list_and_a_missing_scale(tmp_path):
    spec = yaml.safe_load(CLAIMS_YAML.read_text())
    bad = tmp_path / "claims.yaml"
    for edit, message in [(lambda s: s["claims"][0].update(datasets=["cifar10"]), "'datasets' must be some of"),
                          (lambda s: s["claims"][1].update(scale={"digits": "digits"}), "no scale text for"),
                          (lambda s: s["defaults"].update(dataset="digits"), "top-level 'datasets'")]:
        s = copy.deepcopy(spec)
        edit(s)
        bad.write_text(yaml.safe_dump(s, allow_unicode=True))
        with pytest.raises(claims.UserError, match=message):
            claims.load_claims(bad)


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
    # an arm of `of` not run: significantly below one that ran already decides it, level with it does not
    arms["10"] = arm("10", [0.8])
    wider = {**exp, "of": ["1", "5", "10"]}
    assert claims.check(SPEC, wider, arms)[0][0] == claims.MISSING
    arms["ad"] = arm("ad", [0.3, 0.31, 0.29])
    verdict, text = claims.check(SPEC, wider, arms)[0]
    assert verdict == claims.NOT_REPRODUCED and "10 not run yet" in text
    arms["ad"] = arm("ad", [0.3])
    assert claims.check(SPEC, wider, arms)[0][0] == claims.MISSING
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
    spec = claims.load_claims(CLAIMS_YAML)
    claim = next(c for c in spec["claims"] if c["id"] == "n-d-steps")
    arms = claims.build_arms(spec, claim, "digits")
    for a in arms.values():
        claims.read_arm(a, tmp_path)  # nothing there yet
    block = claims.render_block(spec, "digits", [claim], {claim["id"]: arms}, None)
    assert "**Verdict: not run yet**" in block and "| n_D = 10 | 0/3 | — | — |" in block
    assert '<a id="n-d-steps-digits"></a>\n## More discriminator steps per generator step help (digits)' in block


def _records(root, arm, gen2real):
    """Complete run records for ``arm``'s cells (one gen2real_cnn value per seed)."""
    for cell, value in zip(arm.cells, gen2real):
        d = root / cell.run_name
        d.mkdir(parents=True)
        claims.store.write_json(d / "config.json", cell.config.to_json())
        claims.store.write_json(d / "privacy.json", {"target": {"epsilon": 10.0, "delta": 1e-5},
                                                     "epsilon": {"rdp": 9.96, "prv": 9.1}})
        claims.store.write_json(d / "eval.json", {"metrics": {"gen2real_cnn": value, "real2gen_cnn": value}})
        assert claims.store.load_record(d) is not None


def test_render_with_two_datasets_gives_both_blocks_and_the_summary(tmp_path):
    out, results = tmp_path / "CLAIMS.md", tmp_path / "results"
    spec = claims.load_claims(CLAIMS_YAML)
    abl = next(c for c in spec["claims"] if c["id"] == "dpaf-ablations")
    arms = claims.build_arms(spec, abl, "mnist-5k")
    _records(results, arms["μ = 8, GC"], [0.7, 0.72, 0.71])
    _records(results, arms["μ = 1"], [0.5, 0.52, 0.49])
    assert bench_claims("--out", str(out), "--results", str(results)) == 0
    text = out.read_text()
    blocks = claims.split_blocks(text)
    assert list(blocks) == ["digits", "mnist-5k", "mnist"]
    assert text.index("<!-- claims:dataset=digits -->") < text.index("<!-- /claims:dataset=digits -->") \
        < text.index("<!-- claims:dataset=mnist-5k -->") < text.index("<!-- /claims:dataset=mnist-5k -->")
    for dataset, block in blocks.items():
        for claim in (c for c in spec["claims"] if dataset in claims.claim_datasets(spec, c)):
            assert f'<a id="{claim["id"]}-{dataset}"></a>\n## {claim["title"]} ({dataset})' in block
            assert f"- **Checked at:** {claims.scale_text(claim, dataset)}" in block
    assert "| μ = 8, GC | 3/3 | 9.96 / 9.1 | 0.710 ± 0.010 |" in blocks["mnist-5k"]
    assert "| μ = 8, GC | 0/3 |" in blocks["digits"]
    assert "| claim | source | digits | mnist-5k | mnist |" in text.split("<!--")[0]  # the summary is outside
    row = next(line for line in text.splitlines() if line.startswith(f"| {abl['title']} |"))
    assert row.endswith("| [**not run yet**](#dpaf-ablations-digits) | "
                        "[**reproduced (1 check not run yet)**](#dpaf-ablations-mnist-5k) | not checked on this dataset |")


def test_rendering_one_dataset_keeps_the_other_block_verbatim(tmp_path):
    out = tmp_path / "CLAIMS.md"
    spec = claims.load_claims(CLAIMS_YAML)
    kept = ("Where the runs ran (…): 3 on 2 CPUs.\n\n| claim | source | verdict |\n|---|---|---|\n\n"
            '<a id="mia"></a>\n## Membership inference …\n\n- **Verdict: reproduced**\n\n| arm | 3/3 | 0.915 |\n\n'
            '<a id="ordering-digits"></a>\n## The tables\' ordering (digits)\n\n- **Verdict: partly reproduced**\n\n'
            "_Last regenerated 2026-11-24._")
    out.write_text("# old header\n\nold summary\n\n<!-- claims:dataset=digits -->\n" + kept +
                   "\n<!-- /claims:dataset=digits -->\n")
    assert bench_claims("--out", str(out), "--results", str(tmp_path / "none"), "--dataset", "mnist-5k") == 0
    text = out.read_text()
    assert "<!-- claims:dataset=digits -->\n" + kept + "\n<!-- /claims:dataset=digits -->\n" in text
    assert claims.split_blocks(text)["digits"] == kept and "old summary" not in text
    assert '<a id="mia-mnist-5k"></a>' in claims.split_blocks(text)["mnist-5k"]
    # the summary reads the kept block's verdicts (either anchor form); a claim it lacks is "—"
    rows = {line.split(" | ")[0][2:]: line for line in text.splitlines() if line.startswith("| ")}
    by_id = {c["id"]: c["title"] for c in spec["claims"]}
    assert "| [**reproduced**](#mia) | [**not run yet**](#mia-mnist-5k) |" in rows[by_id["mia"]]
    assert "| [**partly reproduced**](#ordering-digits) |" in rows[by_id["ordering"]]
    assert rows[by_id["small-n"]].endswith("| — | [**not run yet**](#small-n-mnist-5k) | not checked on this dataset |")
    # and again: the file it wrote keeps the digits block through a second render
    assert bench_claims("--out", str(out), "--results", str(tmp_path / "none"), "--dataset", "mnist-5k") == 0
    assert claims.split_blocks(out.read_text())["digits"] == kept


def test_only_rerenders_its_claims_and_keeps_the_other_sections(tmp_path):
    """``--only dpaf-ablations``: that claim's section is rendered from the records here, every
    other section of the block (whose runs this machine may not hold) stays as it was."""
    out, results = tmp_path / "CLAIMS.md", tmp_path / "results"
    spec = claims.load_claims(CLAIMS_YAML)
    abl = next(c for c in spec["claims"] if c["id"] == "dpaf-ablations")
    arms = claims.build_arms(spec, abl, "mnist-5k")
    mia = ('<a id="mia-mnist-5k"></a>\n## Membership inference (mnist-5k)\n\n- **Verdict: reproduced**\n\n'
           "| arm | 3/3 | 0.915 |")
    old_abl = ('<a id="dpaf-ablations-mnist-5k"></a>\n## DPAF (mnist-5k)\n\n- **Verdict: not testable at this scale**'
               "\n\n| μ = 8, GC | 3/3 | 0.100 |")
    block = f"Where the mnist-5k runs ran: 99 on 2 CPUs.\n\n{mia}\n\n{old_abl}\n\n_Last regenerated 2026-11-25._"
    out.write_text("<!-- claims:dataset=digits -->\ndigits\n<!-- /claims:dataset=digits -->\n"
                   f"<!-- claims:dataset=mnist-5k -->\n{block}\n<!-- /claims:dataset=mnist-5k -->\n")
    for name, values in (("μ = 8, GC", [0.7, 0.72, 0.71]), ("μ = 1", [0.5, 0.52, 0.49]),
                         ("μ = 4", [0.6, 0.61, 0.59]), ("no GC", [0.5, 0.51, 0.48])):
        _records(results, arms[name], values)
    for _ in range(2):  # a second render replaces its own note
        assert bench_claims("--out", str(out), "--results", str(results), "--dataset", "mnist-5k",
                            "--only", "dpaf-ablations") == 0
        new = claims.split_blocks(out.read_text())["mnist-5k"]
        assert new.startswith(f"Where the mnist-5k runs ran: 99 on 2 CPUs.\n\n{mia}\n\n")
        assert old_abl not in new and "| μ = 8, GC | 3/3 | 9.96 / 9.1 | 0.710 ± 0.010 |" in new
        assert "- **Verdict: reproduced**" in claims.find_section(new, "dpaf-ablations", "mnist-5k")[1]
        assert new.count("re-rendered") == 1 and "_Sections dpaf-ablations re-rendered" in new
        assert "_Last regenerated 2026-11-25._" in new
        assert claims.split_blocks(out.read_text())["digits"] == "digits"


def test_the_re_render_note_keeps_earlier_sections_and_their_dates(monkeypatch):
    """--only re-renders keep a record of every section re-rendered since the last full
    regeneration, each with its date; a section re-rendered again moves to today."""
    monkeypatch.setattr(claims.time, "strftime", lambda fmt, *a: "2026-11-28")
    previous = ("x\n\n_Last regenerated 2026-11-25._\n\n_Sections small-n, ordering re-rendered 2026-11-26; "
                "dpac-vs-gswgan re-rendered 2026-11-27 (`claims.py --only`); the others as last regenerated._")
    out = claims.replace_sections(previous, "", "digits", [{"id": "mia"}, {"id": "ordering"}])
    assert out.endswith("_Last regenerated 2026-11-25._\n\n_Sections small-n re-rendered 2026-11-26; "
                        "dpac-vs-gswgan re-rendered 2026-11-27; mia, ordering re-rendered 2026-11-28 "
                        "(`bench claims --only`); the others as last regenerated._")
    assert out.count("_Sections") == 1


def test_a_claim_restricted_to_one_dataset(tmp_path):
    spec = yaml.safe_load(CLAIMS_YAML.read_text())
    spec["claims"] = [c for c in spec["claims"] if c["id"] in ("ordering", "dpaf-ablations")]
    spec["claims"][1]["datasets"] = ["digits"]
    spec["claims"][1]["scale"] = spec["claims"][1]["scale"]["digits"]  # one text suffices for one dataset
    (tmp_path / "claims.yaml").write_text(yaml.safe_dump(spec, allow_unicode=True))
    out = tmp_path / "CLAIMS.md"
    assert bench_claims("--out", str(out), "--results", str(tmp_path / "none"),
                        claims_file=tmp_path / "claims.yaml") == 0
    text = out.read_text()
    blocks = claims.split_blocks(text)
    assert '<a id="dpaf-ablations-digits"></a>' in blocks["digits"]
    assert "dpaf-ablations" not in blocks["mnist-5k"] and '<a id="ordering-mnist-5k"></a>' in blocks["mnist-5k"]
    assert "| [**not run yet**](#dpaf-ablations-digits) | not checked on this dataset |" in text


def test_a_file_without_blocks_or_with_unpaired_markers_is_not_overwritten(tmp_path, capsys):
    out = tmp_path / "CLAIMS.md"
    for old in ("# claims rendered before the blocks\n\nnumbers\n",
                "<!-- claims:dataset=digits -->\nnumbers\n<!-- /claims:dataset=mnist-5k -->\n"):
        out.write_text(old)
        assert bench_claims("--out", str(out), "--results", str(tmp_path), "--dataset", "mnist-5k") == 2
        assert out.read_text() == old and capsys.readouterr().err.startswith("error: ")


def test_unknown_dataset_is_a_one_line_error(tmp_path, capsys):
    out = tmp_path / "CLAIMS.md"
    assert bench_claims("--out", str(out), "--results", str(tmp_path), "--dataset", "mnist-5k,cifar10") == 2
    err = capsys.readouterr().err
    assert err == "error: unknown datasets ['cifar10'] (claims.yaml has: digits, mnist-5k, mnist)\n"
    assert not out.exists()


def test_bench_claims_takes_the_file_as_an_argument_and_names_a_missing_one(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        cli(["claims", "--help"])
    assert e.value.code == 0
    shown = capsys.readouterr().out
    assert "[CLAIMS_FILE]" in shown and all(o in shown for o in ("--run", "--figures", "--only", "--also"))
    assert bench_claims("--out", str(tmp_path / "CLAIMS.md"), claims_file=tmp_path / "nowhere.yaml") == 2
    missing = tmp_path / "nowhere.yaml"
    assert capsys.readouterr().err == f"error: no claims file at {missing} (bench claims CLAIMS_FILE)\n"


def test_also_adds_a_root_of_committed_records(tmp_path):
    """``--also DIR``: a complete record there counts for its cell, as one under the file's
    ``also_results`` does."""
    out, committed = tmp_path / "CLAIMS.md", tmp_path / "committed"
    spec = claims.load_claims(CLAIMS_YAML)
    abl = next(c for c in spec["claims"] if c["id"] == "dpaf-ablations")
    _records(committed, claims.build_arms(spec, abl, "mnist-5k")["μ = 8, GC"], [0.7, 0.72, 0.71])
    assert bench_claims("--out", str(out), "--results", str(tmp_path / "none"), "--dataset", "mnist-5k",
                        "--only", "dpaf-ablations", "--also", str(committed)) == 0
    assert "| μ = 8, GC | 3/3 | 9.96 / 9.1 | 0.710 ± 0.010 |" in claims.split_blocks(out.read_text())["mnist-5k"]


def test_claims_md_is_in_the_repo_covers_every_claim_on_every_dataset_and_is_linked():
    text = (ROOT / "benchmarks" / "CLAIMS.md").read_text()
    spec = claims.load_claims(CLAIMS_YAML)
    blocks = claims.split_blocks(text)
    assert set(spec["datasets"]) <= set(blocks)
    for dataset in spec["datasets"]:
        covered = [c for c in spec["claims"] if dataset in claims.claim_datasets(spec, c)]
        verdicts = claims.block_verdicts(blocks[dataset], dataset, covered)
        assert set(verdicts) == {c["id"] for c in covered}, dataset
        for claim_id, (verdict, name) in verdicts.items():
            assert f"[**{verdict}**](#{name})" in text.split("<!-- claims:dataset=")[0], (dataset, claim_id)
    assert "benchmarks/CLAIMS.md" in (ROOT / "README.md").read_text()
    assert "bench claims --run" in (ROOT / "Makefile").read_text()


def test_reference_rows_use_our_method_names():
    from dpgen_bench.report.references import load_references

    methods = set(load_references()["method"])
    assert {"dpmerf", "dpsinkhorn"} <= methods and not {"dp-merf", "dp-sinkhorn"} & methods


def _n_d_rendered_there(tmp_path):
    """The n-d-steps claim on digits rendered on another machine from every seed of every arm
    (n_D = 5 ahead): (spec, claim, its arms there, the block rendered)."""
    spec = claims.load_claims(CLAIMS_YAML)
    claim = next(c for c in spec["claims"] if c["id"] == "n-d-steps")
    full = claims.build_arms(spec, claim, "digits")
    for name, a in full.items():
        _records(tmp_path / "there", a, [0.5, 0.6, 0.7] if name == "n_D = 5" else [0.2, 0.3, 0.25])
        claims.read_arm(a, tmp_path / "there")
    return spec, claim, full, claims.render_block(spec, "digits", [claim], {claim["id"]: full}, None)


def test_a_section_rendered_from_more_runs_than_this_machine_holds_is_kept(tmp_path):
    """results/ is not in git: re-rendering a block on a machine that holds fewer of a claim's
    runs than its section shows keeps that section (marked), instead of turning a verdict into
    "not run yet"; with as many runs here as there, it is rendered anew."""
    spec, claim, full, previous = _n_d_rendered_there(tmp_path)
    assert "| n_D = 5 | 3/3 |" in previous
    here = claims.build_arms(spec, claim, "digits")
    _records(tmp_path / "here", here["n_D = 1"], [0.2])  # one seed of one arm
    for a in here.values():
        claims.read_arm(a, tmp_path / "here")
    block = claims.render_block(spec, "digits", [claim], {claim["id"]: here}, None, previous=previous)
    section = claims.old_section(previous, claim["id"], "digits")
    assert section in block and claims.KEPT_NOTE in block and "not run yet" not in block
    again = claims.render_block(spec, "digits", [claim], {claim["id"]: here}, None, previous=block)
    assert again.count(claims.KEPT_NOTE) == 1  # kept once, not re-marked
    fresh = claims.render_block(spec, "digits", [claim], {claim["id"]: full}, None, previous=block)
    assert claims.KEPT_NOTE not in fresh and "| n_D = 5 | 3/3 |" in fresh


def test_a_kept_section_takes_the_newer_rows_this_machine_holds_and_carries_the_others(tmp_path):
    """A machine holding every seed of one arm, with other numbers than the section shows,
    and none of the others: that row comes from its records, the others are carried as shown
    (named in a note), and the checks are recomputed from the rows as shown. Rendered again
    from the same records the section stays as it is."""
    spec, claim, _, previous = _n_d_rendered_there(tmp_path)
    old_rows = {m.group(1): m.group(0) for m in claims._ROW.finditer(previous)}
    here = claims.build_arms(spec, claim, "digits")
    _records(tmp_path / "here", here["n_D = 5"], [0.1, 0.12, 0.11])  # every seed, now worse
    for a in here.values():
        claims.read_arm(a, tmp_path / "here")
    block = claims.render_block(spec, "digits", [claim], {claim["id"]: here}, None, previous=previous)
    assert claims.KEPT_NOTE not in block and claims.CARRIED in block
    assert "| n_D = 5 | 3/3 |" in block and "0.110 ± 0.010" in block
    for name, line in old_rows.items():
        if name != "n_D = 5":
            assert line in block and f"`{name}`" in block.split(claims.CARRIED)[1]
    # the checks follow the rows as shown: with n_D = 5 at 0.11 "more D steps help" no longer holds
    merged = {n: (here[n] if n == "n_D = 5" else claims._arm_from_row(n, a.ref, *claims._table(previous)[1][n]))
              for n, a in here.items()}
    results = [r for exp in claim["expect"] for r in claims.check(spec, exp, merged)]
    assert f"**Verdict: {claims.claim_verdict(results)}**" in block
    assert claims.claim_verdict(results) != claims.block_verdicts(previous, "digits", [claim])[claim["id"]][0]
    again = claims.render_block(spec, "digits", [claim], {claim["id"]: here}, None, previous=block)
    assert claims.old_section(again, claim["id"], "digits") == claims.old_section(block, claim["id"], "digits")
    # nothing newer here (fewer seeds of the arm than shown): the section is kept whole, as before
    one = claims.build_arms(spec, claim, "digits")
    _records(tmp_path / "one", one["n_D = 5"], [0.1])
    for a in one.values():
        claims.read_arm(a, tmp_path / "one")
    kept = claims.render_block(spec, "digits", [claim], {claim["id"]: one}, None, previous=previous)
    assert claims.KEPT_NOTE in kept and claims.CARRIED not in kept


def test_a_code_line_re_rendered_with_carried_rows_names_each_commit_once():
    """Re-rendering a section that already carries rows does not nest the previous render's
    code line inside the new one: each commit is named once, this render's first."""
    a, b, c = "3 runs at aaaaaaa (day 2)", "2 runs at bbbbbbb (day 1)", "3 runs at ccccccc (day 3)"
    first = claims._with_carried_code(a, b)
    assert first == a + claims.CARRIED_CODE + b
    second = claims._with_carried_code(f"{c}; 1 run at bbbbbbb (day 1)", first)
    assert second.count(claims.CARRIED_CODE) == 1 and second.count("bbbbbbb") == 1
    assert second.endswith(claims.CARRIED_CODE + a)
    assert claims._with_carried_code(a, a) == a


def test_a_committed_record_counts_for_its_cell(tmp_path, monkeypatch):
    """``also_results``: a cell whose record sits complete in a committed directory is read
    from there (and not run again); one found nowhere is run under ``results``. The file's
    paths are relative to the working directory (make claims: the checkout)."""
    monkeypatch.chdir(ROOT)
    spec = claims.load_claims(CLAIMS_YAML)
    assert [p.relative_to(ROOT).as_posix() for p in claims.committed_roots(spec)] == ["benchmarks/mnist_runs"]
    learns = next(c for c in spec["claims"] if c["id"] == "mnist-learns")
    cells = claims.build_arms(spec, learns, "mnist")["dpmerf, long preset"].cells
    committed = ROOT / "benchmarks" / "mnist_runs" / cells[0].run_name  # seed 0 of the long preset
    assert claims.record_dir(cells[0], tmp_path, claims.committed_roots(spec)) == committed
    missing = tmp_path / "nowhere"
    assert claims.record_dir(cells[0], tmp_path, [missing]) == tmp_path / cells[0].run_name
    arm = claims.Arm("dpmerf, long preset", cells[:1])
    claims.read_arm(arm, tmp_path, also=claims.committed_roots(spec))
    assert len(arm.values["gen2real_cnn"]) == 1 and arm.values["gen2real_cnn"][0] > 0.5


def test_a_claims_figures_are_drawn_from_its_own_records_only(tmp_path):
    """``--figures``: the curve of one claim's arms, whatever else the results root holds; a
    record in the committed root (no samples there) counts, and a second call rebuilds the links."""
    results, committed = tmp_path / "results", tmp_path / "committed"
    spec = claims.load_claims(CLAIMS_YAML)
    claim = next(c for c in spec["claims"] if c["id"] == "mnist-long")
    arms = claims.build_arms(spec, claim, "mnist")
    names = list(arms)
    for name in names[:-1]:
        _records(results, arms[name], [0.3])
    _records(committed, arms[names[-1]], [0.7])
    other = claims.build_arms(spec, next(c for c in spec["claims"] if c["id"] == "mnist-noise"), "mnist")
    _records(results, next(iter(other.values())), [0.1])  # another claim's record: not drawn
    out = tmp_path / "fig" / "mnist-long-mnist"
    for _ in range(2):
        paths = claims.draw_figures(arms, results, out, [committed])
        linked = {p.name for p in (out / "runs").iterdir()}
        assert linked == {a.cells[0].run_name for a in arms.values()}
    assert out / "mnist-gen2real_cnn-vs-eps.png" in paths


def _arms_with(spec, claim, dataset, values):
    """The claim's arms on ``dataset``, each holding ``values(name)`` as its gen2real_cnn and
    real2gen_cnn seeds (no records: what ``read_arm`` would fill in)."""
    arms = claims.build_arms(spec, claim, dataset)
    for name, a in arms.items():
        for metric in ("gen2real_cnn", "real2gen_cnn"):
            a.values[metric] = list(values(name))
        a.eps = [(9.96, 9.1)] * len(a.cells)
    return arms


def test_a_shared_arm_shows_the_row_of_the_section_rendered_last(monkeypatch):
    """Two claims share an arm (the same cells); ``--only`` re-renders one of them from newer
    runs: the other section shows the newer row too, its checks and verdict recomputed from its
    rows as shown and a note saying so, and a second render changes nothing."""
    spec = claims.load_claims(CLAIMS_YAML)
    small_n, vs = (next(c for c in spec["claims"] if c["id"] == i) for i in ("small-n", "dpac-vs-gswgan"))
    before = {"dpac, noise off": [0.82, 0.85, 0.80], "gswgan, noise off": [0.80, 0.79, 0.81]}
    after = {"dpac, noise off": [0.60, 0.62, 0.58], "gswgan, noise off": [0.80, 0.79, 0.81]}
    monkeypatch.setattr(claims.time, "strftime", lambda fmt, *a: "2026-11-25")
    old = {c["id"]: _arms_with(spec, c, "digits", lambda n: before.get(n, [0.1, 0.11, 0.09])) for c in (small_n, vs)}
    block = claims.render_block(spec, "digits", [small_n, vs], old, None)
    assert "inconclusive: dpac, noise off 0.823 vs gswgan, noise off 0.800" in block
    monkeypatch.setattr(claims.time, "strftime", lambda fmt, *a: "2026-11-27")
    new = {"small-n": _arms_with(spec, small_n, "digits", lambda n: after.get(n, [0.1, 0.11, 0.09]))}
    block = claims.replace_sections(block, claims.render_block(spec, "digits", [small_n], new, None), "digits",
                                    [small_n])
    out = claims.refresh_shared_rows(spec, block, "digits", spec["claims"])
    row = "| dpac, noise off | 3/3 | 9.96 / 9.1 | 0.600 ± 0.020 | 0.600 ± 0.020 |"
    section = claims.find_section(out, "dpac-vs-gswgan", "digits")[1]
    assert row in claims.find_section(out, "small-n", "digits")[1] and row in section
    assert "0.823" not in section and "**Verdict: not reproduced**" in section
    assert "- not reproduced: dpac, noise off 0.600 vs gswgan, noise off 0.800" in section
    assert "_Rows of `dpac, noise off` as [small-n](#small-n-digits) shows them" in section
    assert claims.refresh_shared_rows(spec, out, "digits", spec["claims"]) == out
    # kept from an earlier render: older than any section rendered from records here
    kept = block.replace("_Last regenerated", claims.KEPT_NOTE + "\n\n_Last regenerated", 1)
    assert claims._rendered_on(kept, "digits", [small_n, vs]) == {"small-n": "2026-11-27", "dpac-vs-gswgan": ""}


def test_sections_of_one_render_that_disagree_are_left_as_they_are(monkeypatch):
    """Nothing says which of two sections rendered together holds the current runs."""
    spec = claims.load_claims(CLAIMS_YAML)
    small_n, vs = (next(c for c in spec["claims"] if c["id"] == i) for i in ("small-n", "dpac-vs-gswgan"))
    monkeypatch.setattr(claims.time, "strftime", lambda fmt, *a: "2026-11-25")
    one = claims.render_block(spec, "digits", [small_n], {"small-n": _arms_with(
        spec, small_n, "digits", lambda n: [0.5, 0.6, 0.7])}, None)
    two = claims.render_block(spec, "digits", [vs], {"dpac-vs-gswgan": _arms_with(
        spec, vs, "digits", lambda n: [0.2, 0.3, 0.4])}, None)
    block = one.rsplit("\n_Last regenerated", 1)[0] + two.split("\n\n", 1)[1]
    assert claims.refresh_shared_rows(spec, block, "digits", spec["claims"]) == block


def test_a_claims_statement_follows_the_file_without_its_records():
    """Source and The paper state the claim: a render rewrites them from the claims file in
    every section, kept ones included; what the runs were (Checked at) stays as rendered."""
    spec = claims.load_claims(CLAIMS_YAML)
    claim = next(c for c in spec["claims"] if c["id"] == "mnist-long")
    section = (f'<a id="mnist-long-mnist"></a>\n## x (mnist)\n\n- **Source:** old source\n'
               f"- **The paper:** passes 0.5\n- **Checked at:** as it ran\n- **Verdict: reproduced**\n\n"
               f"{claims.KEPT_NOTE}\n\n_Last regenerated 2026-11-25._")
    out = claims.sync_claim_text(section, "mnist", spec["claims"])
    assert f"- **Source:** {claim['source']}\n- **The paper:** {claim['paper']}\n- **Checked at:** as it ran" in out
    assert claims.sync_claim_text(out, "mnist", spec["claims"]) == out
