"""Run directories: atomic writes, provenance, and reading records back.

A run is complete only once ``eval.json`` has been renamed into place; every file is
written to a temporary file in the same directory, fsynced, then renamed, so a crash
never leaves a half-written file that a reader would accept.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import math
import os
import platform
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

DEFAULT_RESULTS = Path("results") / "runs"
COMPLETE_MARKER = "eval.json"
AUDIT_FILE = "audit.json"  # bench audit, beside the record (read by bench report --layout audit)
PACKAGES = ("torch", "torchvision", "opacus", "prv-accountant", "torch-fidelity", "numpy", "scikit-learn",
            "pandas", "click", "matplotlib", "dpgen-bench")


def results_root(explicit: str | os.PathLike | None = None) -> Path:
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("DPGEN_RESULTS", DEFAULT_RESULTS))


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Write ``path`` atomically through a temporary file that the caller fills by name.

    Yields an empty temp file in the same directory (``.<name>.<random>.tmp``, with the
    mode the user's umask gives new files, not mkstemp's 0600, so shared caches stay
    readable). When the block exits normally the temp file is fsynced, renamed onto
    ``path`` with ``os.replace`` and the directory fsynced so the rename is durable; when
    it raises, the temp file is deleted. A crash at any point leaves either the old file
    or the complete new one under ``path``, never a partial one. The one implementation
    of the protocol in the project: :func:`atomic_open` and :func:`write_json` use it.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o666 & ~mask)
        yield Path(tmp)
        fd = os.open(tmp, os.O_RDWR)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


@contextlib.contextmanager
def file_lock(path: str | os.PathLike) -> Iterator[None]:
    """Hold an exclusive ``fcntl`` lock on ``path`` (created if needed) for the block: builds
    of the same cache file by parallel processes are serialised (none on non-POSIX)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX: atomic renames still keep it safe
        yield
        return
    with open(path, "a+b") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "wb") -> Iterator[io.IOBase]:
    """Write ``path`` atomically through a file object opened with ``mode`` (``"wb"``,
    ``"w"``, ...: a new file); see :func:`atomic_path` for the guarantees."""
    if not mode.startswith("w"):
        raise ValueError(f"atomic_open writes a new file: a 'w' mode, not {mode!r}")
    with atomic_path(path) as tmp, open(tmp, mode) as f:
        yield f


def _json_default(o: Any):
    if hasattr(o, "item"):
        return o.item()
    if hasattr(o, "tolist"):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o)}")


