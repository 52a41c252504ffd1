"""--eval-split val: settings are chosen on a validation part of the training split, never
on the real test split; the record says which split was used and the report never puts
val and test runs in one cell."""

import json

import numpy as np
import torch

from dpgen_bench.api import VAL_FRACTION
from dpgen_bench.cli import cli
from dpgen_bench.data.digits import load_digits_data
from dpgen_bench.report import table as T


def test_validation_part_is_stratified_fixed_and_disjoint():
    data = load_digits_data()
    val = data.with_validation()
    assert val.eval_split == "val" and len(val.test) + len(val.train) == len(data.train)
    assert abs(len(val.test) - VAL_FRACTION * len(data.train)) <= 1
    # stratified: each class keeps its share of the training split (±1 image)
    full = torch.bincount(data.train.labels, minlength=10).double()
    held = torch.bincount(val.test.labels, minlength=10).double()
    assert torch.all((held - full * VAL_FRACTION).abs() <= 1)
    # disjoint, drawn from the training split only (the real test split is gone)
    rows = lambda s: {r.tobytes() for r in s.images.reshape(len(s), -1).numpy()}  # noqa: E731
    assert not rows(val.train) & rows(val.test)
    assert rows(val.test) <= rows(data.train) and not rows(val.test) & (rows(data.test) - rows(data.train))
    # fixed: the same part for every run (not the run's seed)
    assert torch.equal(data.with_validation().test.images, val.test.images)


def _run(cli_runner, *args):
    res = cli_runner.invoke(cli, list(args))
    assert res.exit_code == 0, (res.output, res.stderr, res.exception)
    return res


def _sized_mlp(monkeypatch):
    """The MLP classifier replaced by one that records the sizes it was given: these tests are
    about which split each evaluator reads and records, not the classifier (tests/unit/
    test_transfer.py trains the real one); sklearn's MLP on digits' 1,221 rows cost ~5 s a call."""
    from evaluators import transfer

    seen = []

    def sized(x_train, y_train, x_test, y_test, *, seed):
        seen.append((len(x_train), len(x_test)))
        return 0.5, {"classifier": "mlp (stand-in)"}

    monkeypatch.setattr(transfer, "mlp_accuracy", sized)
    return seen


def test_val_run_records_its_split_and_report_keeps_it_apart(cli_runner, results, monkeypatch):
    seen = _sized_mlp(monkeypatch)
    common = ["run", "-m", "dpgan", "--preset", "tiny", "--eps", "5", "--eval", "gen2real_mlp,real2gen_mlp",
              "--set", "steps=10"]
    _run(cli_runner, *common, "--eval-split", "val", "--out", str(results / "val"))
    _run(cli_runner, *common, "--out", str(results / "test"))
    val = json.loads((results / "val" / "eval.json").read_text())["protocol"]
    test = json.loads((results / "test" / "eval.json").read_text())["protocol"]
    assert json.loads((results / "val" / "config.json").read_text())["eval_split"] == "val"
    assert val["gen2real_mlp"]["test_on"] == "real val (216)" and val["gen2real_mlp"]["eval_split"] == "val"
    assert val["real2gen_mlp"]["train_on"] == "real train minus val (1221)"
    assert test["gen2real_mlp"]["test_on"] == "real test (360)" and test["gen2real_mlp"]["eval_split"] == "test"
    # what the classifiers were given (val run, then test run; gen2real then real2gen)
    assert seen == [(100, 216), (1221, 100), (100, 360), (1437, 100)], seen
    # the sample rate is computed on the training split the run really used
    q_val = json.loads((results / "val" / "privacy.json").read_text())["parts"][0]["sample_rate"]
    q_test = json.loads((results / "test" / "privacy.json").read_text())["parts"][0]["sample_rate"]
    assert q_val > q_test
    long, _ = T.collect(results)
    methods = set(T.aggregate(long)["method"])
    assert methods == {"dpgan [eval_split=test]", "dpgan [eval_split=val]"}, methods
    # a report of the val run alone still says so
    long_val = long[long["variant"].str.contains('"eval_split": "val"')]
    assert set(T.aggregate(long_val)["method"]) == {"dpgan [eval_split=val]"}


def test_bench_eval_of_a_val_run_evaluates_on_val(cli_runner, results, monkeypatch):
    seen = _sized_mlp(monkeypatch)
    _run(cli_runner, "run", "-m", "gan", "--preset", "tiny", "--eval", "gen2real_mlp", "--eval-split", "val",
         "--set", "steps=5", "--out", str(results / "g"))
    _run(cli_runner, "eval", str(results / "g"), "--eval", "real2gen_mlp")
    proto = json.loads((results / "g" / "eval.json").read_text())["protocol"]
    assert proto["real2gen_mlp"]["eval_split"] == "val" and proto["real2gen_mlp"]["per_class"] == [10] * 10
    assert seen == [(100, 216), (1221, 100)], seen  # the run's gen2real, then bench eval's real2gen on val
    samples = np.load(results / "g" / "samples.npz")
    assert len(samples["labels"]) == 100


def test_privacy_plan_uses_the_smaller_training_split(cli_runner):
    res = _run(cli_runner, "privacy", "-m", "dpgan", "--eps", "1", "--eval-split", "val")
    assert "(N=1221)" in res.output
