"""Report: golden outputs from fixed synthetic records, references, CLI options."""

import math
import time

import pandas as pd
import pytest

from dpgen_bench.cli import cli
from dpgen_bench.report import table as T
from report_fixtures import make_record, standard_records

GOLDEN_MARKDOWN_A = '| ε | method | ε spent (RDP / PRV) | digits fid ↓ | digits gen2real_cnn ↑ |\n|---|---|---|---|---|\n| ∞ | gan | ∞ / ∞ | 20.0 (n=1) | 0.900 (n=1) |\n| 10 | dpaf | 9.98 / 9.2 | 68.0 ± 2.0 | 0.710 ± 0.010 |\n| 10 | dpgan | 9.98 / 9.2 | **59.0 ± 1.4 (n=2)** | **0.720 ± 0.028 (n=2)** |\n| 1 | dpaf | 0.998 / 0.92 | **100.0 ± 2.0** | **0.580 ± 0.020** |\n| 1 | dpgan | 0.998 / 0.92 | 115.0 ± 5.0 | 0.520 ± 0.020 |\n'
GOLDEN_LATEX_A = '\\begin{tabular}{llccc}\n\\toprule\n$\\varepsilon$ & method & $\\varepsilon$ spent (RDP / PRV) & digits fid $\\downarrow$ & digits gen2real\\_cnn $\\uparrow$ \\\\\n\\midrule\n$\\infty$ & gan & $\\infty$ / $\\infty$ & 20.0 (n=1) & 0.900 (n=1) \\\\\n10 & dpaf & 9.98 / 9.2 & 68.0 $\\pm$ 2.0 & 0.710 $\\pm$ 0.010 \\\\\n10 & dpgan & 9.98 / 9.2 & \\textbf{59.0 $\\pm$ 1.4 (n=2)} & \\textbf{0.720 $\\pm$ 0.028 (n=2)} \\\\\n1 & dpaf & 0.998 / 0.92 & \\textbf{100.0 $\\pm$ 2.0} & \\textbf{0.580 $\\pm$ 0.020} \\\\\n1 & dpgan & 0.998 / 0.92 & 115.0 $\\pm$ 5.0 & 0.520 $\\pm$ 0.020 \\\\\n\\bottomrule\n\\end{tabular}\n'
GOLDEN_CSV_B = 'method,ε,ε spent (RDP / PRV),fid ↓,fid ↓ std,fid ↓ n,gen2real_cnn ↑,gen2real_cnn ↑ std,gen2real_cnn ↑ n\ngan,∞,∞ / ∞,20.0,,1,0.9,,1\ndpaf,1,0.998 / 0.92,100.0,2.0,3,0.58,0.02,3\ndpgan,1,0.998 / 0.92,115.0,5.0,3,0.52,0.02,3\n'
GOLDEN_MARKDOWN_C = ('| method | ε | full_black_box, 64 members (0.5 ideal) | white_box, 64 members (0.5 ideal) |\n|---|---|---|---|\n| dpgan | 1 | 0.510 (n=1) | 0.490 (n=1) |\n| gan | ∞ | 0.980 (n=1) | 0.970 (n=1) |\n'
    "\nOne run's AUC spreads by ±0.051 at 64 members when nothing leaks (one s.d., members against as many "
    "non-members); each run's eval.json has its DeLong standard error, 95 % interval and Mann–Whitney p-value "
    "(protocol.<evaluator>.auc_uncertainty).\n")


@pytest.fixture
def agg(tmp_path):
    long, skipped = T.collect(standard_records(tmp_path / "runs"))
    assert skipped == 1  # the run without eval.json
    return T.aggregate(long)


def test_golden_markdown_layout_a(agg):
    assert T.render_markdown(T.layout_a(agg)) == GOLDEN_MARKDOWN_A


def test_golden_latex_layout_a(agg):
    assert T.render_latex(T.layout_a(agg)) == GOLDEN_LATEX_A


def test_golden_csv_layout_b(agg):
    assert T.render_csv(T.layout_b(agg, "digits", 1.0)) == GOLDEN_CSV_B


def test_golden_markdown_layout_c(agg):
    assert T.render_markdown(T.layout_c(agg)) == GOLDEN_MARKDOWN_C


