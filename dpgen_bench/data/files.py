"""Local dataset files: the data root, one-line file errors, and the preprocessed cache.

Data root
    The loader's ``root`` argument (``--data-root``), else ``$DPGEN_DATA``, else
    ``~/.cache/dpgen_bench/data`` (:func:`data_root`, :data:`DATA_ROOT_HELP`). Nothing is
    ever downloaded: missing or malformed files raise one-line :class:`UserError`\\ s that
    name the exact files expected and where.

Cache (decode and resize happen once)
    In ``dpgen_bench.cache.cache_dir("datasets")``: ``$DPGEN_CACHE/datasets/`` when
    ``$DPGEN_CACHE`` is set, else ``~/.cache/dpgen_bench/datasets/``, whatever the data
    root (a directory that cannot be written is one UserError line). One uint8 NCHW
    ``.npy`` per (source, size, split), named
    ``<source>-u8-<size>px-<split>-<root hash>-<fingerprint>.npy`` (the root hash keeps the
    caches of several data roots apart); the fingerprint hashes
    the resolved source directory, the names, sizes and mtimes of the label / IDX files,
    the number of images, the preprocessing parameters and :data:`CACHE_VERSION`, so any
    change to the source files rebuilds it (stale files of the same key are deleted).

    A cache file is built into a temp file in the same directory (``store.atomic_path``:
    header and size preallocated with ``np.lib.format.open_memmap``, rows written image by
    image with ``os.pwrite``, so the build holds one decoded chunk in memory, never the
    data set), fsynced, renamed with ``os.replace``; then a small JSON sidecar
    (fingerprint, shape, dtype, exact file size) is written the same way, *last*. A load
    accepts a cache only when the sidecar parses, its fingerprint matches and the ``.npy``
    has exactly the recorded size, shape and dtype; anything else (truncated ``.npy``,
    missing or garbled sidecar) is logged as a warning and **rebuilt** from the source
    files. Builds of the same file are serialised with an ``fcntl`` lock, so parallel runs
    decode once.

Decoding
    Image by image with PIL (centre square crop with torchvision ``CenterCrop``'s rounding,
    then bilinear resize as torchvision ``Resize`` does on PIL images), in ``workers``
    forked processes (loaders' ``workers=`` keyword; default ``min(8, CPUs)`` from 2,000
    images on, else in-process) that ``pwrite`` their rows into the preallocated temp file.
    An unreadable image is one UserError naming it.

Splits (memory)
    The uint8 cache is opened with ``np.load(mmap_mode="r")`` (page cache, not process
    memory) and converted to float32 in [-1, 1] (``x / 127.5 - 1``) chunk by chunk into
    one preallocated tensor: the process holds one float32 copy plus one 64 MiB chunk.
    When the float32 copy of the data set (train + test) would exceed
    :data:`IN_MEMORY_MAX_BYTES` (2 GiB; ``$DPGEN_DATA_IN_MEMORY_GB`` or the loaders'
    ``in_memory=True/False`` override it) — full CelebA is 202,599 x 3 x 64 x 64 x 4 B =
    9.96 GB at 64x64 and 2.49 GB at 32x32; MNIST (0.22 GB) always stays in memory — the
    float32 splits are themselves written once as derived caches
    (``<dataset>-f32-<split>-<root hash>-<fingerprint>.npy``, same atomic protocol) and
    served as copy-on-write memory maps (``np.load(mmap_mode="c")`` + ``torch.from_numpy``).
    They are real float32 tensors (the contract in ``api.py``): ``images[idx]`` copies just
    the batch, ``.to("cuda")`` streams the file once, in-place writes copy only the touched
    pages and never reach the file; nothing is read until touched, so a second load costs
    little more than re-reading the label files. They cost page cache (shared, reclaimable), not process memory;
    disk: 4 B per pixel (CelebA-64: 9.96 GB) on top of the 1 B per pixel uint8 cache.
    float16 (half the memory) was rejected: float32 networks reject float16 inputs.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import multiprocessing
import os
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..imagedecode import decode_range as _decode_range, pwrite_all
from ..errors import UserError
from ..store import atomic_open, atomic_path, file_lock

log = logging.getLogger("dpgen_bench")

DEFAULT_DATA_ROOT = Path("~") / ".cache" / "dpgen_bench" / "data"
DATA_ROOT_HELP = "Root of local dataset files (else $DPGEN_DATA, else ~/.cache/dpgen_bench/data)."
ROOT_HINT = "data root = --data-root, else $DPGEN_DATA, else ~/.cache/dpgen_bench/data; nothing is downloaded"
CACHE_VERSION = 1  # bump when preprocessing changes: every cache is rebuilt
IN_MEMORY_MAX_BYTES = 2 * 2**30  # larger float32 splits are served memory-mapped
CHUNK_BYTES = 64 * 2**20  # float32 bytes converted per chunk
PARALLEL_MIN_IMAGES = 2000  # decode in worker processes from this many images on
CACHE_KIND = "datasets"  # dpgen_bench.cache.cache_dir(CACHE_KIND): where the cache files live

_INFO: dict[str, dict[str, Any]] = {}


# ------------------------------------------------------------------------- roots


def data_root(root: str | os.PathLike | None = None) -> Path:
    """``root`` (from ``--data-root``), else ``$DPGEN_DATA``, else ``~/.cache/dpgen_bench/data``."""
    if root is not None and str(root) != "":
        return Path(root).expanduser()
    env = os.environ.get("DPGEN_DATA")
    if env:
        return Path(env).expanduser()
    return DEFAULT_DATA_ROOT.expanduser()


# ------------------------------------------------------------------------ errors


def one_line(text: str) -> str:
    return " ".join(str(text).split())


def fmt_paths(paths: Sequence[os.PathLike | str], limit: int = 4) -> str:
    shown = ", ".join(str(p) for p in paths[:limit])
    return shown + (f" and {len(paths) - limit} more" if len(paths) > limit else "")


class MissingDataFiles(UserError):
    """A dataset's files are not where the data root says (as opposed to present but malformed)."""


