"""Float32 exactness on CUDA.

cuDNN convolutions default to TF32 on Ampere and later GPUs (torch 2.11 on an H100:
``cudnn.allow_tf32`` True, ``cuda.matmul.allow_tf32`` False). Measured there
(tests/unit/test_fastclip.py, dpgan's paper discriminator, one clipped step): TF32 moves the
clipped update by 1.1e-2 relative, in Opacus' hooks and in book-keeping alike, where float32
on CUDA stays within 2e-4 of the CPU. A per-example norm off by ~1 % lets a clipped
gradient exceed C by ~1 %: the sensitivity the accountant assumes would hold only to TF32's
precision. So training and sampling run in float32 on CUDA (``exact_float32``), and so do
the evaluators (FID's feature extraction, the transfer classifiers, the MIA reference
generator); ``DPGEN_ALLOW_TF32=1`` opts in to TF32 for training's speed, and a private run
then carries an ε caveat saying so.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch

ALLOW_TF32_ENV = "DPGEN_ALLOW_TF32"
TF32_CAVEAT = (f"{ALLOW_TF32_ENV}=1: per-example norms and clipped sums were computed in TF32 on CUDA "
               "(~1e-2 relative on an H100), so the sensitivity C, and the ε computed from it, hold only to "
               "that precision")


def tf32_allowed() -> bool:
    """Whether the user opted in to TF32 (``DPGEN_ALLOW_TF32=1``)."""
    return os.environ.get(ALLOW_TF32_ENV, "").strip() == "1"


@contextlib.contextmanager
def exact_float32(device: torch.device | str, allow_tf32: bool = False) -> Iterator[None]:
    """On CUDA, set TF32 for cuDNN convolutions and matmuls to ``allow_tf32`` (default:
    off) inside the block and restore the previous settings after it; on the CPU, nothing."""
    prev = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)
    if torch.device(device).type == "cuda":
        torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = allow_tf32
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = prev