def test_mean_std_over_seeds(agg):
    row = agg[(agg.method == "dpaf") & (agg.eps_target == 1) & (agg.metric == "gen2real_cnn")].iloc[0]
    assert row["mean"] == pytest.approx(0.58) and row["std"] == pytest.approx(0.02) and row["n"] == 3


def test_references_load_and_join(tmp_path, cli_runner):
    from dpgen_bench.report.references import load_references

    ref = load_references()
    assert len(ref) > 100 and set(ref["source"]) == {"paper"}
    assert {"private-gans-revisited-tmlr2023:Table 2", "dpaf:Table 18"} <= set(ref["run_id"])
    acc = ref[ref.metric.str.startswith("gen2real")]["value"]
    assert acc.between(0, 1).all()  # accuracies are fractions
    # Private GANs Table 2: our DPGAN + adaptive n_D, MNIST, ε=10: FID 12.8 ± 0.3
    hit = ref[(ref.method == "dpgan+adaptive") & (ref.dataset == "mnist") & (ref.eps_target == 10) &
              (ref.metric == "fid")]
    assert hit["value"].iloc[0] == pytest.approx(12.8) and hit["ref_std"].iloc[0] == pytest.approx(0.3)
    root = tmp_path / "r"
    make_record(root, "dpgan-mnist", "dpgan", "mnist", 10.0, 0, {"fid": 30.0}, rdp=9.9, prv=9.1)
    res = cli_runner.invoke(cli, ["report", "--results", str(root), "--with-references", "--metric", "fid"])
    assert res.exit_code == 0, res.stderr
    assert "| 10 | dpgan+adaptive (paper) | — |" in res.output
    assert "12.8 ± 0.3" in res.output


def test_cli_formats_and_out(tmp_path, cli_runner):
    root = standard_records(tmp_path / "runs")
    res = cli_runner.invoke(cli, ["report", "--results", str(root), "--layout", "b", "--eps", "1", "--format", "csv"])
    assert res.exit_code == 0 and res.stdout == GOLDEN_CSV_B
    out = tmp_path / "t.tex"
    res = cli_runner.invoke(cli, ["report", "--results", str(root), "--format", "latex", "--out", str(out)])
    assert res.exit_code == 0 and res.stdout == "" and out.read_text() == GOLDEN_LATEX_A
    assert "skipped 1 incomplete" in res.stderr


@pytest.mark.parametrize("name, letter, golden", [("eps-rows", "a", GOLDEN_MARKDOWN_A),
                                                   ("one-setting", "b", None), ("mia", "c", GOLDEN_MARKDOWN_C),
                                                   ("eps-columns", "d", None)])
def test_layouts_have_names_and_their_letters_still_work(tmp_path, cli_runner, name, letter, golden):
    root = standard_records(tmp_path / "runs")
    by_name, by_letter = (cli_runner.invoke(cli, ["report", "--results", str(root), "--layout", layout])
                          for layout in (name, letter))
    assert by_name.exit_code == 0 and by_letter.exit_code == 0, (by_name.stderr, by_letter.stderr)
    assert by_name.stdout == by_letter.stdout and (golden is None or by_name.stdout == golden)
    shown = cli_runner.invoke(cli, ["report", "--help"]).output
    assert f"{name}:" in shown and "[eps-rows|one-setting|mia|eps-columns|tiers|audit|runs]" in shown
    res = cli_runner.invoke(cli, ["report", "--results", str(root), "--layout", "e"])
    assert res.exit_code == 2 and "'e' is not one of 'eps-rows', 'one-setting'" in res.stderr


def test_empty_results_is_a_user_error(tmp_path, cli_runner):
    (tmp_path / "empty").mkdir()
    res = cli_runner.invoke(cli, ["report", "--results", str(tmp_path / "empty")])
    assert res.exit_code == 2 and res.stderr.strip() == f"error: no completed runs under {tmp_path / 'empty'}"


