"""Real-dataset loaders (MNIST, Fashion-MNIST, CelebA, FFHQ) on tiny generated fakes of
their on-disk layouts: shapes, ranges, splits, labels, the cache and the one-line errors."""

from __future__ import annotations

import gzip
import json
import logging
import os
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from dpgen_bench import registry
from dpgen_bench.data import celeba, ffhq, files, load_dataset, mnist
from dpgen_bench.errors import UserError
from fake_data import write_idx

REGISTRY_LINES = {  # built-ins (dpgen_bench/registry.py); the tests use them, never re-register them
    "mnist": "dpgen_bench.data.mnist:load_mnist",
    "mnist-32": "dpgen_bench.data.mnist:load_mnist_32",
    "fashion-mnist": "dpgen_bench.data.mnist:load_fashion_mnist",
    "fashion-mnist-32": "dpgen_bench.data.mnist:load_fashion_mnist_32",
    "celeba-gender": "dpgen_bench.data.celeba:load_celeba_gender",
    "celeba-gender-32": "dpgen_bench.data.celeba:load_celeba_gender_32",
    "celeba-hair": "dpgen_bench.data.celeba:load_celeba_hair",
    "celeba-hair-32": "dpgen_bench.data.celeba:load_celeba_hair_32",
    "ffhq-gender": "dpgen_bench.data.ffhq:load_ffhq_gender",
    "ffhq-gender-64": "dpgen_bench.data.ffhq:load_ffhq_gender_64",
}


@pytest.fixture(autouse=True)
def dataset_cache(monkeypatch, tmp_path_factory) -> Path:
    """An empty ``$DPGEN_CACHE`` of the test's own (no ``$DPGEN_DATA`` or memory override);
    returns where the dataset cache files go: ``$DPGEN_CACHE/datasets``."""
    cache = tmp_path_factory.mktemp("cache")
    monkeypatch.setenv("DPGEN_CACHE", str(cache))
    monkeypatch.delenv("DPGEN_DATA", raising=False)
    monkeypatch.delenv("DPGEN_DATA_IN_MEMORY_GB", raising=False)
    return cache / "datasets"


class OpenCounter:
    """Counts PIL image opens (= decodes) in this process."""

    def __init__(self, monkeypatch):
        self.n = 0
        real = Image.open

        def counting(*a, **kw):
            self.n += 1
            return real(*a, **kw)

        monkeypatch.setattr(Image, "open", counting)


# ------------------------------------------------------------------------- fakes


