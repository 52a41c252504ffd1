"""bench sweep: grid expansion, skipping completed cells, re-running failed ones."""

import json

import pytest

from dpgen_bench.cli import cli
from dpgen_bench.sweep import expand


def test_expand_runs_non_private_methods_once_per_seed():
    cells = expand({"method": "dummy,gan", "eps": "1,10", "seeds": "0,1", "preset": "tiny"})
    names = sorted(c.config.method for c in cells)
    assert names.count("dummy") == 4 and names.count("gan") == 2
    assert len({c.run_name for c in cells}) == 6


def test_sweep_runs_only_missing_cells(cli_runner, results, tmp_path):
    args = ["sweep", "--method", "dummy", "--eps", "1,10", "--seeds", "0", "--preset", "tiny"]
    # a pre-existing complete record for one cell
    res = cli_runner.invoke(cli, ["sweep", "--method", "dummy", "--eps", "1", "--seeds", "0", "--preset", "tiny",
                                  "--no-report"])
    assert res.exit_code == 0, (res.stderr, res.exception)
    (done,) = list(results.iterdir())
    stamp = (done / "eval.json").stat().st_mtime_ns
    # a crashed cell: directory without eval.json
    grid = expand({"method": "dummy", "eps": "10", "seeds": "0", "preset": "tiny"})
    crashed = results / grid[0].run_name
    crashed.mkdir()
    (crashed / "config.json").write_text("{}")
    res = cli_runner.invoke(cli, args)
    assert res.exit_code == 0, (res.stderr, res.exception)
    assert "1 already complete, 2 to run" not in res.stderr
    assert "2 cells, 1 already complete, 1 to run (1 interrupted: 0 resumed from a checkpoint)" in res.stderr
    assert (done / "eval.json").stat().st_mtime_ns == stamp  # never rewritten
    assert (crashed / "eval.json").is_file()
    assert any(p.name.startswith(".failed-") for p in results.iterdir())
    assert res.stderr.count("done dummy digits") == 1
    assert "| 10 | dummy |" in res.stdout and "| 1 | dummy |" in res.stdout
    # everything done: nothing runs
    res = cli_runner.invoke(cli, args)
    assert "2 already complete, 0 to run" in res.stderr


def test_sweep_grid_file(cli_runner, results, tmp_path):
    grid = tmp_path / "grid.yaml"
    grid.write_text("method: [dummy]\neps: [2]\nseeds: [0, 1]\npreset: tiny\nset: {steps: 3}\n")
    res = cli_runner.invoke(cli, ["sweep", str(grid), "--no-report"])
    assert res.exit_code == 0, (res.stderr, res.exception)
    dirs = [p for p in results.iterdir() if p.is_dir()]
    assert len(dirs) == 2
    cfg = json.loads((dirs[0] / "config.json").read_text())
    assert cfg["hparams"]["steps"] == 3
    bad = tmp_path / "bad.yaml"
    bad.write_text("methods: [dummy]\n")
    res = cli_runner.invoke(cli, ["sweep", str(bad)])
    assert res.exit_code == 2 and "unknown keys ['methods']" in res.stderr


def test_a_sweep_on_two_worker_processes_writes_what_one_process_writes(cli_runner, results):
    """``--jobs 2``: the cells run in a pool of spawned worker processes (``make demo``'s way);
    each record is complete and its numbers are those of the same cell run in this process."""
    args = ["sweep", "--method", "dpmean,gan", "--eps", "10", "--seeds", "0", "--preset", "tiny",
            "--eval", "gen2real_mlp", "--no-report"]
    res = cli_runner.invoke(cli, [*args, "--jobs", "2"])
    assert res.exit_code == 0, (res.stderr, res.exception)
    assert res.stderr.count("done ") == 2, res.stderr
    pooled = {p.name: json.loads((p / "eval.json").read_text())["metrics"] for p in results.iterdir()}
    assert len(pooled) == 2
    here = results.parent / "here"
    res = cli_runner.invoke(cli, [*args, "--results", str(here)])
    assert res.exit_code == 0, (res.stderr, res.exception)
    assert {p.name: json.loads((p / "eval.json").read_text())["metrics"] for p in here.iterdir()} == pooled