def test_figures(tmp_path, cli_runner):
    import json

    import numpy as np

    root = standard_records(tmp_path / "runs")
    for d in sorted(root.iterdir()):
        if (d / "eval.json").exists():
            np.savez(d / "samples.npz", images=np.zeros((20, 1, 16, 16), np.float32),
                     labels=np.repeat(np.arange(10), 2).astype(np.int64))
    # two seeds of one configuration with a training log: one figure, a line per seed (a
    # figure costs ~1 s: png and pdf)
    for seed in (0, 1):
        (root / f"dpaf-digits-eps1-s{seed}" / "train.jsonl").write_text(
            json.dumps({"d_step": 1, "d_loss": 0.7, "n_d": 1}) + "\n" + json.dumps({"d_step": 2, "d_loss": 0.6}) + "\n")
    ev = json.loads((root / "gan-digits-m64-s0" / "eval.json").read_text())
    ev["protocol"]["mia_auc_full_black_box"] = {"roc": {"fpr": [0, 0.5, 1], "tpr": [0, 0.9, 1]}}
    (root / "gan-digits-m64-s0" / "eval.json").write_text(json.dumps(ev))
    res = cli_runner.invoke(cli, ["report", "--results", str(root), "--figures", str(tmp_path / "fig")])
    assert res.exit_code == 0, (res.stderr, res.exception)
    names = {p.name for p in (tmp_path / "fig").iterdir()}
    assert {"digits-gen2real_cnn-vs-eps.png", "digits-gen2real_cnn-vs-eps.pdf", "digits-eps1-samples.png",
             "digits-mia_auc_full_black_box-roc.png"} <= names
    assert [n for n in names if n.endswith("-training.png")] == ["digits-eps1-dpaf-training.png"]


