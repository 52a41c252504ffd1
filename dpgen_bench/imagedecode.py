"""The image decoding that ``dpgen_bench.data.files`` runs in worker processes, with numpy and
PIL only: the workers are spawned (``files._decode_context``), and importing this module, not
``files`` (which imports torch), is what each needs to unpickle its task; a plain fork of the
loading process could inherit a lock one of its threads held (after an in-process Ray sweep a
forked decoder hung ``make test``)."""

from __future__ import annotations

import os

import numpy as np


def pwrite_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


def load_image(path: str, size: int, mode: str = "RGB") -> np.ndarray:
    """One image as uint8 (C, size, size): centre square crop (torchvision ``CenterCrop``'s
    rounding), then PIL bilinear resize (what torchvision ``Resize`` does on PIL images)."""
    from PIL import Image

    with Image.open(path) as im:
        if im.mode != mode:
            im = im.convert(mode)
        w, h = im.size
        s = min(w, h)
        if w != h:
            top, left = int(round((h - s) / 2.0)), int(round((w - s) / 2.0))
            im = im.crop((left, top, left + s, top + s))
        if s != size:
            im = im.resize((size, size), Image.Resampling.BILINEAR)
        a = np.asarray(im, dtype=np.uint8)
    return a.transpose(2, 0, 1) if a.ndim == 3 else a[None]


def decode_range(task: tuple) -> tuple[int, str, str] | None:
    """Decode ``paths`` into rows ``start..`` of the .npy at ``out`` (header ``offset``)."""
    paths, start, out, offset, size, mode, channels = task
    row = channels * size * size
    per = max(1, (8 * 2**20) // row)
    fd = os.open(out, os.O_WRONLY)
    try:
        buf = np.empty((min(per, len(paths)), channels, size, size), np.uint8)
        for i0 in range(0, len(paths), per):
            part = paths[i0 : i0 + per]
            for j, p in enumerate(part):
                try:
                    buf[j] = load_image(p, size, mode)
                except Exception as e:  # noqa: BLE001 - reported as one line by the parent
                    return start + i0 + j, p, f"{type(e).__name__}: {e}"
            pwrite_all(fd, buf[: len(part)].tobytes(), offset + (start + i0) * row)
    finally:
        os.close(fd)
    return None