def make_mnist(root: Path, folder: str = "MNIST", n_train: int = 30, n_test: int = 12, gz: bool = False,
               seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    raw = root / folder / "raw"
    out = {}
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
        labels = (np.arange(n) % 10).astype(np.uint8)
        write_idx(raw / f"{prefix}-images-idx3-ubyte", images, gz)
        write_idx(raw / f"{prefix}-labels-idx1-ubyte", labels, gz)
        out[prefix] = images
        out[prefix + "_labels"] = labels
    return out


def celeba_attr_rows(n: int) -> np.ndarray:
    """±1 attributes; Male alternates, hair cycles through: black, blond, brown, none, black+brown."""
    values = -np.ones((n, len(celeba.ATTRIBUTES)), dtype=np.int8)
    col = {a: i for i, a in enumerate(celeba.ATTRIBUTES)}
    for i in range(n):
        values[i, col["Male"]] = 1 if i % 2 else -1
        kind = i % 5
        if kind == 0:
            values[i, col["Black_Hair"]] = 1
        elif kind == 1:
            values[i, col["Blond_Hair"]] = 1
        elif kind == 2:
            values[i, col["Brown_Hair"]] = 1
        elif kind == 4:
            values[i, col["Black_Hair"]] = values[i, col["Brown_Hair"]] = 1
    return values


def make_celeba(root: Path, n: int = 30, seed: int = 0) -> dict:
    """n 178x218 JPEGs in torchvision's layout; partition by i%10: 6 -> 1 (valid), 7 and 9 -> 2 (test), else 0.
    Each image: rows 0..19 and 198..217 red (cropped away), the 178x178 centre one grey level."""
    base = root / "celeba"
    img_dir = base / "img_align_celeba"
    img_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    names = [f"{i + 1:06d}.jpg" for i in range(n)]
    levels = rng.integers(30, 220, size=n)
    for name, level in zip(names, levels):
        a = np.full((218, 178, 3), level, dtype=np.uint8)
        a[:20] = (255, 0, 0)
        a[198:] = (255, 0, 0)
        Image.fromarray(a).save(img_dir / name, quality=100, subsampling=0)
    values = celeba_attr_rows(n)
    lines = [f"{n}", " ".join(celeba.ATTRIBUTES) + " "]
    for name, row in zip(names, values):
        lines.append(name + " " + " ".join(f"{v:2d}" for v in row))  # torchvision: '000001.jpg -1  1  1 ...'
    (base / "list_attr_celeba.txt").write_text("\n".join(lines) + "\n")
    part = [0, 0, 0, 0, 0, 0, 1, 2, 0, 2]
    (base / "list_eval_partition.txt").write_text("".join(f"{nm} {part[i % 10]}\n" for i, nm in enumerate(names)))
    return {"names": names, "levels": levels, "values": values, "partition": np.array([part[i % 10] for i in range(n)])}


def make_ffhq(root: Path, n: int = 20, fmt: str = "csv", size: int = 96, seed: int = 0,
              subdirs: bool = False) -> dict:
    base = root / "ffhq"
    img_dir = base / "images"
    rng = np.random.default_rng(seed)
    names, genders = [], []
    for i in range(n):
        rel = f"{i // 10 * 1000:05d}/{i:05d}.png" if subdirs else f"{i:05d}.png"
        (img_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, size=(size, size, 3), dtype=np.uint8)).save(img_dir / rel)
        names.append(rel.rsplit("/", 1)[-1])
        genders.append(i % 3 == 0)
    if fmt == "csv":
        rows = [f"{nm},{'male' if g else 'female'}" for nm, g in zip(names, genders)]
        (base / "gender.csv").write_text("file,gender\n" + "\n".join(rows) + "\n")
    else:
        (base / "gender.json").write_text(json.dumps({nm: int(g) for nm, g in zip(names, genders)}))
    return {"names": names, "genders": np.array(genders, dtype=np.int64)}


def check_images(data, shape, n_train, n_test):
    for split, n in ((data.train, n_train), (data.test, n_test)):
        assert split.images.dtype == torch.float32 and split.labels.dtype == torch.int64
        assert tuple(split.images.shape) == (n, *shape)
        assert split.images.min() >= -1 and split.images.max() <= 1
    assert data.image_shape == shape


# ------------------------------------------------------------------------- roots


def test_data_root_precedence(monkeypatch, tmp_path):
    assert files.data_root(tmp_path / "a") == tmp_path / "a"
    monkeypatch.setenv("DPGEN_DATA", str(tmp_path / "env"))
    assert files.data_root(None) == tmp_path / "env"
    assert files.data_root(tmp_path / "a") == tmp_path / "a"
    monkeypatch.delenv("DPGEN_DATA")
    assert files.data_root(None) == Path.home() / ".cache" / "dpgen_bench" / "data"
    assert "DPGEN_DATA" in files.DATA_ROOT_HELP and "\n" not in files.DATA_ROOT_HELP


def test_real_datasets_are_built_in():
    for name, ref in REGISTRY_LINES.items():
        loader = registry.datasets.get(name)
        assert f"{loader.__module__}:{loader.__name__}" == ref, name


# ------------------------------------------------------------------------- MNIST