def test_report_of_a_thousand_records_renders(tmp_path):
    root = tmp_path / "many"
    for i in range(1000):
        make_record(root, f"r{i}", ["dpgan", "dpaf", "gswgan", "dpac"][i % 4], ["digits", "mnist"][i // 500],
                    [1.0, 10.0][(i // 4) % 2], i, {"fid": float(i % 97), "gen2real_cnn": (i % 89) / 89}, rdp=1, prv=1)
    t = time.perf_counter()
    long, _ = T.collect(root)
    text = T.render_markdown(T.layout_a(T.aggregate(long)))
    elapsed = time.perf_counter() - t
    assert text.count("\n") == 2 + 8 and not math.isnan(elapsed)


# ------------------------------------------------- configurations, reruns, caveats


def _rows(agg, metric="gen2real_cnn"):
    sel = agg[agg.metric == metric]
    return {m: (round(mean, 6), n) for m, mean, n in zip(sel.method, sel["mean"], sel.n)}


def test_configurations_are_rows_not_seeds(tmp_path):
    """Two dpgan configurations at one ε are two rows (labelled by what differs), each
    pooling only its own seeds; a bookkeeping hparam (log_every) does not split a row."""
    root = tmp_path / "runs"
    for seed, acc in enumerate([0.5, 0.6]):
        make_record(root, f"fixed-{seed}", "dpgan", "digits", 10.0, seed, {"gen2real_cnn": acc}, rdp=9.9, prv=9.1,
                    hparams={"n_d": 1, "lr_g": 2e-4, "log_every": 25 + seed})
    for seed, acc in enumerate([0.8, 0.9]):
        make_record(root, f"adaptive-{seed}", "dpgan", "digits", 10.0, seed, {"gen2real_cnn": acc}, rdp=9.9,
                    prv=9.1, hparams={"n_d": "adaptive", "lr_g": 2e-4, "log_every": 25})
    make_record(root, "dpaf-0", "dpaf", "digits", 10.0, 0, {"gen2real_cnn": 0.3}, rdp=9.9, prv=9.1,
                hparams={"mu": 8})
    long, _ = T.collect(root)
    assert _rows(T.aggregate(long)) == {"dpgan [n_d=1]": (0.55, 2), "dpgan [n_d=adaptive]": (0.85, 2),
                                        "dpaf": (0.3, 1)}
    text = T.render_markdown(T.layout_a(T.aggregate(long)))
    assert "| 10 | dpgan [n_d=1] |" in text and "| 10 | dpgan [n_d=adaptive] |" in text
    assert set(long["base_method"]) == {"dpgan", "dpaf"}


def test_variant_labels_name_the_preset_not_what_it_fixes():
    q = {"preset": "quick", "delta": 1e-5, "width": 32, "steps": 1500}
    labels = T.variant_labels({
        "a": q, "b": {**q, "preset": "paper", "width": 128, "steps": 450000},
        "c": {**q, "lr_g": 1e-3}, "d": {**q, "delta": 1e-6}})
    assert labels == {"a": "preset=quick, delta=1e-05, lr_g=unset", "b": "preset=paper, delta=1e-05, lr_g=unset",
                      "c": "preset=quick, delta=1e-05, lr_g=0.001", "d": "preset=quick, delta=1e-06, lr_g=unset"}
    assert T.variant_labels({"only": q}) == {"only": ""}


def test_a_rerun_of_a_seed_counts_once_the_newest(tmp_path, caplog):
    import os

    root = tmp_path / "runs"
    old = make_record(root, "first", "dpgan", "digits", 1.0, 0, {"gen2real_cnn": 0.2}, rdp=1, prv=1)
    new = make_record(root, "again", "dpgan", "digits", 1.0, 0, {"gen2real_cnn": 0.4}, rdp=1, prv=1)
    make_record(root, "seed1", "dpgan", "digits", 1.0, 1, {"gen2real_cnn": 0.6}, rdp=1, prv=1)
    os.utime(old / "eval.json", (1_000, 1_000))  # "first" finished long before "again"
    os.utime(new / "eval.json", (2_000, 2_000))
    long, _ = T.collect(root)
    with caplog.at_level("WARNING", logger="dpgen_bench"):
        agg = T.aggregate(long)
    assert _rows(agg) == {"dpgan": (0.5, 2)}  # 0.4 and 0.6, not 0.2
    assert "1 run(s) repeat" in caplog.text
    assert len(T.runs_table(long).rows) == 3  # the runs layout still lists every run


def test_caveated_epsilon_is_marked_with_a_note(tmp_path, cli_runner):
    root = tmp_path / "runs"
    why = "dpaf privacy_mode=paper: ε is the paper's accounting (μ batches reused); not a DP guarantee"
    for mode, acc in (("sound", 0.5), ("paper", 0.7)):
        make_record(root, f"dpaf-{mode}", "dpaf", "digits", 10.0, 0, {"gen2real_cnn": acc}, rdp=9.9, prv=9.1,
                    hparams={"privacy_mode": mode}, caveat=why if mode == "paper" else None)
    agg = T.aggregate(T.collect(root)[0])
    md = T.render_markdown(T.layout_a(agg))
    assert "| 10 | dpaf [privacy_mode=paper] | 9.9 / 9.1 ‡ |" in md
    assert "| 10 | dpaf [privacy_mode=sound] | 9.9 / 9.1 |" in md
    assert md.rstrip().endswith(f"‡ {why}")
    tex = T.render_latex(T.layout_b(agg, "digits", 10.0))
    assert r"9.9 / 9.1 \ddag{}" in tex and r"\footnotesize \ddag{} dpaf privacy\_mode=paper" in tex
    assert r"($\mu$ batches reused)" in tex
    res = cli_runner.invoke(cli, ["report", "--results", str(root), "--format", "csv"])
    assert res.exit_code == 0, (res.output, res.stderr)
    assert "9.9 / 9.1 ‡" in res.stdout and why in res.stderr and why not in res.stdout
    runs = T.render_markdown(T.runs_table(T.collect(root)[0]))
    assert "9.9 ‡" in runs and why in runs


# ------------------------------------------------- damaged runs, bold, layout d, figures


def test_damaged_runs_are_skipped_with_their_name_and_the_rest_is_reported(tmp_path, cli_runner):
    import json

    root = tmp_path / "runs"
    make_record(root, "good", "dpgan", "digits", 1.0, 0, {"gen2real_cnn": 0.5}, rdp=0.99, prv=0.9)
    damage = {
        "eval-list": ("eval.json", "[1, 2]", "eval.json holds a list, not an object"),
        "privacy-null": ("privacy.json", "null", "privacy.json holds null, not an object"),
        "no-method": ("config.json", json.dumps({"dataset": "digits"}), "config.json has no 'method'"),
        "truncated": ("privacy.json", '{"private": true, "tar', "privacy.json is not valid JSON"),
        "metric-text": ("eval.json", json.dumps({"metrics": {"fid": "high"}}), "eval.json metric 'fid' is 'high'"),
    }
    for name, (file, text, _) in damage.items():
        d = make_record(root, name, "dpgan", "digits", 1.0, 1, {"gen2real_cnn": 0.1}, rdp=0.99, prv=0.9)
        (d / file).write_text(text)
    res = cli_runner.invoke(cli, ["report", "--results", str(root)])
    assert res.exit_code == 0, (res.stderr, res.exception)
    assert "| 1 | dpgan | 0.99 / 0.9 | 0.500 (n=1) |" in res.stdout
    warnings = res.stderr.splitlines()
    for name, (_, _, why) in damage.items():
        (line,) = [w for w in warnings if f"{root / name}:" in w]
        assert line.startswith(f"[bench] skipped the damaged run {root / name}: {why}"), line
    assert "skipped 5 incomplete, failed or damaged run(s)" in res.stderr


def test_bold_is_the_best_within_one_dataset_and_epsilon(agg):
    """Layout b over every ε: the ε = 10 rows do not take the bold away from ε = 1."""
    tab = T.layout_b(agg, "digits", None)
    bold = {(row[0], line[0]): [c.text() for c in line[2:] if isinstance(c, T.Cell) and c.bold]
            for row, line in zip(tab.rows, tab.cells)}
    assert bold[("dpaf", "1")] == ["100.0 ± 2.0", "0.580 ± 0.020"]  # best at ε = 1, worse than both at ε = 10
    assert bold[("dpgan", "10")] == ["59.0 ± 1.4 (n=2)", "0.720 ± 0.028 (n=2)"]
    assert bold[("dpgan", "1")] == bold[("dpaf", "10")] == bold[("gan", "∞")] == []


def test_layout_d_has_methods_as_rows_and_dataset_epsilon_as_columns(agg, tmp_path, cli_runner):
    tab = T.layout_d(agg)
    assert [r[0] for r in tab.rows] == ["dpaf", "dpgan", "gan"]
    assert tab.columns == ["digits ε=1 spent", "digits ε=1 fid ↓", "digits ε=1 gen2real_cnn ↑",
                           "digits ε=10 spent", "digits ε=10 fid ↓", "digits ε=10 gen2real_cnn ↑",
                           "digits ε=∞ spent", "digits ε=∞ fid ↓", "digits ε=∞ gen2real_cnn ↑"]
    md = T.render_markdown(tab)
    assert ("| dpaf | 0.998 / 0.92 | **100.0 ± 2.0** | **0.580 ± 0.020** | 9.98 / 9.2 | 68.0 ± 2.0 | "
            "0.710 ± 0.010 | — | — | — |") in md
    assert "| gan | — | — | — | — | — | — | ∞ / ∞ | 20.0 (n=1) | 0.900 (n=1) |" in md
    res = cli_runner.invoke(cli, ["report", "--results", str(standard_records(tmp_path / "r")), "--layout", "d",
                                  "--metric", "gen2real_cnn"])
    assert res.exit_code == 0, (res.stderr, res.exception)
    assert res.stdout.splitlines()[0] == ("| method | digits ε=1 spent | digits ε=1 gen2real_cnn ↑ | "
                                          "digits ε=10 spent | digits ε=10 gen2real_cnn ↑ | "
                                          "digits ε=∞ spent | digits ε=∞ gen2real_cnn ↑ |")


def _with_samples(root):
    import json

    import numpy as np

    for d in root.iterdir():
        if (d / "eval.json").exists():
            np.savez(d / "samples.npz", images=np.zeros((20, 1, 16, 16), np.float32),
                     labels=np.repeat(np.arange(10), 2).astype(np.int64))
            (d / "train.jsonl").write_text(json.dumps({"d_step": 1, "d_loss": 0.7, "g_loss": 0.9, "n_d": 1}) + "\n")
    return root


def test_figures_read_the_run_directory_and_titles_do_not_overlap(tmp_path, monkeypatch):
    """A renamed or copied run directory (its config.json still names the old run_id) gives
    its samples and curves; a figure's title never overlaps its subplots' titles."""
    from dpgen_bench.report import figures as F

    figs = []
    monkeypatch.setattr(F, "_save", lambda fig, out, name: figs.append((name, fig)) or [])
    root = _with_samples(standard_records(tmp_path / "runs"))
    for d in list(root.iterdir()):
        d.rename(root / f"moved-{d.name}")
    long, _ = T.collect(root)
    F.sample_grids(long, tmp_path)
    F.training_curves(long[long["run_id"].str.startswith("dpgan-digits-eps1-s")], tmp_path)
    names = [name for name, _ in figs]
    assert {"digits-eps1-samples", "digits-eps10-samples", "digits-eps1-dpgan-training"} <= set(names)
    training = dict(figs)["digits-eps1-dpgan-training"]
    # the three seeds of the configuration in each panel, one line each
    assert [len(ax.get_lines()) for ax in training.axes] == [3, 3, 3]
    for name, fig in figs:
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        top = fig._suptitle.get_window_extent(renderer)
        for ax in fig.axes:
            assert not ax.get_title() or not top.overlaps(ax.title.get_window_extent(renderer)), name


def test_reference_rows_leave_out_the_inception_score():
    from dpgen_bench.report.references import NOT_COMPUTED, PATH, load_references

    assert "is" in NOT_COMPUTED and ",is," in PATH.read_text()  # the papers' numbers stay in the data file
    assert "is" not in set(load_references()["metric"])


def test_training_figures_of_configurations_whose_names_collide_are_both_kept(tmp_path, monkeypatch):
    import json

    from dpgen_bench.report import figures as F

    figs = []
    monkeypatch.setattr(F, "_save", lambda fig, out, name: figs.append(name) or [])
    rows = []
    for i, label in enumerate(["dpgan [lr=1/2]", "dpgan [lr=1:2]"]):  # both slug to dpgan_lr=1_2
        d = tmp_path / f"r{i}"
        d.mkdir()
        (d / "train.jsonl").write_text(json.dumps({"d_step": 1, "d_loss": 0.5}) + "\n")
        rows.append({"run_id": f"r{i}", "run_dir": str(d), "dataset": "digits", "method": label,
                     "eps_target": math.inf, "members": None, "variant": label, "seed": 0})
    F.training_curves(pd.DataFrame(rows), tmp_path)
    assert sorted(figs) == ["digits-epsinf-dpgan_lr=1_2-2-training", "digits-epsinf-dpgan_lr=1_2-training"]


def _plain(root, name, method, eps, seed, acc, preset="quick", dataset="mnist-5k", **kw):
    """A record whose settings are exactly ``preset``'s as the code resolves them now."""
    import json

    from dpgen_bench.config import build_config

    cfg = build_config(method, dataset, epsilon=eps if math.isfinite(eps) else None, preset=preset)
    d = make_record(root, name, method, dataset, eps, seed, {"gen2real_cnn": acc}, preset=preset,
                    hparams=dict(cfg.hparams), **kw)
    rec = json.loads((d / "config.json").read_text())
    rec["samples_per_class"] = cfg.samples_per_class
    (d / "config.json").write_text(json.dumps(rec))
    return d


def test_layout_tiers_sets_a_minute_an_hour_and_the_paper_side_by_side(tmp_path, cli_runner):
    """quick from this machine's root, long from a second (committed) root, mean ± std over
    seeds; the paper's number is the paper's own row; runs with overrides, at another ε or
    of another preset's settings stay out."""
    here, committed = tmp_path / "here", tmp_path / "committed"
    for m, acc in (("dpgan", 0.2), ("dpaf", 0.1)):
        _plain(here, f"{m}-q", m, 10.0, 0, acc, rdp=9.98, prv=8.5)
    _plain(here, "gan-q", "gan", math.inf, 0, 0.55)
    for seed, acc in enumerate((0.80, 0.84, 0.82)):
        _plain(committed, f"dpgan-l{seed}", "dpgan", 10.0, seed, acc, preset="long", rdp=9.99, prv=8.7)
    make_record(committed, "dpgan-l-override", "dpgan", "mnist-5k", 10.0, 0, {"gen2real_cnn": 0.99}, rdp=9.9,
                prv=8, preset="long", hparams={"width": 7})
    _plain(committed, "dpgan-l-eps1", "dpgan", 1.0, 0, 0.01, preset="long", rdp=0.99, prv=0.9)
    res = cli_runner.invoke(cli, ["report", "--layout", "tiers", "--dataset", "mnist-5k", "--eps", "10",
                                  "--results", str(here), "--also", str(committed), "--with-references"])
    assert res.exit_code == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0] == "| method | ε spent | quick | long | paper | paper's table |"
    row = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]] for line in lines[2:]}
    assert row["dpgan"][:3] == ["9.98 / 8.5", "0.200 (n=1)", "0.820 ± 0.020"]
    assert row["dpaf"][1:3] == ["0.100 (n=1)", "—"]
    assert row["gan"][1:3] == ["0.550 (n=1)", "—"]
    assert list(row)[-1] == "gan"  # ε = ∞ rows last