def test_a_parallel_sweep_of_a_plugin_given_to_this_process_only_stops_in_one_line(cli_runner, results, monkeypatch):
    """`make demo`'s test once swapped a dataset in place and ran `--jobs 2`: the workers,
    fresh processes, loaded the real one. Now such a sweep stops before running anything."""
    from dpgen_bench import registry

    digits = registry.datasets.get("digits")
    monkeypatch.setitem(registry.datasets._items, "digits", lambda **kw: digits(**kw))
    args = ["sweep", "--method", "dpmean", "--eps", "10", "--preset", "tiny", "--eval", "gen2real_mlp", "--no-report"]
    res = cli_runner.invoke(cli, [*args, "--jobs", "2"])
    assert res.exit_code == 2 and res.stderr.strip().startswith(
        "error: dataset 'digits' was registered in this process only; --jobs 2 runs cells in new processes"), res.stderr
    assert not results.exists() or not any(results.iterdir())
    res = cli_runner.invoke(cli, [*args, "--jobs", "1"])  # in this process: it runs
    assert res.exit_code == 0, (res.stderr, res.exception)


# The default suite's one Ray test (about 30 s alone); the two-node cluster test with its killed and
# resumed cell (test_ray_cluster.py, about 85 s of a worker with its `ray start` daemons) is slow
@pytest.mark.xdist_group("ray")  # with the two-node test: `ray stop` there ends every Ray process
def test_sweep_on_local_ray(cli_runner, results, ray_exclusive):
    ray = pytest.importorskip("ray")
    # "local": a fresh instance even where a `ray start` cluster is still winding down
    ray.init(address="local", num_cpus=2, include_dashboard=False, ignore_reinit_error=True)
    try:
        # one cell (46 s with two, the default suite's slowest test; the two-node test runs several)
        res = cli_runner.invoke(cli, ["sweep", "--method", "dpgan", "--eps", "10", "--seeds", "0",
                                      "--preset", "tiny", "--eval", "gen2real_mlp", "--engine", "ray", "--address", "auto"])
    finally:
        ray.shutdown()
    assert res.exit_code == 0, (res.stderr, res.exception)
    assert len([p for p in results.iterdir() if p.is_dir()]) == 1
    assert "| 10 | dpgan |" in res.stdout


def test_shared_preparations_one_per_dataset_seed_when_cells_share_it():
    """The real2gen CNN depends on the data and seed only: a sweep prepares it once per
    (dataset, split, seed, device) in a worker of its own, and only where cells share it."""
    from dpgen_bench.sweep import shared_preparations

    cells = expand({"method": "dummy,dpmean", "eps": "1,10", "seeds": "0,1", "preset": "tiny",
                    "eval": "gen2real_cnn,real2gen_cnn"})
    preps = shared_preparations(cells)
    assert sorted(c.seed for c in preps) == [0, 1]
    assert all(c.evaluators == ("real2gen_cnn",) and c.dataset == "digits" for c in preps)
    assert shared_preparations(expand({"method": "dummy,dpmean", "eps": "1", "preset": "tiny",
                                       "eval": "gen2real_cnn"})) == []  # nothing to prepare
    assert shared_preparations(expand({"method": "dummy", "eps": "1", "preset": "tiny",
                                       "eval": "real2gen_cnn"})) == []  # one cell: no task of its own