def test_mnist_shapes_values_and_registry(tmp_path, dataset_cache):
    src = make_mnist(tmp_path)
    data = load_dataset("mnist", root=str(tmp_path))
    check_images(data, (1, 28, 28), 30, 12)
    assert data.class_names == tuple("0123456789")
    expected = torch.as_tensor(src["train"], dtype=torch.float32) / 127.5 - 1
    torch.testing.assert_close(data.train.images[:, 0], expected)
    assert data.train.labels.tolist() == src["train_labels"].tolist()
    assert data.test.labels.tolist() == src["t10k_labels"].tolist()
    assert len(list(dataset_cache.glob("mnist-u8-28px-*.npy"))) == 2  # train and test

    d32 = load_dataset("mnist-32", root=str(tmp_path))
    check_images(d32, (1, 32, 32), 30, 12)
    torch.testing.assert_close(d32.train.images[:, :, 2:30, 2:30], data.train.images)
    border = torch.ones(32, 32, dtype=torch.bool)
    border[2:30, 2:30] = False
    assert (d32.train.images[:, 0][:, border] == -1).all()
    assert "zero-padded" in d32.description


def test_fashion_mnist_gz_and_env_root(tmp_path, monkeypatch):
    src = make_mnist(tmp_path, "FashionMNIST", n_train=20, n_test=10, gz=True, seed=1)
    monkeypatch.setenv("DPGEN_DATA", str(tmp_path))
    data = load_dataset("fashion-mnist")
    check_images(data, (1, 28, 28), 20, 10)
    assert data.class_names[0] == "T-shirt/top" and len(data.class_names) == 10
    torch.testing.assert_close(data.test.images[:, 0], torch.as_tensor(src["t10k"], dtype=torch.float32) / 127.5 - 1)
    check_images(load_dataset("fashion-mnist-32"), (1, 32, 32), 20, 10)


def test_mnist_missing_files_one_line(tmp_path):
    with pytest.raises(UserError) as e:
        load_dataset("fashion-mnist", root=str(tmp_path))
    msg = str(e.value)
    assert "\n" not in msg
    assert str(tmp_path / "FashionMNIST" / "raw" / "train-images-idx3-ubyte") in msg
    assert "t10k-labels-idx1-ubyte" in msg and "DPGEN_DATA" in msg
    make_mnist(tmp_path)  # one local MNIST file missing: an error, not the embedded copy
    (tmp_path / "MNIST" / "raw" / "t10k-labels-idx1-ubyte").unlink()
    with pytest.raises(UserError, match="missing .*t10k-labels-idx1-ubyte"):
        load_dataset("mnist", root=str(tmp_path))


def test_mnist_malformed_idx(tmp_path):
    make_mnist(tmp_path)
    raw = tmp_path / "MNIST" / "raw"
    (raw / "train-labels-idx1-ubyte").write_bytes(b"\x12\x34\x08\x01" + b"\x00" * 8)
    with pytest.raises(UserError, match="train-labels-idx1-ubyte is malformed .*magic"):
        load_dataset("mnist", root=str(tmp_path))
    make_mnist(tmp_path)
    data = (raw / "t10k-images-idx3-ubyte").read_bytes()
    (raw / "t10k-images-idx3-ubyte").write_bytes(data[:-100])
    with pytest.raises(UserError, match="t10k-images-idx3-ubyte is malformed"):
        load_dataset("mnist", root=str(tmp_path))


# ------------------------------------------------------------------------ CelebA


@pytest.fixture
def celeba_root(tmp_path):
    return tmp_path, make_celeba(tmp_path)


def test_celeba_gender_split_crop_labels(celeba_root, monkeypatch):
    root, src = celeba_root
    opens = OpenCounter(monkeypatch)
    data = load_dataset("celeba-gender", root=str(root), workers=1)
    part = src["partition"]
    n_train, n_test = int((part <= 1).sum()), int((part == 2).sum())
    check_images(data, (3, 64, 64), n_train, n_test)
    assert opens.n == len(src["names"])
    assert data.class_names == ("female", "male")
    male = src["values"][:, celeba.ATTRIBUTES.index("Male")] == 1
    assert data.train.labels.tolist() == male[part <= 1].astype(int).tolist()
    assert data.test.labels.tolist() == male[part == 2].astype(int).tolist()
    # the red bands (rows 0..19, 198..217) are cropped away: every pixel is the grey level
    levels = torch.as_tensor(src["levels"][part <= 1], dtype=torch.float32) / 127.5 - 1
    err = (data.train.images - levels[:, None, None, None]).abs()
    assert err.max() < 0.02, err.max()
    assert "partitions 0+1 (train+valid)" in data.description
    d32 = load_dataset("celeba-gender-32", root=str(root), workers=1)
    check_images(d32, (3, 32, 32), n_train, n_test)