def missing_files(dataset: str, missing: Sequence[str | os.PathLike], expected: str) -> MissingDataFiles:
    """One line: what is missing, the whole layout expected, and where the root came from."""
    return MissingDataFiles(one_line(f"dataset '{dataset}': missing {fmt_paths(missing)}; expected {expected} "
                                     f"({ROOT_HINT})"))


def malformed(dataset: str, path: str | os.PathLike, problem: str, expected: str = "") -> UserError:
    tail = f"; expected {expected}" if expected else ""
    return UserError(one_line(f"dataset '{dataset}': {path} is malformed ({problem}){tail}"))


# ------------------------------------------------------------------ fingerprints


def file_stat(path: Path) -> list[Any]:
    st = path.stat()
    return [path.name, st.st_size, st.st_mtime_ns]


def fingerprint(**parts: Any) -> str:
    blob = json.dumps({"cache_version": CACHE_VERSION, **parts}, sort_keys=True, default=str)
    return hashlib.sha1(blob.encode()).hexdigest()


def short_hash(text: str, n: int = 8) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:n]


# --------------------------------------------------------------------- .npy cache


def _sidecar(npy: Path) -> Path:
    return npy.with_suffix(".json")


def _check(npy: Path, fp: str, shape: tuple[int, ...], dtype: np.dtype) -> tuple[np.ndarray | None, str]:
    """The cached array (memory-mapped read-only) if valid, else (None, why not)."""
    side = _sidecar(npy)
    if not side.is_file() and not npy.is_file():
        return None, "absent"
    try:
        meta = json.loads(side.read_text())
    except (OSError, ValueError) as e:
        return None, f"sidecar {side.name} unreadable ({type(e).__name__})"
    if not isinstance(meta, dict) or meta.get("fingerprint") != fp:
        return None, f"sidecar {side.name} does not match"
    if list(meta.get("shape", ())) != list(shape) or meta.get("dtype") != np.dtype(dtype).str:
        return None, f"sidecar {side.name} records another shape/dtype"
    try:
        size = npy.stat().st_size
    except OSError:
        return None, f"{npy.name} missing"
    if size != meta.get("file_size"):
        return None, f"{npy.name} has {size} bytes, expected {meta.get('file_size')} (truncated?)"
    try:
        arr = np.load(npy, mmap_mode="r")
    except (OSError, ValueError) as e:
        return None, f"{npy.name} unreadable ({type(e).__name__}: {e})"
    if arr.shape != tuple(shape) or arr.dtype != np.dtype(dtype):
        return None, f"{npy.name} holds {arr.shape} {arr.dtype}"
    return arr, "ok"