def _tiers_beside_references(monkeypatch, methods=("dpgan", "dpaf", "dpmerf", "gan")):
    """The tiers table of one plain run per method (mnist, ε = 10) beside references.csv."""
    from dpgen_bench.report.references import load_references

    rows = []
    for i, m in enumerate(methods):
        eps = math.inf if m == "gan" else 10.0
        rows.append({"run_id": m, "method": m, "dataset": "mnist", "preset": "x", "seed": 0, "members": 0,
                     "eps_target": eps, "delta": 1e-5, "eps_rdp": eps, "eps_prv": eps, "metric": "gen2real_cnn",
                     "value": 0.1 * (i + 1), "source": "ours", "finished": 1.0, "caveat": None, "run_dir": None})
    long = T.label_variants(pd.concat([pd.DataFrame(rows), load_references()], ignore_index=True))
    long.loc[long["source"] == "ours", "variant"] = "v"
    monkeypatch.setattr(T, "_preset_variant", lambda *a: "v")  # every row of ours is its preset's plain run
    return T.layout_tiers(long, "mnist", 10.0)


def test_layout_tiers_takes_the_papers_own_row(monkeypatch):
    tab = _tiers_beside_references(monkeypatch)
    got = {r[0]: (c[-2].text(), c[-1]) for r, c in zip(tab.rows, tab.cells)}
    assert got["dpgan"] == ("0.930", "private-gans-revisited-tmlr2023:Table 2")  # "This work"
    assert got["dpaf"] == ("0.748 ‡", "dpaf:Table 1")  # DPAF's own Table 1 row, by its own accounting
    assert got["dpmerf"] == ("0.821", "private-gans-revisited-tmlr2023:Table 2")  # cites Cao et al. (2021)
    assert got["gan"] == ("0.970", "private-gans-revisited-tmlr2023:Table 2")


