"""The utility–privacy curve of ``bench report --figures``: metric against a log ε axis
that ends at ε = ∞ (non-private and noise-off runs), dpmean as a band, chance as a line."""

import json
import math

import numpy as np
import pytest

from dpgen_bench.cli import cli
from dpgen_bench.report import figures as F
from dpgen_bench.report import table as T
from report_fixtures import make_record

ACC = {  # (method, ε): gen2real_cnn per seed
    ("dpgan", 1.0): [0.30, 0.34],
    ("dpgan", 10.0): [0.55, 0.61],
    ("dpgan", 100.0): [0.70, 0.74],
    ("gan", math.inf): [0.90],
    ("dpmean", 1.0): [0.20, 0.24],
    ("dpmean", 10.0): [0.40, 0.42],
}


def _samples(d):
    np.savez(d / "samples.npz", images=np.zeros((20, 1, 8, 8), np.float32),
             labels=np.repeat(np.arange(10), 2).astype(np.int64))


def _records(root):
    for (method, eps), accs in ACC.items():
        for seed, acc in enumerate(accs):
            _samples(make_record(root, f"{method}-eps{eps:g}-s{seed}", method, "digits", eps, seed,
                                 {"gen2real_cnn": acc, "fid": 100 * (1 - acc)}, rdp=eps, prv=eps))
    # --noise-off: a private target, the σ of ε = 10 replaced by 0, ε spent ∞ (privacy.json as the ledger has it)
    d = make_record(root, "dpgan-noiseoff-s0", "dpgan", "digits", 10.0, 0, {"gen2real_cnn": 0.95, "fid": 5.0},
                    rdp=10.0, prv=10.0)
    priv = json.loads((d / "privacy.json").read_text())
    priv.update(noise_off=True, epsilon={"rdp": "inf", "prv": "inf"}, caveat="noise switched off: not private")
    (d / "privacy.json").write_text(json.dumps(priv))
    _samples(d)
    return root


@pytest.fixture
def curve(tmp_path):
    """The gen2real_cnn curve drawn on an Axes of our own, and the aggregate it came from."""
    plt = F._plt()
    long, _ = T.collect(_records(tmp_path / "runs"))
    agg = T.aggregate(long)
    rows = agg[(agg["dataset"] == "digits") & (agg["metric"] == "gen2real_cnn")]
    fig, ax = plt.subplots()
    F.draw_metric_vs_eps(ax, rows, "gen2real_cnn", F.classes_per_dataset(long)["digits"])
    fig.canvas.draw()
    yield ax, agg
    plt.close(fig)


def _errorbars(ax):
    return {c.get_label(): c for c in ax.containers}


def test_private_line_plots_the_means_over_seeds_against_the_target_eps(curve):
    ax, agg = curve
    line = _errorbars(ax)["dpgan [noise=on]"].lines[0]
    assert list(line.get_xdata()) == [1.0, 10.0, 100.0]
    assert np.allclose(line.get_ydata(), [np.mean(ACC[("dpgan", e)]) for e in (1.0, 10.0, 100.0)])
    assert ax.get_xscale() == "log"


def test_infinity_is_the_last_tick_right_of_every_finite_eps(curve):
    ax, _ = curve
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert labels == ["1", "10", "100", "∞"]
    x_inf = ax.get_xticks()[-1]
    assert x_inf > 100
    gan = _errorbars(ax)["gan"].lines[0]
    assert gan.get_xdata()[0] > 100 and gan.get_ydata()[0] == pytest.approx(0.90)
    assert any(t.get_text() == "//" for t in ax.texts)  # the axis break before ∞


def test_noise_off_run_is_a_hollow_marker_at_infinity_in_its_methods_colour(curve):
    ax, _ = curve
    bars = _errorbars(ax)
    off, on = bars["dpgan [noise=off]"].lines[0], bars["dpgan [noise=on]"].lines[0]
    assert off.get_xdata()[0] > 100 and off.get_ydata()[0] == pytest.approx(0.95)
    assert off.get_markerfacecolor() in ("white", (1.0, 1.0, 1.0, 1.0))
    assert off.get_color() == on.get_color()
    assert 0.95 not in list(on.get_ydata())  # never joined to the private line


def test_dpmean_is_a_band_not_a_line(curve):
    from matplotlib.collections import PolyCollection

    ax, _ = curve
    assert not any("dpmean" in c.get_label() for c in ax.containers)
    assert not any("dpmean" in x.get_label() for x in ax.get_lines())
    band = [c for c in ax.collections if c.get_label() == "dpmean (floor)"]
    assert len(band) == 1 and isinstance(band[0], PolyCollection)
    ys = band[0].get_paths()[0].vertices[:, 1]
    mean1, sd1 = np.mean(ACC[("dpmean", 1.0)]), np.std(ACC[("dpmean", 1.0)], ddof=1)
    assert ys.min() == pytest.approx(mean1 - sd1) and ys.max() > np.mean(ACC[("dpmean", 10.0)])


def test_chance_is_a_dotted_line_at_one_over_the_classes(curve):
    ax, _ = curve
    chance = [x for x in ax.get_lines() if x.get_label().startswith("chance")]
    assert len(chance) == 1 and chance[0].get_linestyle() == ":"
    assert chance[0].get_ydata()[0] == pytest.approx(0.1)


