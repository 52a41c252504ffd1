"""User mistakes: one clear line on stderr, exit code 2, no run directory left behind."""

import os

import pytest

from dpgen_bench.cli import cli

CASES = [
    (["run", "--method", "nope", "--eps", "1"], "unknown method 'nope'"),
    (["run", "--method", "dpgn", "--eps", "1"], "did you mean 'dpgan'"),
    (["run", "--method", "dpgan", "--dataset", "digitz", "--eps", "1"], "did you mean 'digits'"),
    (["run", "--method", "dpgan", "--eps", "1", "--preset", "quik"], "did you mean 'quick'"),
    (["run", "--method", "dpgan", "--dataset", "digits", "--eps", "1", "--preset", "paper"], "no settings for dataset"),
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
]


@pytest.mark.parametrize("args,message", CASES, ids=[" ".join(c[0][:5]) for c in CASES])
def test_user_mistake_is_one_line_exit_2(cli_runner, results, args, message):
    import torch

    if "cuda:7" in args and torch.cuda.is_available():
        pytest.skip("machine has CUDA")
    (results.parent / "bad.yaml").write_text("method: [unclosed\n")
    (results.parent / "keys.yaml").write_text("epsilonn: 1\n")
    half = results.parent / "half"  # a data root with half of MNIST's files and a CelebA folder without labels
    (half / "MNIST" / "raw").mkdir(parents=True, exist_ok=True)
    (half / "MNIST" / "raw" / "train-images-idx3-ubyte").write_bytes(b"")
    (half / "celeba" / "img_align_celeba").mkdir(parents=True, exist_ok=True)
    (results.parent / "empty").mkdir(exist_ok=True)
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