def _finite(o: Any) -> Any:
    """JSON has no inf/nan: write them as strings, read back with ``float()``."""
    if isinstance(o, float) and not math.isfinite(o):
        return str(o)
    if isinstance(o, dict):
        return {k: _finite(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_finite(v) for v in o]
    return o


def json_line(data: Any) -> str:
    """``data`` as one JSON line (a train.jsonl record), inf/nan as strings."""
    return json.dumps(_finite(data), default=_json_default) + "\n"


def write_json(path: Path, data: Any) -> None:
    with atomic_open(path, "w") as f:
        json.dump(_finite(data), f, indent=2, default=_json_default, sort_keys=False)
        f.write("\n")


def read_json(path: Path) -> Any:
    with open(path) as f:
        return json.load(f)


def probe_writable_dir(path: str | os.PathLike) -> None:
    """Prove that files can be written into the directory ``path`` (made if absent) by
    writing and removing an empty one; on failure remove the directories made here and
    raise the ``OSError``. For refusing an unwritable output before any work is done."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise NotADirectoryError(20, "exists and is not a directory", str(path))
    made = [d for d in [path, *path.parents] if not d.exists()]
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path, prefix=".write-probe.")
        os.close(fd)
        os.unlink(tmp)
    except OSError:
        for d in made:
            with contextlib.suppress(OSError):
                d.rmdir()
        raise


def new_run_id(method: str, dataset: str, epsilon: float, seed: int) -> str:
    eps = "inf" if not math.isfinite(epsilon) else f"{epsilon:g}"
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return f"{method}-{dataset}-eps{eps}-s{seed}-{stamp}-{secrets.token_hex(2)}"


# the checkout this package runs from: whose commit a record names (env.json), and where
# ``require_commit`` asks git whether a record's commit contains a given one
CODE_ROOT = Path(__file__).resolve().parent.parent


def _git(*args: str, timeout: float = 5) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=CODE_ROOT, capture_output=True, text=True, timeout=timeout)


def git_commit() -> dict[str, Any]:
    try:
        commit = _git("rev-parse", "HEAD").stdout.strip()
        dirty = bool(_git("status", "--porcelain", "--untracked-files=no").stdout.strip())
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}
    return {"commit": commit or None, "dirty": dirty if commit else None}


def resolve_commit(rev: str) -> str:
    """The full hash of ``rev`` (a hash, tag, branch or ``HEAD~3``) in this package's checkout;
    a one-line ``UserError`` when there is no checkout or no such commit."""
    from .errors import UserError

    try:
        out = _git("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    except (OSError, subprocess.SubprocessError) as e:
        raise UserError(f"cannot ask git about commit {rev!r}: {e}") from None
    if out.returncode != 0 or not out.stdout.strip():
        raise UserError(f"no commit {rev!r} in {CODE_ROOT} (a commit of this package's git checkout is needed)")
    return out.stdout.strip()


def env_commit(env: Any) -> str | None:
    """The git commit an ``env.json`` (as read) names: the code that made the run; None if unknown."""
    git = env.get("git") if isinstance(env, dict) else None
    commit = git.get("commit") if isinstance(git, dict) else None
    return commit if isinstance(commit, str) and commit else None


def record_commit(run_dir: Path) -> str | None:
    """The git commit a run's ``env.json`` names (``env_commit``); None if unknown or unreadable."""
    try:
        return env_commit(read_json(run_dir / "env.json"))
    except (OSError, ValueError):
        return None


def commit_date(commit: str) -> str | None:
    """The committer date of ``commit`` (ISO 8601), or None when this checkout lacks it."""
    try:
        out = _git("show", "-s", "--format=%cI", commit)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def made_after(run_dir: Path, commit: str) -> bool:
    """Whether the record in ``run_dir`` was made by code that contains ``commit`` (a full
    hash: ``resolve_commit``): its ``env.json`` commit is ``commit`` or a descendant of it.
    False when that cannot be shown: no commit recorded, or one this checkout does not
    have (made from another clone); a record's uncommitted changes are not looked at."""
    return commit_contains(record_commit(run_dir), commit)


def commit_contains(made: str | None, commit: str) -> bool:
    """Whether commit ``made`` (a record's: ``env_commit``) has ``commit`` in its history;
    False for an unknown ``made`` (None) or one this checkout lacks."""
    return made is not None and _contains(made, commit, str(CODE_ROOT))


@functools.lru_cache(maxsize=4096)
def _contains(made: str, commit: str, code_root: str) -> bool:
    """``commit_contains`` for a known ``made``: one git call per pair (a report over a
    thousand records made at a few commits asks git a few times)."""
    if made == commit:
        return True
    try:
        return _git("merge-base", "--is-ancestor", commit, made).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


# how a run's random streams were seeded (env.json): 2 = context.stream_seed (seed, settings,
# name); records without the key (older ones, CHANGELOG.md): 1, seed + offset
RNG_STREAMS = 2


def cpu_model() -> str | None:
    """The CPU's model name (``/proc/cpuinfo`` on Linux, else what ``platform`` knows)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def environment(device: str) -> dict[str, Any]:
    versions = {}
    for pkg in PACKAGES:
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    dev: dict[str, Any] = {"name": device}
    import torch

    if device.startswith("cuda") and torch.cuda.is_available():
        dev["gpu"] = torch.cuda.get_device_name(torch.device(device))
        dev["cuda"] = torch.version.cuda
        dev["cudnn"] = torch.backends.cudnn.version()
    dev["torch_threads"] = torch.get_num_threads()
    # the CPU's kernels decide a CPU run's numerics: the same seed draws other numbers on another
    # CPU type (docs/gpu.md, "Reproducibility"), so a record says which it ran on
    dev["cpu"] = cpu_model()
    dev["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "hostname": platform.node(),
        "cpu_count": os.cpu_count(),
        "device": dev,
        "packages": versions,
        "git": git_commit(),
        "rng_streams": RNG_STREAMS,
        "command": sys.argv,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def is_complete(run_dir: Path) -> bool:
    return (run_dir / COMPLETE_MARKER).is_file()


def iter_run_dirs(root: Path) -> Iterator[Path]:
    if not root.is_dir():
        return
    for p in sorted(root.iterdir()):
        if p.is_dir() and not p.name.startswith("."):
            yield p


class DamagedRecord(Exception):
    """A complete run directory whose record cannot be read as one: what is wrong, in one line."""


def _is_number(v: Any) -> bool:
    """A number as a record holds it (inf and nan are written as strings, see ``_finite``)."""
    if isinstance(v, bool):
        return False
    if isinstance(v, (int, float)):
        return True
    if not isinstance(v, str):
        return False
    try:
        float(v)
    except ValueError:
        return False
    return True


def _object(name: str, value: Any) -> dict:
    if not isinstance(value, dict):
        kind = "null" if value is None else f"a {type(value).__name__}"
        raise DamagedRecord(f"{name} holds {kind}, not an object")
    return value


def _numbers(name: str, obj: dict, key: str, fields: tuple[str, ...]) -> None:
    """``obj[key]`` is an object whose ``fields`` are numbers."""
    if key not in obj:
        raise DamagedRecord(f"{name} has no '{key}'")
    inner = _object(f"{name} '{key}'", obj[key])
    for field in fields:
        if not _is_number(inner.get(field)):
            raise DamagedRecord(f"{name} '{key}.{field}' is {inner.get(field)!r}, not a number")


def check_record(config: Any, privacy: Any, evaluation: Any) -> None:
    """Raise ``DamagedRecord`` unless the three files have the shape of a record."""
    config = _object("config.json", config)
    for key in ("method", "dataset"):
        if not isinstance(config.get(key), str):
            raise DamagedRecord(f"config.json has no '{key}'" if key not in config else
                                f"config.json '{key}' is {config[key]!r}, not a name")
    privacy = _object("privacy.json", privacy)
    _numbers("privacy.json", privacy, "target", ("epsilon", "delta"))
    _numbers("privacy.json", privacy, "epsilon", ("rdp", "prv"))
    evaluation = _object("eval.json", evaluation)
    metrics = _object("eval.json 'metrics'", evaluation.get("metrics", {}))
    bad = [k for k, v in metrics.items() if not _is_number(v)]
    if bad:
        raise DamagedRecord(f"eval.json metric '{bad[0]}' is {metrics[bad[0]]!r}, not a number")
    if not isinstance(evaluation.get("protocol", {}), dict):
        raise DamagedRecord("eval.json 'protocol' is not an object")


def load_record(run_dir: Path) -> dict[str, Any] | None:
    """The complete record of a run; None while it is incomplete (no ``eval.json``).
    ``DamagedRecord`` (with what is wrong) when a file cannot be read or is not the
    shape of a record."""
    if not is_complete(run_dir):
        return None
    files = {}
    for key in ("config", "privacy", "eval"):
        name = f"{key}.json"
        try:
            files[key] = read_json(run_dir / name)
        except FileNotFoundError:
            raise DamagedRecord(f"{name} is missing") from None
        except OSError as e:
            raise DamagedRecord(f"cannot read {name}: {e.strerror or e}") from None
        except ValueError as e:  # truncated or not JSON
            raise DamagedRecord(f"{name} is not valid JSON ({' '.join(str(e).split())})") from None
    check_record(files["config"], files["privacy"], files["eval"])
    try:
        finished = (run_dir / COMPLETE_MARKER).stat().st_mtime
    except OSError as e:
        raise DamagedRecord(f"cannot stat {COMPLETE_MARKER}: {e.strerror or e}") from None
    return {"run_dir": str(run_dir), **files, "finished": finished}