def test_layout_tiers_marks_a_paper_number_whose_epsilon_is_per_row_accounting(monkeypatch):
    """GS-WGAN's and DP-GAN-DPAC's published ε amplifies each of a step's B rows on its own: their
    paper numbers are marked ‡, with one note that gives the published setting's joint ε; numbers
    of standard accounting (DP-MERF's, Private GANs' DPGAN) are not marked."""
    from dpgen_bench.report.references import ACCOUNTING

    tab = _tiers_beside_references(monkeypatch, ("gswgan", "dpac", "dpgan", "dpmerf"))
    got = {r[0]: (c[-2].text(), c[-1]) for r, c in zip(tab.rows, tab.cells)}
    assert got["gswgan"] == ("0.800 ‡", "private-gans-revisited-tmlr2023:Table 2")
    assert got["dpac"] == ("0.880 ‡", "dp-gan-dpac-cvpr2023:Table 2")
    assert got["dpgan"] == ("0.930", "private-gans-revisited-tmlr2023:Table 2")
    assert got["dpmerf"] == ("0.821", "private-gans-revisited-tmlr2023:Table 2")
    (note,) = tab.notes  # one note for both: the same accounting, the same published setting
    assert note.startswith(f"{T.CAVEAT_MARK} {ACCOUNTING['per-row'][0]}") and "ε = 329" in note
    assert "\n" not in note and "What GS-WGAN's published ε costs" in note
    md = T.render_markdown(tab)
    assert "| gswgan | 10 / 10 | 0.100 (n=1) | 0.800 ‡ |" in md and md.rstrip().endswith(note)
    assert "paper mark" in T.render_csv(tab)  # CSV keeps the mark beside the number


