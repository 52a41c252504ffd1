"""User mistakes: one clear line on stderr, exit code 2, no run directory left behind."""

import json
import os

import pytest

from dpgen_bench.cli import cli

CASES = [
    (["run", "--method", "nope", "--eps", "1"], "unknown method 'nope'"),
    (["run", "--method", "dpgn", "--eps", "1"], "did you mean 'dpgan'"),
    (["run", "--method", "dpgan", "--dataset", "digitz", "--eps", "1"], "did you mean 'digits'"),
    (["run", "--method", "dpgan", "--eps", "1", "--preset", "quik"], "did you mean 'quick'"),
    (["run", "--method", "dpgan", "--dataset", "digits", "--eps", "1", "--preset", "paper"], "no settings for dataset"),
    # a dataset without a preset: the presets that apply and --preset defaults are named
    (["run", "--method", "dpgan", "--dataset", "mnist-5k-32", "--eps", "1", "--preset", "paper"],
     "presets of 'dpgan' that do: tiny; --preset defaults runs the method's own defaults on any dataset"),
    # a bad setting names where it came from
    (["run", "--method", "dpgan", "--eps", "1", "--config", "hp.yaml"],
     "--config hp.yaml (hparams): 'dpgan' has no setting 'stepz' (did you mean 'steps'?)"),
    (["run", "--method", "dpgan", "--eps", "1", "--config", "hp-type.yaml"],
     "--config hp-type.yaml (hparams) lr_d: expected a number, got 'fast'"),
    (["run", "--method", "dpgan", "--eps", "1", "--config", "hp-runkey.yaml"],
     "'dpgan' has no setting 'seed' (a run key: put it at the top level of the file)"),
    (["run", "--method", "dpgan", "--eps", "0"], "--eps must be > 0"),
    (["run", "--method", "dpgan", "--eps", "-3"], "--eps must be > 0"),
    (["run", "--method", "dpgan", "--eps", "inf"], "--eps must be finite"),
    (["run", "--method", "dpgan"], "--eps is required"),
    (["run", "--method", "gan", "--eps", "1"], "not private"),
    (["run", "--method", "dpgan", "--eps", "1", "--delta", "1"], "--delta must be in (0, 1)"),
    (["run", "--method", "dpgan", "--eps", "1", "--delta", "0"], "--delta must be in (0, 1)"),
    (["run", "--method", "dpgan", "--eps", "abc"], "is not a valid float"),
    (["run", "--method", "dpgan", "--eps", "1", "--members", "5000"], "--members must be between 1 and 360"),
    (["run", "--method", "dpgan", "--eps", "1", "--members", "0"], "--members must be between"),
    (["run", "--method", "dpgan", "--eps", "1", "--set", "stepz=3"], "did you mean 'steps'"),
    (["run", "--method", "dpgan", "--eps", "1", "--set", "steps=abc"], "expected an integer"),
    (["run", "--method", "dpgan", "--eps", "1", "--set", "steps"], "KEY=VALUE"),
    (["run", "--method", "dpgan", "--eps", "1", "--n-d", "zero"], "--n-d must be"),
    (["run", "--method", "dpgan", "--eps", "1", "--eval", "fidd"], "unknown evaluator 'fidd'"),
    (["run", "--method", "dpgan", "--eps", "1", "--device", "cuda:7"], None),
    (["run", "--method", "dpgan", "--eps", "1", "--config", "missing.yaml"], "cannot read config file"),
    (["run", "--method", "dpgan", "--eps", "1", "--bogus"], "No such option"),
    (["report", "--results", "does/not/exist"], "no results directory"),
    (["list", "things"], "Invalid value"),
    (["run", "--eps", "1"], "--method is required"),
    (["run", "--method", "dpgan", "--eps", "1", "--delta", "2"], "--delta must be in (0, 1)"),
    (["run", "--method", "dpgan", "--eps", "1", "--seed", "abc"], "is not a valid integer"),
    (["run", "--method", "dpgan", "--eps", "1", "--members", "-4"], "--members must be between"),
    (["run", "--method", "dpgan", "--eps", "1", "--set", "n_d=often"], "expected an integer or 'adaptive'"),
    (["run", "--method", "dpgan", "--eps", "1", "--set", "grad_sample_mode=magic"], "is not one of"),
    (["run", "--method", "dpgan", "--eps", "1", "--config", "bad.yaml"], "cannot parse config file"),
    (["run", "--method", "dpgan", "--eps", "1", "--config", "keys.yaml"], "unknown keys ['epsilonn']"),
    (["privacy", "--method", "dpgan"], "--eps is required"),
    (["eval", "no-such-run"], "not a finished run directory"),
    (["sweep", "--method", "dpgan", "--eps", "1", "--jobs", "0"], "--jobs must be ≥ 1"),
    (["sweep", "--eps", "1"], "no method given"),
    (["run", "--resume", "no-such-run"], "not a run directory"),
    (["run", "--method", "dpaf", "--eps", "1", "--set", "layer_config=C9-C1-x"], "layer_config"),
    (["run", "--method", "dpaf", "--eps", "1", "--set", "budget_split=0.1,0.1"], "budget_split"),
    (["run", "--method", "dpaf", "--eps", "0.1", "--set", "budget_split=0.1,x,0.1"], "budget_split"),
    (["run", "--method", "gswgan", "--eps", "1", "--set", "num_discriminators=5000"], "num_discriminators"),
    (["run", "--method", "dpgan", "--dataset", "mnist", "--eps", "1", "--preset", "paper", "--data-root", "half"],
     "train-labels-idx1-ubyte"),
    (["run", "--method", "dpgan", "--dataset", "celeba-gender-32", "--eps", "1", "--preset", "paper",
      "--data-root", "half"], "list_attr_celeba.txt"),
    (["report", "--results", "empty"], "no completed runs"),
    # an ε that no noise reaches names the smallest that works
    (["privacy", "--method", "dpgan", "--eps", "1e-3"],
     "--eps 0.001 is infeasible for dpgan (preset quick, dataset digits, N=1437, δ=1e-05): no noise multiplier is "
     "large enough; the smallest ε that works is 0.00351"),
    (["run", "--method", "dpgan", "--eps", "1e-3", "--dry-run"], "the smallest ε that works is 0.00351"),
    (["privacy", "--method", "gswgan", "--eps", "1e-4"], "the smallest ε that works is 0.00351"),
    (["privacy", "--method", "dpgan", "--dataset", "mnist", "--preset", "paper", "--eps", "1e-3"],
     "noise multiplier 14.0 allows no step at ε=0.001; raise the noise; the smallest ε that works is 0.00371"),
    (["run", "--method", "dpgan", "--eps", "1", "--seed", "99999999999999999999"],
     "--seed must be an integer from 0 to 4294967295, got 99999999999999999999"),
    (["run", "--method", "dpgan", "--eps", "1", "--seed", "-1"], "--seed must be an integer from 0 to 4294967295"),
    (["run", "--method", "dpgan", "--eps", "1", "--out", "afile"], "--out afile exists and is not a directory"),
    (["sweep", "--method", "dpgan", "--eps", "1,abc"], "--eps / grid key 'eps': 'abc' is not a number"),
    (["sweep", "--method", "dpgan", "--eps", "1", "--seeds", "0,x"], "--seeds / grid key 'seeds': 'x' is not an "
                                                                     "integer from 0 to 4294967295"),
    (["sweep", "--method", "dpgan", "--eps", "1", "--members", "8,many"], "'many' is not a whole number"),
    (["sweep", "grid.yaml"], "--seeds / grid key 'seeds': -2 is not an integer"),
    (["run", "--method", "dpgan", "--eps", "1", "--set", "lr_d=nan"],
     "--set lr_d: expected a finite number, got 'nan'"),
    (["run", "--method", "dpgan", "--eps", "1", "--set", "lr_g=inf"], "--set lr_g: expected a finite number"),
    (["run", "--method", "dpgan", "--eps", "1", "--eval", "mia_auc_white_box"], "--eval mia_auc_white_box needs "
                                                                                 "--members N"),
    (["run", "--method", "dummy", "--eps", "1", "--members", "16", "--eval", "mia_auc_white_box"],
     "--eval mia_auc_white_box needs a method with a latent input"),
    (["run", "--resume", "halfrun", "--seed", "3"], "the given settings differ from the run's config in seed"),
    (["run", "--resume", "halfrun", "--seed", "3", "--eps", "1"], "the given settings differ from the run's config in "
                                                                   "seed"),
    (["privacy", "--method", "dummy", "--dataset", "celeba-hair", "--eps", "1", "--data-root", "half"],
     "list_attr_celeba.txt, half/celeba/list_eval_partition.txt; its N (the images with exactly one of"),
    (["report", "--results", "recorded", "--layout", "c"], "layout c shows membership inference, and no run has an "
                                                          "mia_auc_* metric: run with --members N"),
    (["report", "--results", "recorded", "--layout", "b", "--dataset", "mnist"], "layout b: no completed run on mnist"),
    (["report", "--results", "recorded", "--out", "/proc/dpgen-cannot-write/table.md"],
     "--out /proc/dpgen-cannot-write/table.md: cannot write into /proc/dpgen-cannot-write"),
    (["report", "--results", "recorded", "--out", "recorded"], "--out recorded is a directory"),
    (["report", "--results", "recorded", "--figures", "/proc/dpgen-cannot-write/figs"],
     "--figures /proc/dpgen-cannot-write/figs: cannot write into"),
    (["report", "--results", "afile"], "no results directory at afile"),
    (["eval", "finished", "--eval", "mia_auc_full_black_box"], "--eval mia_auc_full_black_box needs --members N"),
    (["eval", "eval-is-a-folder"], "cannot read eval-is-a-folder/eval.json"),
    (["eval", "eval-is-a-list"], "eval-is-a-list/eval.json is not an evaluation record"),
    (["eval", "eval-truncated"], "eval-truncated/eval.json is not valid JSON"),
]


