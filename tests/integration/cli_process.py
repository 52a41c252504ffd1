"""``bench`` runs in child processes that a test can kill, interrupt or wait for, started
from a fork server that imported the CLI once.

The resume tests kill runs mid-training (SIGKILL, SIGINT, SIGTERM); each such run used to be
a fresh interpreter, and importing torch, Opacus and the methods cost ~7 CPU-s of its
~10–20. Here the children are forked from multiprocessing's fork server, a
single-threaded process that imported ``dpgen_bench.cli`` and the methods once per pytest
worker, so a child starts at once with nothing inherited from the test process (its
threads, its open files) but those imports. A child sets its environment and its one
compute thread, sends stderr to a file, and runs the CLI as ``bench`` would; the object it
returns answers like ``subprocess.Popen`` (``poll``, ``send_signal``, ``wait``,
``communicate``, ``returncode``) for what these tests use.
"""

from __future__ import annotations

import multiprocessing
import os
import tempfile
import time
from pathlib import Path

_PRELOAD = ["dpgen_bench.cli", "dpgen_bench.runner", "methods", "evaluators"]
_context = None


def _ctx():
    global _context
    if _context is None:
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload(_PRELOAD)
    return _context


def _child(args: list[str], env: dict[str, str], cwd: str, err_path: str) -> None:
    os.environ.update(env)
    os.chdir(cwd)
    err = os.open(err_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(err, 2)
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
    from dpgen_bench.cli import cli
    from dpgen_bench.sweep import cap_threads

    cap_threads(1)  # torch's and numpy's BLAS: the server loaded them before this child's environment

    cli(args)  # click's standalone mode: ends with SystemExit(code), the process's exit code


class CliProcess:
    """``bench ARGS`` in a forked child (module docstring); stdout is discarded."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None, cwd: str | Path = "."):
        fd, self._err = tempfile.mkstemp(prefix="bench-stderr-", suffix=".txt")
        os.close(fd)
        self._proc = _ctx().Process(target=_child, args=(list(args), dict(env or {}), str(cwd), self._err),
                                    daemon=True)
        self._proc.start()
        self.pid = self._proc.pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None and not self._proc.is_alive():
            self._proc.join()
            self.returncode = self._proc.exitcode  # −N: killed by signal N, as Popen says
            self._stderr = Path(self._err).read_text()  # kept; the file goes at once
            os.unlink(self._err)
        return self.returncode

    def stderr_so_far(self) -> str:
        """What the running child has written to stderr yet."""
        return Path(self._err).read_text() if self.returncode is None else self._stderr

    def send_signal(self, sig: int) -> None:
        os.kill(self.pid, sig)

    def wait(self, timeout: float | None = None) -> int:
        self._proc.join(timeout)
        if self._proc.is_alive():
            raise TimeoutError(f"bench child {self.pid} still running after {timeout} s")
        return self.poll()

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        self.wait(timeout)
        return "", self._stderr

    def kill(self) -> None:
        if self._proc.is_alive():
            self._proc.kill()
        self.wait()


def wait_until(predicate, proc: CliProcess, timeout: float = 240, every: float = 0.05) -> None:
    """Until ``predicate()``; fails with the child's stderr if it exits first."""
    t = time.time()
    while not predicate():
        assert proc.poll() is None, proc.communicate()[1]
        assert time.time() - t < timeout, "no checkpoint appeared"
        time.sleep(every)