def test_published_numbers_carry_their_accounting_into_every_layout(monkeypatch):
    """references.csv says what each published ε is; layouts without a paper column mark the
    paper row's ε spent cell instead."""
    from dpgen_bench.report.references import ACCOUNTING, PATH, load_references

    raw = pd.read_csv(PATH)
    assert set(raw["accounting"]) == set(ACCOUNTING)
    assert (raw.loc[raw["method"].isin(["gswgan", "dpac"]), "accounting"] == "per-row").all()
    assert (raw.loc[raw["method"] == "dpaf", "accounting"] == "dpaf-paper").all()
    assert raw.loc[raw["accounting"] == "standard", "eps_sound"].isna().all()
    ref = load_references()
    agg = T.aggregate(ref[ref["dataset"] == "mnist"])
    tab = T.layout_b(agg, "mnist", 10.0)
    spent = {r[0]: c[1] for r, c in zip(tab.rows, tab.cells)}
    assert spent["gswgan (paper)"] == "— ‡" and spent["dpac (paper)"] == "— ‡"
    assert spent["dpgan (paper)"] == "—"


def test_layout_tiers_keeps_a_seed_of_each_root_when_each_root_holds_one_configuration(tmp_path, cli_runner):
    """Each root alone labels its one configuration plainly "dpgan"; together they are two
    configurations, and seed 0 of one must not replace seed 0 of the other."""
    here, committed = tmp_path / "here", tmp_path / "committed"
    _plain(here, "dpgan-q", "dpgan", 10.0, 0, 0.2, rdp=9.98, prv=8.5)
    _plain(committed, "dpgan-l", "dpgan", 10.0, 0, 0.7, preset="long", rdp=9.96, prv=8.1)
    res = cli_runner.invoke(cli, ["report", "--layout", "tiers", "--dataset", "mnist-5k", "--eps", "10",
                                  "--results", str(here), "--also", str(committed)])
    assert res.exit_code == 0, res.stderr
    row = [c.strip() for c in res.stdout.splitlines()[2].split("|")[1:-1]]
    assert row[:4] == ["dpgan", "9.98 / 8.5", "0.200 (n=1)", "0.700 (n=1)"], res.stdout