def cached_array(
    directory: Path,
    stem: str,
    family: str,
    fp: str,
    shape: tuple[int, ...],
    dtype: Any,
    fill: Callable[[str, int], None],
    meta: dict[str, Any] | None = None,
) -> tuple[np.ndarray, bool]:
    """The array ``<directory>/<stem>.npy`` (memory-mapped, read-only), built if needed.

    ``fill(tmp_path, header_offset)`` writes the rows of a preallocated temp ``.npy``
    (e.g. with :func:`pwrite_all`). ``family`` is the stem without the fingerprint: other
    files of the same family are stale and removed after a build. Returns (array, hit).
    """
    dtype = np.dtype(dtype)
    npy = directory / f"{stem}.npy"
    arr, why = _check(npy, fp, shape, dtype)
    if arr is not None:
        return arr, True
    with file_lock(directory / f".{stem}.lock"):
        arr, why = _check(npy, fp, shape, dtype)  # built meanwhile by another process?
        if arr is not None:
            return arr, True
        if why != "absent":
            log.warning("rebuilding corrupt dataset cache %s: %s", npy, why)
        for stale in (npy, _sidecar(npy)):
            with contextlib.suppress(FileNotFoundError):
                stale.unlink()
        t0 = time.perf_counter()
        with atomic_path(npy) as tmp:
            pre = np.lib.format.open_memmap(tmp, mode="w+", dtype=dtype, shape=shape)
            offset = int(pre.offset)
            del pre  # header written, size preallocated (sparse): rows come by pwrite
            fill(str(tmp), offset)
        record = {"fingerprint": fp, "shape": list(shape), "dtype": dtype.str, "file_size": npy.stat().st_size,
                  "build_seconds": round(time.perf_counter() - t0, 3), "created": time.time(), **(meta or {})}
        with atomic_open(_sidecar(npy), "w") as f:
            f.write(json.dumps(record, indent=1, default=str))
        for other in directory.glob(f"{family}-*"):
            if other.name.startswith(stem):
                continue
            with contextlib.suppress(OSError):
                other.unlink()
        for other in directory.glob(f".{family}-*.lock"):
            if other.name != f".{stem}.lock":
                with contextlib.suppress(OSError):
                    other.unlink()
        arr, why = _check(npy, fp, shape, dtype)
        if arr is None:  # pragma: no cover - the disk lied
            raise UserError(f"dataset cache {npy} is unreadable right after writing it ({why})")
        return arr, False


# --------------------------------------------------------------------- decoding


DECODE_START_METHOD = "spawn"  # benchmarks/dataset_cache.py sets "fork" to wrap the decoding


def _decode_context():
    """Never a plain fork of this process: a thread of it holding a lock at that moment (Ray's,
    after an in-process Ray sweep) left a forked worker waiting forever (a make test hang).
    Spawned workers import ``dpgen_bench.imagedecode`` (numpy, PIL) to unpickle their task.
    Not forkserver: its server is one per process, and whoever starts it first fixes its
    preloaded modules (tests/integration/cli_process.py preloads the CLI's; a decode first
    would have left every later CLI child importing torch and the methods afresh)."""
    method = DECODE_START_METHOD if DECODE_START_METHOD in multiprocessing.get_all_start_methods() else "spawn"
    return multiprocessing.get_context(method)


def default_workers(n: int) -> int:
    if n < PARALLEL_MIN_IMAGES:
        return 1
    return max(1, min(8, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))


def decode_images(dataset: str, paths: Sequence[str], out: str, offset: int, size: int, mode: str = "RGB",
                  workers: int | None = None) -> None:
    """Decode every image of ``paths`` into the preallocated uint8 .npy ``out``, in order,
    in ``workers`` processes (``_decode_context``; they use PIL and numpy only)."""
    channels = 1 if mode == "L" else 3
    n = len(paths)
    workers = default_workers(n) if workers is None else max(1, int(workers))
    t0 = time.perf_counter()
    log.info("decoding %d images to %dx%d for '%s' (%d worker%s), once", n, size, size, dataset, workers,
             "s" if workers > 1 else "")
    if workers == 1 or n < 2 * workers:
        failures = [_decode_range((list(paths), 0, out, offset, size, mode, channels))]
    else:
        step = max(64, math.ceil(n / (workers * 8)))
        tasks = [(list(paths[a : a + step]), a, out, offset, size, mode, channels) for a in range(0, n, step)]
        failures = []
        with _decode_context().Pool(workers) as pool:
            for r in pool.imap_unordered(_decode_range, tasks):
                if r is not None:
                    failures.append(r)
                    pool.terminate()
                    break
    bad = [f for f in failures if f is not None]
    if bad:
        _, path, why = min(bad)
        raise UserError(one_line(f"dataset '{dataset}': cannot read image {path} ({why})"))
    log.info("decoded %d images in %.1f s", n, time.perf_counter() - t0)