def test_celeba_cache_second_load_decodes_nothing(celeba_root, monkeypatch, dataset_cache):
    root, src = celeba_root
    first = load_dataset("celeba-gender", root=str(root), workers=1)
    assert files.dataset_info("celeba-gender")["cache_hit"] is False
    opens = OpenCounter(monkeypatch)
    second = load_dataset("celeba-gender", root=str(root), workers=1)
    hair = load_dataset("celeba-hair", root=str(root), workers=1)  # shares the uint8 cache
    assert opens.n == 0
    assert files.dataset_info("celeba-gender")["cache_hit"] is True
    torch.testing.assert_close(first.train.images, second.train.images)
    assert len(hair.train) < len(first.train)
    # the attribute file changes (mtime, size): rebuilt
    attr = root / "celeba" / "list_attr_celeba.txt"
    attr.write_text(attr.read_text() + "\n")
    os.utime(attr, ns=(attr.stat().st_atime_ns, attr.stat().st_mtime_ns + 10**9))
    load_dataset("celeba-gender", root=str(root), workers=1)
    assert opens.n == len(src["names"])
    npys = sorted(p.name for p in dataset_cache.glob("celeba-u8-64px-*.npy"))
    assert len(npys) == 2, npys  # stale train/test files of the old fingerprint removed


def test_celeba_hair_filter_and_dropped_count(celeba_root):
    root, src = celeba_root
    data = load_dataset("celeba-hair", root=str(root), workers=1)
    v, part = src["values"], src["partition"]
    hair = np.stack([v[:, celeba.ATTRIBUTES.index(a)] == 1 for a in ("Black_Hair", "Blond_Hair", "Brown_Hair")], 1)
    keep = hair.sum(1) == 1
    assert data.class_names == ("black", "blonde", "brown")
    check_images(data, (3, 64, 64), int((keep & (part <= 1)).sum()), int((keep & (part == 2)).sum()))
    assert data.train.labels.tolist() == hair[keep & (part <= 1)].argmax(1).tolist()
    dropped = int((~keep).sum())
    assert dropped == 12  # 30 images, kinds 3 and 4 of every 5
    info = files.dataset_info("celeba-hair")
    assert info["dropped_total"] == dropped
    assert info["dropped"] == {"train": int((~keep & (part <= 1)).sum()), "test": int((~keep & (part == 2)).sum())}
    assert f"dropped {dropped} (train" in data.description
    assert celeba.hair_counts(root)["dropped"] == dropped
    # the kept images are the right ones
    levels = torch.as_tensor(src["levels"][keep & (part <= 1)], dtype=torch.float32) / 127.5 - 1
    assert (data.train.images.mean(dim=(1, 2, 3)) - levels).abs().max() < 0.05