@pytest.mark.parametrize("args,message", CASES, ids=[" ".join(c[0][:5]) for c in CASES])
def test_user_mistake_is_one_line_exit_2(cli_runner, results, args, message):
    import torch

    if "cuda:7" in args and torch.cuda.is_available():
        pytest.skip("machine has CUDA")
    (results.parent / "bad.yaml").write_text("method: [unclosed\n")
    (results.parent / "keys.yaml").write_text("epsilonn: 1\n")
    (results.parent / "hp.yaml").write_text("hparams:\n  stepz: 3\n")
    (results.parent / "hp-type.yaml").write_text("hparams:\n  lr_d: fast\n")
    (results.parent / "hp-runkey.yaml").write_text("hparams:\n  seed: 3\n")
    half = results.parent / "half"  # a data root with half of MNIST's files and a CelebA folder without labels
    (half / "MNIST" / "raw").mkdir(parents=True, exist_ok=True)
    (half / "MNIST" / "raw" / "train-images-idx3-ubyte").write_bytes(b"")
    (half / "celeba" / "img_align_celeba").mkdir(parents=True, exist_ok=True)
    (results.parent / "empty").mkdir(exist_ok=True)
    _user_files(results.parent)
    extra = ["--preset", "tiny"] if args[0] == "run" and "--preset" not in args and "--resume" not in args else []
    res = cli_runner.invoke(cli, args + extra)
    assert res.exit_code == 2, (res.output, res.stderr, res.exception)
    lines = [x for x in res.stderr.splitlines() if x.strip() and not x.startswith("[bench]")]
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("error: ")
    if message:
        assert message in lines[0]
    assert "Traceback" not in res.stderr
    assert not results.exists() or not any(results.iterdir())