def test_report_figures_writes_one_curve_per_dataset_and_metric(tmp_path, cli_runner):
    root = _records(tmp_path / "runs")
    res = cli_runner.invoke(cli, ["report", "--results", str(root), "--figures", str(tmp_path / "fig")])
    assert res.exit_code == 0, (res.stderr, res.exception)
    names = {p.name for p in (tmp_path / "fig").iterdir()}
    assert {f"digits-{m}-vs-eps.{ext}" for m in ("gen2real_cnn", "fid") for ext in ("png", "pdf")} <= names


def test_report_figures_reads_records_without_samples(tmp_path, cli_runner):
    """The JSON records committed under benchmarks/ keep no samples: the curve still draws
    them, and the sample grids take the seeds that have samples, not a traceback."""
    root = _records(tmp_path / "runs")
    (root / "dpgan-eps10-s0" / "samples.npz").unlink()  # seed 1 keeps its samples
    for seed in (0, 1):
        (root / f"dpmean-eps1-s{seed}" / "samples.npz").unlink()  # no seed has samples
    res = cli_runner.invoke(cli, ["report", "--results", str(root), "--figures", str(tmp_path / "fig")])
    assert res.exit_code == 0, (res.stderr, res.exception)
    names = {p.name for p in (tmp_path / "fig").iterdir()}
    assert {"digits-gen2real_cnn-vs-eps.png", "digits-eps10-samples.png", "digits-eps1-samples.png"} <= names


def test_lone_noise_off_config_is_still_labelled_and_a_one_eps_floor_spans_the_axis(tmp_path):
    """A method whose only configuration is noise-off has no setting in the tables' label:
    the figure adds it. dpmean at a single ε is a band across every finite ε, naming it."""
    root = tmp_path / "runs"
    for eps in (1.0, 10.0):
        make_record(root, f"dpgan-{eps:g}", "dpgan", "digits", eps, 0, {"gen2real_cnn": 0.5}, rdp=eps, prv=eps)
    make_record(root, "dpmean", "dpmean", "digits", 1.0, 0, {"gen2real_cnn": 0.2}, rdp=1.0, prv=1.0)
    d = make_record(root, "dpaf-off", "dpaf", "digits", 1.0, 0, {"gen2real_cnn": 0.9}, rdp=1.0, prv=1.0)
    priv = json.loads((d / "privacy.json").read_text())
    priv.update(noise_off=True, epsilon={"rdp": "inf", "prv": "inf"})
    (d / "privacy.json").write_text(json.dumps(priv))
    long, _ = T.collect(root)
    assert "dpaf" in set(long["method"])  # the tables' label: nothing to tell it apart from
    plt = F._plt()
    fig, ax = plt.subplots()
    F.draw_metric_vs_eps(ax, T.aggregate(long), "gen2real_cnn")  # classes unknown: no chance line
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["dpgan", "dpaf [noise=off]", "dpmean (floor, ε=1)"]
    band = next(c for c in ax.collections if c.get_label() == "dpmean (floor, ε=1)")
    xs = band.get_paths()[0].vertices[:, 0]
    assert xs.min() < 1 and 10 < xs.max() < ax.get_xticks()[-1]
    plt.close(fig)


def test_a_floor_is_a_class_attribute_so_a_plugin_floor_is_a_band_too(tmp_path):
    """The figures know a floor by ``Method.is_floor`` through the registry, not by name: a
    plugin method with ``is_floor = True`` is a band like dpmean; a method not installed here
    (only its records) is drawn as a line."""
    from dpgen_bench import registry

    class PluginFloor:
        is_floor = True

    registry.methods.register("plugin-floor", PluginFloor, hidden=True)
    try:
        assert F.is_floor("dpmean") and F.is_floor("plugin-floor")
        assert not F.is_floor("dpgan") and not F.is_floor("not-installed-anywhere")
        root = tmp_path / "runs"
        for eps in (1.0, 10.0):
            make_record(root, f"dpgan-{eps:g}", "dpgan", "digits", eps, 0, {"gen2real_cnn": 0.5}, rdp=eps, prv=eps)
            make_record(root, f"pf-{eps:g}", "plugin-floor", "digits", eps, 0, {"gen2real_cnn": 0.3},
                        rdp=eps, prv=eps)
            make_record(root, f"ni-{eps:g}", "not-installed-anywhere", "digits", eps, 0, {"gen2real_cnn": 0.4},
                        rdp=eps, prv=eps)
        long, _ = T.collect(root)
        plt = F._plt()
        fig, ax = plt.subplots()
        F.draw_metric_vs_eps(ax, T.aggregate(long), "gen2real_cnn")
        assert [c.get_label() for c in ax.collections if "floor" in c.get_label()] == ["plugin-floor (floor)"]
        assert {c.get_label() for c in ax.containers} >= {"dpgan", "not-installed-anywhere"}
        plt.close(fig)
    finally:
        registry.methods._items.pop("plugin-floor", None)
        registry.methods._meta.pop("plugin-floor", None)
        registry.methods._hidden.discard("plugin-floor")