def test_the_tiers_table_of_committed_records_from_a_clean_checkout(tmp_path, monkeypatch):
    """The GS-WGAN issue's command, with no results/runs (a clean clone): the paper column marks
    the per-row accounting ‡, and methods whose committed records predate their preset's current
    form keep their row (gswgan's and dpac's `long` records predate the unbiased average)."""
    from pathlib import Path

    from click.testing import CliRunner

    from dpgen_bench.cli import cli

    runs = Path(__file__).resolve().parents[2] / "benchmarks" / "mnist_runs"
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DPGEN_RESULTS", raising=False)
    res = CliRunner().invoke(cli, ["report", "--layout", "tiers", "--dataset", "mnist", "--eps", "10", "--also",
                                   str(runs), "--with-references"])
    assert res.exit_code == 0, res.output
    rows = {line.split("|")[1].strip(): line for line in res.output.splitlines() if line.startswith("| ")}
    assert "0.800 ‡" in rows["gswgan"] and "0.880 ‡" in rows["dpac"], res.output
    assert "per-row accounting" in res.output and "ε = 329" in res.output
    res = CliRunner().invoke(cli, ["report", "--results", "nowhere", "--also", str(runs)])
    assert res.exit_code == 2 and "no results directory at nowhere" in res.output  # given by hand: still an error


def test_a_training_log_with_repeated_steps_keeps_the_later_lines(tmp_path):
    """Logs resumed before they were cut at the checkpoint repeat the steps the resumed run
    redid: the curve keeps the resumed run's line of each step, in order; GS-WGAN's
    pretraining lines (no step) stay one per discriminator."""
    import json

    from dpgen_bench.report.figures import _read_training_log

    rows = [{"d_step": 1, "d_loss": 0.9}, {"d_step": 2, "d_loss": 0.8}, {"d_step": 3, "d_loss": 0.7},
            {"d_step": 2, "d_loss": 0.5}, {"d_step": 3, "d_loss": 0.4}, {"d_step": 4, "d_loss": 0.3}]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    df = _read_training_log(str(tmp_path))
    assert df["d_step"].tolist() == [1, 2, 3, 4] and df["d_loss"].tolist() == [0.9, 0.5, 0.4, 0.3]
    rows = [{"phase": "pretrain", "discriminator": k, "d_loss": 1.0} for k in (0, 1, 1)]
    rows += [{"step": t, "discriminator": 0, "d_loss": 0.1 * t} for t in (1, 2)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert len(_read_training_log(str(tmp_path))) == 4
