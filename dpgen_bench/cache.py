"""Where caches live: one directory per kind of cache, under one root.

``$DPGEN_CACHE/<kind>`` when ``$DPGEN_CACHE`` is set (and not empty), else
``~/.cache/dpgen_bench/<kind>``. The kinds in use: ``datasets`` (decoded dataset arrays,
``dpgen_bench.data.files``), ``inception`` (converted Inception weights and real-split
statistics, ``evaluators.inception``), ``mia_reference`` (GAN-Leaks reference generators,
``evaluators.mia``). Every cache file is written atomically (``dpgen_bench.store``), so
processes may share a cache directory.
"""

from __future__ import annotations

import os
from pathlib import Path

from .errors import UserError
from .store import probe_writable_dir

ENV = "DPGEN_CACHE"
DEFAULT_ROOT = Path("~") / ".cache" / "dpgen_bench"


def cache_dir(kind: str) -> Path:
    """The cache directory for ``kind``: ``$DPGEN_CACHE/<kind>``, else
    ``~/.cache/dpgen_bench/<kind>``; created on demand and checked to be writable.

    Raises :class:`UserError` (one line) when the directory cannot be created or written.
    """
    if not kind or kind in (".", "..") or "/" in kind or os.sep in kind:
        raise ValueError(f"cache kind must be a plain directory name, got {kind!r}")
    env = os.environ.get(ENV)
    try:
        root = Path(env).expanduser() if env else DEFAULT_ROOT.expanduser()
    except RuntimeError:  # no home directory to expand ~ against
        raise UserError(f"cannot locate the {kind} cache (no home directory): "
                        f"set ${ENV} to a writable directory") from None
    path = root / kind
    try:
        probe_writable_dir(path)
    except OSError as e:
        why = e.strerror or type(e).__name__
        raise UserError(f"cannot write the {kind} cache at {path} ({why}): "
                        f"set ${ENV} to a writable directory") from None
    return path
