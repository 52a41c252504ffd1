"""Writers of fake dataset files in the layouts the loaders read (shared by tests)."""

import gzip
import struct
from pathlib import Path

import numpy as np


def write_idx(path: Path, arr: np.ndarray, gz: bool = False) -> None:
    arr = np.ascontiguousarray(arr, dtype=np.uint8)
    magic = 0x0800 | arr.ndim
    data = struct.pack(">I", magic) + struct.pack(f">{arr.ndim}I", *arr.shape) + arr.tobytes()
    path.parent.mkdir(parents=True, exist_ok=True)
    if gz:
        with gzip.open(f"{path}.gz", "wb") as f:
            f.write(data)
    else:
        path.write_bytes(data)