def _user_files(home):
    """What the cases above point at: a plain file, an interrupted run, finished runs with
    a good, missing or damaged eval.json, a results root with one record, a grid file."""
    from dpgen_bench.config import build_config
    from report_fixtures import make_record

    (home / "afile").write_text("not a directory")
    (home / "grid.yaml").write_text("method: dpgan\neps: [1]\nseeds: [0, -2]\n")
    config = {"run_id": "r", **build_config("dummy", "digits", epsilon=1.0, preset="tiny", seed=5,
                                            evaluators="gen2real_mlp").to_json()}
    for name, eval_json in (("halfrun", None), ("finished", "{}"), ("eval-is-a-folder", None),
                            ("eval-is-a-list", "[1, 2]"), ("eval-truncated", '{"metrics": {')):
        run = home / name
        run.mkdir(exist_ok=True)
        (run / "config.json").write_text(json.dumps(config))
        if name != "halfrun":
            (run / "checkpoint.pt").write_bytes(b"not a checkpoint")
        if eval_json is not None:
            (run / "eval.json").write_text(eval_json)
    (home / "eval-is-a-folder" / "eval.json").mkdir(exist_ok=True)
    if not (home / "recorded").exists():
        make_record(home / "recorded", "dpgan-digits", "dpgan", "digits", 1.0, 0, {"gen2real_cnn": 0.5}, rdp=0.99,
                    prv=0.9)