# ----------------------------------------------------------------------- splits


def in_memory_limit() -> int:
    env = os.environ.get("DPGEN_DATA_IN_MEMORY_GB")
    if env:
        try:
            return int(float(env) * 2**30)
        except ValueError:
            raise UserError(f"$DPGEN_DATA_IN_MEMORY_GB must be a number of GiB, got {env!r}") from None
    return IN_MEMORY_MAX_BYTES


def keep_in_memory(in_memory: bool | None, n_images: int, image_shape: Sequence[int]) -> bool:
    """The loaders' choice for the whole data set (train + test): float32 in memory unless
    it exceeds :func:`in_memory_limit` (``in_memory`` True / False forces it)."""
    if in_memory is not None:
        return bool(in_memory)
    return n_images * int(np.prod(image_shape)) * 4 <= in_memory_limit()


def _to_float(dst: torch.Tensor, src: np.ndarray) -> torch.Tensor:
    """dst <- src / 127.5 - 1 in place (float32; bit-identical to numpy's float32 result)."""
    if not src.flags.writeable:  # torch.from_numpy warns on read-only (memory-mapped) arrays
        src = np.array(src)
    return dst.copy_(torch.from_numpy(src)).div_(127.5).sub_(1.0)


def float_images(u8: np.ndarray, index: np.ndarray | None, *, directory: Path, family: str, fp: str,
                 in_memory: bool | None = None) -> tuple[torch.Tensor, str]:
    """float32 [-1, 1] images of ``u8[index]`` (all rows if None): in memory, or a
    copy-on-write memory map of a derived ``.f32.npy`` cache for large splits.
    Returns (images, "in memory" | "memory-mapped copy-on-write")."""
    n = len(u8) if index is None else len(index)
    shape = (n, *u8.shape[1:])
    per_image = int(np.prod(u8.shape[1:]))
    nbytes = n * per_image * 4
    chunk = max(1, CHUNK_BYTES // (per_image * 4))
    if in_memory is None:
        in_memory = nbytes <= in_memory_limit()

    def rows(a: int, b: int) -> np.ndarray:
        return u8[a:b] if index is None else u8[index[a:b]]

    if in_memory:
        out = torch.empty(shape, dtype=torch.float32)
        for a in range(0, n, chunk):
            b = min(n, a + chunk)
            _to_float(out[a:b], rows(a, b))
        return out, "in memory"

    def fill(tmp: str, offset: int) -> None:
        buf = torch.empty((min(chunk, n), *u8.shape[1:]), dtype=torch.float32)
        fd = os.open(tmp, os.O_WRONLY)
        try:
            for a in range(0, n, chunk):
                b = min(n, a + chunk)
                done = _to_float(buf[: b - a], rows(a, b))
                pwrite_all(fd, memoryview(done.numpy()).cast("B"), offset + a * per_image * 4)
        finally:
            os.close(fd)

    stem = f"{family}-{fp[:16]}"
    cached_array(directory, stem, family, fp, shape, np.float32, fill, {"kind": "float32 split"})
    arr = np.load(directory / f"{stem}.npy", mmap_mode="c")  # copy-on-write: writable, never written back
    return torch.from_numpy(arr), "memory-mapped copy-on-write"


def storage_note(modes: Sequence[str], tensors: Sequence[torch.Tensor]) -> str:
    """'float32 in memory, 0.93 GiB' (over all splits; modes joined when they differ)."""
    gib = sum(t.numel() * t.element_size() for t in tensors) / 2**30
    return f"float32 {' / '.join(dict.fromkeys(modes))}, {gib:.2f} GiB"


# ------------------------------------------------------------------------- info


def set_info(name: str, info: dict[str, Any]) -> None:
    _INFO[name] = dict(info)


def dataset_info(name: str) -> dict[str, Any]:
    """Facts about the last load of ``name`` in this process (counts, dropped images,
    cache files and whether they were hits, storage of the float split)."""
    if name not in _INFO:
        raise KeyError(f"dataset '{name}' has not been loaded in this process")
    return dict(_INFO[name])