@pytest.mark.parametrize("damage", ["truncate", "sidecar_garbage", "sidecar_missing"])
def test_corrupt_cache_is_rebuilt(celeba_root, monkeypatch, caplog, damage):
    root, src = celeba_root
    first = load_dataset("celeba-gender", root=str(root), workers=1)
    train_npy = Path(files.dataset_info("celeba-gender")["cache_files"][0])
    if damage == "truncate":
        with open(train_npy, "r+b") as f:
            f.truncate(train_npy.stat().st_size // 2)
    elif damage == "sidecar_garbage":
        train_npy.with_suffix(".json").write_text("{not json")
    else:
        train_npy.with_suffix(".json").unlink()
    opens = OpenCounter(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="dpgen_bench"):
        again = load_dataset("celeba-gender", root=str(root), workers=1)
    assert opens.n == len(first.train)  # only the damaged train split is decoded again
    assert "rebuilding corrupt dataset cache" in caplog.text
    torch.testing.assert_close(first.train.images, again.train.images)
    opens.n = 0
    load_dataset("celeba-gender", root=str(root), workers=1)
    assert opens.n == 0


def test_celeba_missing_files(tmp_path):
    with pytest.raises(UserError) as e:
        load_dataset("celeba-gender", root=str(tmp_path))
    msg = str(e.value)
    assert "\n" not in msg
    for part in ("img_align_celeba", "list_attr_celeba.txt", "list_eval_partition.txt"):
        assert str(tmp_path / "celeba" / part) in msg
    src = make_celeba(tmp_path, n=10)
    (tmp_path / "celeba" / "list_eval_partition.txt").unlink()
    with pytest.raises(UserError, match=r"missing .*list_eval_partition\.txt"):
        load_dataset("celeba-gender", root=str(tmp_path))
    make_celeba(tmp_path, n=10)
    gone = tmp_path / "celeba" / "img_align_celeba" / src["names"][3]
    gone.unlink()
    with pytest.raises(UserError, match=f"missing {gone}"):
        load_dataset("celeba-gender", root=str(tmp_path), workers=1)


def test_celeba_malformed_files(tmp_path):
    src = make_celeba(tmp_path, n=10)
    attr = tmp_path / "celeba" / "list_attr_celeba.txt"
    lines = attr.read_text().splitlines()
    attr.write_text("\n".join(["11"] + lines[1:]) + "\n")
    with pytest.raises(UserError, match="list_attr_celeba.txt is malformed .*says 11 images but 10"):
        load_dataset("celeba-gender", root=str(tmp_path))
    attr.write_text("\n".join(lines[:1] + [lines[1].replace("Male", "Mail")] + lines[2:]) + "\n")
    with pytest.raises(UserError, match="no attribute Male"):
        load_dataset("celeba-gender", root=str(tmp_path))
    for bad_value in ("11", "0", "-2"):
        row = lines[5].split()
        row[7] = bad_value
        attr.write_text("\n".join(lines[:5] + [" ".join(row)] + lines[6:]) + "\n")
        with pytest.raises(UserError, match="list_attr_celeba.txt is malformed .*line 6"):
            load_dataset("celeba-gender", root=str(tmp_path))
    make_celeba(tmp_path, n=10)
    bad = tmp_path / "celeba" / "img_align_celeba" / src["names"][0]
    bad.write_bytes(b"not a jpeg")
    with pytest.raises(UserError, match=f"cannot read image {bad}"):
        load_dataset("celeba-gender", root=str(tmp_path), workers=1)


def test_celeba_parallel_decode_and_memory_mapped_split(celeba_root, monkeypatch, dataset_cache):
    root, _ = celeba_root
    serial = load_dataset("celeba-gender-32", root=str(root), workers=1)
    for p in dataset_cache.glob("celeba-u8-32px-*"):
        p.unlink()
    parallel = load_dataset("celeba-gender-32", root=str(root), workers=2, in_memory=False)
    assert files.dataset_info("celeba-gender-32")["cache_hit"] is False
    assert "memory-mapped" in files.dataset_info("celeba-gender-32")["storage"]
    assert parallel.train.images.dtype == torch.float32
    torch.testing.assert_close(serial.train.images, parallel.train.images)
    torch.testing.assert_close(serial.test.images, parallel.test.images)
    # copy-on-write: indexing and in-place writes work and never reach the cache file
    batch = parallel.train.images[torch.tensor([0, 2])]
    assert batch.shape == (2, 3, 32, 32)
    parallel.train.images[0].fill_(0.5)
    again = load_dataset("celeba-gender-32", root=str(root), in_memory=False)
    torch.testing.assert_close(again.train.images, serial.train.images)
    # a truncated float32 cache is rebuilt from the uint8 cache, without decoding
    f32 = sorted(dataset_cache.glob("celeba-gender-32-f32-train-*.npy"))
    assert len(f32) == 1
    with open(f32[0], "r+b") as f:
        f.truncate(1000)
    opens = OpenCounter(monkeypatch)
    rebuilt = load_dataset("celeba-gender-32", root=str(root), in_memory=False)
    assert opens.n == 0
    torch.testing.assert_close(rebuilt.train.images, serial.train.images)
    # the same via the environment threshold
    monkeypatch.setenv("DPGEN_DATA_IN_MEMORY_GB", "0")
    load_dataset("celeba-gender-32", root=str(root))
    assert "memory-mapped" in files.dataset_info("celeba-gender-32")["storage"]


def test_dataset_cache_location(celeba_root, monkeypatch, tmp_path_factory):
    """``$DPGEN_CACHE/datasets``, else ``~/.cache/dpgen_bench/datasets``; never inside the data root."""
    root, _ = celeba_root
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    cache = tmp_path_factory.mktemp("elsewhere")
    monkeypatch.setenv("DPGEN_CACHE", str(cache))
    load_dataset("celeba-hair-32", root=str(root), workers=1)
    assert list((cache / "datasets").glob("celeba-u8-32px-train-*.npy"))
    assert files.dataset_info("celeba-hair-32")["cache_files"][0].startswith(str(cache / "datasets"))
    home = tmp_path_factory.mktemp("home")
    monkeypatch.delenv("DPGEN_CACHE")
    monkeypatch.setenv("HOME", str(home))
    load_dataset("celeba-hair-32", root=str(root), workers=1)
    assert list((home / ".cache" / "dpgen_bench" / "datasets").glob("celeba-u8-32px-train-*.npy"))
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == before  # the data root is only read


def test_unwritable_dataset_cache_is_one_user_error_line(celeba_root, monkeypatch, tmp_path):
    root, _ = celeba_root
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("DPGEN_CACHE", str(blocker))
    with pytest.raises(UserError, match=r"cannot write the datasets cache .*set \$DPGEN_CACHE to a writable"):
        load_dataset("celeba-gender-32", root=str(root), workers=1)


# -------------------------------------------------------------------------- FFHQ


@pytest.mark.parametrize("fmt,subdirs", [("csv", False), ("json", True)])
def test_ffhq_gender(tmp_path, monkeypatch, fmt, subdirs):
    src = make_ffhq(tmp_path, n=20, fmt=fmt, subdirs=subdirs)
    data = load_dataset("ffhq-gender", root=str(tmp_path), workers=1)
    check_images(data, (3, 128, 128), 18, 2)
    train_idx, test_idx = ffhq.split_indices(20)
    assert data.test.labels.tolist() == src["genders"][test_idx].tolist()
    assert data.train.labels.tolist() == src["genders"][train_idx].tolist()
    assert data.class_names == ("female", "male")
    opens = OpenCounter(monkeypatch)
    d64 = load_dataset("ffhq-gender-64", root=str(tmp_path), workers=1)
    check_images(d64, (3, 64, 64), 18, 2)
    assert opens.n == 20
    load_dataset("ffhq-gender-64", root=str(tmp_path), workers=1)
    assert opens.n == 20
    # fixed seed: the same split every time
    assert np.array_equal(ffhq.split_indices(20)[1], test_idx)


def test_ffhq_errors(tmp_path):
    with pytest.raises(UserError) as e:
        load_dataset("ffhq-gender", root=str(tmp_path))
    msg = str(e.value)
    assert "\n" not in msg and str(tmp_path / "ffhq" / "images") in msg and str(tmp_path / "ffhq" / "gender.csv") in msg
    make_ffhq(tmp_path, n=6)
    csv_path = tmp_path / "ffhq" / "gender.csv"
    csv_path.write_text(csv_path.read_text() + "99999.png,male\n")
    with pytest.raises(UserError, match=f"missing {tmp_path / 'ffhq' / 'images' / '99999.png'}"):
        load_dataset("ffhq-gender", root=str(tmp_path))
    csv_path.write_text("file,gender\n00000.png,unknown\n")
    with pytest.raises(UserError, match="gender.csv is malformed .*line 2"):
        load_dataset("ffhq-gender", root=str(tmp_path))
    csv_path.write_text("name,sex\n00000.png,male\n")
    with pytest.raises(UserError, match="header"):
        load_dataset("ffhq-gender", root=str(tmp_path))


def test_decoding_workers_are_never_a_plain_fork_of_the_loader():
    """A plain fork of a process whose other threads hold locks (Ray's, after an in-process Ray
    sweep in the same pytest worker) left a decoding worker waiting forever: make test hung."""
    assert files._decode_context().get_start_method() in ("forkserver", "spawn")