def test_unwritable_out(cli_runner, results, tmp_path):
    if os.geteuid() == 0:
        target = "/proc/dpgen-cannot-write/run"  # root can write anywhere else
    else:
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        target = str(ro / "run")
    res = cli_runner.invoke(cli, ["run", "--method", "dpgan", "--eps", "1", "--preset", "tiny", "--out", target])
    assert res.exit_code == 2
    assert "cannot write the run directory" in res.stderr
    assert not os.path.exists(target)


def test_out_not_empty(cli_runner, results, tmp_path):
    out = tmp_path / "full"
    out.mkdir()
    (out / "x").write_text("x")
    res = cli_runner.invoke(cli, ["run", "--method", "dpgan", "--eps", "1", "--preset", "tiny", "--out", str(out)])
    assert res.exit_code == 2 and "not empty" in res.stderr


def _one_error_line(res) -> str:
    assert res.exit_code == 2, (res.output, res.stderr, res.exception)
    lines = [x for x in res.stderr.splitlines() if x.strip() and not x.startswith("[bench]")]
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    return lines[0]


def test_unreadable_results_directory(cli_runner, tmp_path, monkeypatch):
    from pathlib import Path

    from report_fixtures import make_record

    root = tmp_path / "locked"
    make_record(root, "r", "dpgan", "digits", 1.0, 0, {"gen2real_cnn": 0.5}, rdp=0.99, prv=0.9)
    if os.geteuid() == 0:  # root lists anything: the listing fails as it would for another user
        listing = Path.iterdir

        def iterdir(self):
            if self == root:
                raise PermissionError(13, "Permission denied", str(self))
            return listing(self)

        monkeypatch.setattr(Path, "iterdir", iterdir)
    else:
        root.chmod(0)
    try:
        line = _one_error_line(cli_runner.invoke(cli, ["report", "--results", str(root)]))
    finally:
        root.chmod(0o700)
    assert line == f"error: cannot read the results directory {root}: Permission denied"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories (the /proc cases cover it)")
def test_report_into_a_read_only_directory(cli_runner, tmp_path):
    from report_fixtures import make_record

    root = tmp_path / "runs"
    make_record(root, "r", "dpgan", "digits", 1.0, 0, {"gen2real_cnn": 0.5}, rdp=0.99, prv=0.9)
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    for flag, target in (("--out", ro / "t.md"), ("--figures", ro / "figs")):
        line = _one_error_line(cli_runner.invoke(cli, ["report", "--results", str(root), flag, str(target)]))
        assert "cannot write into" in line and "Permission denied" in line
    assert list(ro.iterdir()) == []


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_eval_of_a_read_only_run_is_refused_before_evaluating(cli_runner, tmp_path):
    from dpgen_bench.config import build_config

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps(build_config("dummy", "digits", epsilon=1.0, preset="tiny").to_json()))
    (run / "checkpoint.pt").write_bytes(b"not a checkpoint")  # never read: the refusal comes first
    run.chmod(0o500)
    try:
        line = _one_error_line(cli_runner.invoke(cli, ["eval", str(run)]))
    finally:
        run.chmod(0o700)
    assert line.startswith(f"error: cannot write {run / 'eval.json'}")


def test_a_batch_as_large_as_the_data_is_one_warning(cli_runner, results):
    res = cli_runner.invoke(cli, ["privacy", "--method", "dpgan", "--preset", "tiny", "--eps", "1", "--set",
                                  "batch_size=100000"])
    assert res.exit_code == 0, (res.stderr, res.exception)
    warnings = [x for x in res.stderr.splitlines() if x.strip()]
    assert warnings == ["[bench] batch_size=100000 ≥ N=1437 training images: part 'discriminator' samples at rate 1 "
                        "(the whole training set every step, no amplification by subsampling)"]
    assert "| discriminator | subsampled_gaussian | " in res.stdout and "| 1.00000 |" in res.stdout
    quiet = cli_runner.invoke(cli, ["privacy", "--method", "dpgan", "--preset", "tiny", "--eps", "1"])
    assert quiet.exit_code == 0 and quiet.stderr.strip() == ""