def test_prepared_real_cnn_is_the_one_the_cell_loads(monkeypatch, tmp_path, results):
    from dpgen_bench.runner import run
    from dpgen_bench.sweep import prepare_cell

    monkeypatch.setenv("DPGEN_CACHE", str(tmp_path / "cache"))
    cfg = expand({"method": "dummy", "eps": "1", "preset": "tiny", "eval": "real2gen_cnn"})[0].config
    first = prepare_cell(cfg.to_json())["prepared"]["real2gen_cnn"]
    assert first["classifier_cache"] == "built"
    assert prepare_cell(cfg.to_json())["prepared"]["real2gen_cnn"] == {**first, "classifier_cache": "hit"}
    out = run(cfg, out=str(tmp_path / "run"))
    proto = json.loads((tmp_path / "run" / "eval.json").read_text())["protocol"]["real2gen_cnn"]
    assert proto["classifier_cache"] == "hit" and proto["classifier_key"] == first["classifier_key"]
    assert "real2gen_cnn" in out["metrics"]


def test_a_parallel_sweep_starts_its_longest_cells_first(monkeypatch, tmp_path):
    """Longest-processing-time order from the measured seconds (dpgen_bench/preset_seconds.json): with two workers the
    last cell to start is a short one (make demo: gan's 94 s first, dpmean's 13 s last);
    unknown lengths start first, ties keep the grid's order; a one-job sweep keeps it."""
    import concurrent.futures as cf

    from dpgen_bench import sweep

    cells = expand({"method": "all", "dataset": "mnist-5k", "eps": 10, "preset": "quick"})
    ordered = sweep.longest_first(cells)
    seconds = [sweep.expected_seconds(c) for c in ordered]
    assert seconds == sorted(seconds, reverse=True) and all(s < float("inf") for s in seconds)
    assert ordered[0].config.method == "gan" and ordered[-1].config.method == "dpmean"
    unknown = expand({"method": "dummy", "eps": "1,10", "seeds": "0,1", "preset": "tiny"})
    assert sweep.longest_first(unknown) == unknown

    submitted = []

    class InlinePool:  # records what run_sweep submits, in order; runs nothing
        def __init__(self, *a, **k):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def submit(self, fn, config_json, *args):
            submitted.append(config_json["method"])
            fut = cf.Future()
            fut.set_result({"seconds": 0.0, "metrics": {}, "epsilon": 1.0, "run_dir": ""})
            return fut

    monkeypatch.setattr(cf, "ProcessPoolExecutor", InlinePool)
    few = expand({"method": "dpmean,gan,dpgan", "dataset": "mnist-5k", "eps": 10, "preset": "quick",
                  "eval": "gen2real_cnn"})
    sweep.run_sweep(few, tmp_path / "runs", jobs=2)
    assert submitted == ["gan", "dpgan", "dpmean"]


def test_built_in_seconds_come_from_the_data_file_and_a_plugin_keeps_its_own():
    """The built-ins' measured seconds live in dpgen_bench/preset_seconds.json (no method
    class carries them); a plugin method's own ``preset_seconds`` class attribute is used."""
    from dpgen_bench import registry, sweep

    table = sweep.measured_seconds()
    assert set(table) <= set(registry.methods.names()) and "dpmean" in table
    for name in table:
        assert not registry.methods.get(name).preset_seconds, name  # the file is the one place
        assert sweep.preset_seconds(name) == table[name]
    cell = expand({"method": "dpmean", "dataset": "mnist-5k", "eps": 10, "preset": "quick"})[0]
    assert sweep.expected_seconds(cell) == table["dpmean"]["quick"]["mnist-5k"]

    plugin = type("TimedPlugin", (registry.methods.get("dummy"),), {"preset_seconds": {"tiny": {"digits": 7}}})
    registry.methods.register("timed-plugin", plugin, hidden=True)
    try:
        assert sweep.preset_seconds("timed-plugin") == {"tiny": {"digits": 7}}
        cell = expand({"method": "timed-plugin", "eps": 1, "preset": "tiny"})[0]
        assert sweep.expected_seconds(cell) == 7.0
    finally:
        registry.methods._items.pop("timed-plugin", None)
        registry.methods._meta.pop("timed-plugin", None)
        registry.methods._hidden.discard("timed-plugin")
