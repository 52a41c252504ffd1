import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


@pytest.fixture
def results(tmp_path, monkeypatch):
    """An isolated results root (and cwd) for CLI runs."""
    root = tmp_path / "runs"
    monkeypatch.setenv("DPGEN_RESULTS", str(root))
    monkeypatch.chdir(tmp_path)
    return root


@pytest.fixture
def cli_runner():
    from click.testing import CliRunner

    try:
        return CliRunner(mix_stderr=False)
    except TypeError:  # click ≥ 8.2 keeps stderr apart by default
        return CliRunner()


@pytest.fixture
def register_method(monkeypatch):
    """``register_method(name, cls, hidden=False)`` registers a method class (a stand-in:
    tests/stand_ins.py) for the test's duration."""
    from dpgen_bench import registry

    def register(name: str, cls: type, hidden: bool = False) -> type:
        monkeypatch.setitem(registry.methods._items, name, cls)
        monkeypatch.setitem(registry.methods._meta, name, {})
        monkeypatch.setattr(registry.methods, "_hidden", registry.methods._hidden | ({name} if hidden else set()))
        return cls

    return register


@pytest.fixture
def warnings_seen():
    """Messages of WARNING and above on the ``dpgen_bench`` logger (a handler of its own:
    the CLI may have turned the logger's propagation off)."""
    import logging

    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            if record.levelno >= logging.WARNING:
                seen.append(record.getMessage())

    logger = logging.getLogger("dpgen_bench")
    h = Keep()
    logger.addHandler(h)
    yield seen
    logger.removeHandler(h)


@pytest.fixture
def ray_exclusive():
    """One Ray test at a time on this machine: the two-node test ends with ``ray stop
    --force``, which kills every Ray process, a local instance of a test on the other
    pytest-xdist worker included. Their ``xdist_group("ray")`` was meant to keep them on one
    worker, but ``--dist loadgroup`` (xdist 3.8) ran them on two at once (a hung suite: under
    pytest 9.2 it ignored every group mark, ``_xdist_groups`` below); an exclusive lock on a
    file serialises them whatever the scheduler does."""
    import fcntl
    import tempfile

    with open(Path(tempfile.gettempdir()) / "dpgen_bench_ray_tests.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def pytest_configure(config):
    """Under pytest-xdist every worker gets its share of the cores as compute threads (torch's
    and numpy's BLAS), so that two workers on two cores do not run four threads (``make
    test``: ``-n 2``)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    if workers > 1:
        from dpgen_bench.sweep import cap_threads

        share = max(1, (os.cpu_count() or 1) // workers)
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):  # subprocesses too
            os.environ[var] = str(share)
        cap_threads(share)  # torch's and numpy's OpenBLAS, loaded before this hook with a thread per core


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    _xdist_groups(config, items)
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if item.get_closest_marker("gpu"):  # not `"gpu" in keywords`: that matches the tests/gpu folder
            item.add_marker(skip)


def _xdist_groups(config, items) -> None:
    """``--dist loadgroup`` on pytest 9.2: pytest-xdist 3.8 marks a grouped test by appending
    ``@group`` to its node id, but assigns the old string field, which pytest 9.2 no longer
    reads (its ids are structured), so every ``xdist_group`` mark was silently ignored: a
    module fixture trained once per worker, twice in all (pytest-dev/pytest-xdist#1386).
    Here the id the scheduler reads gets the suffix; a no-op where xdist's own assignment
    took effect (older pytest, or xdist once fixed)."""
    if not getattr(config.option, "loadgroup", False):  # set on workers under --dist loadgroup
        return
    try:
        from _pytest.nodeid import NodeId  # pytest ≥ 9.2
    except ImportError:
        return
    for item in items:
        names = {str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                 for m in item.iter_markers("xdist_group")}
        suffix = "@" + "_".join(sorted(names))
        if names and not item.nodeid.endswith(suffix):
            item._id = NodeId.parse(item.nodeid + suffix)


os.environ.setdefault("PYTHONHASHSEED", "0")


@pytest.fixture(autouse=True)
def _fresh_privacy_caches_under_mutation_testing():
    """Under mutmut (``make mutate``) every test of a mutant runs in a process forked from one
    that has already run the suite once: the accountant's memoised curves (``lru_cache`` in
    privacy/accounting.py, the series' tables in privacy/rdp_orders.py) would answer from
    what the *unmutated* code computed, and a mutant of a cached function could never be
    seen (rdp_curve's mutants all "survived" that way, while the tests kill them when run
    directly). Cleared before each test there; left alone in the normal suite (the caches
    are what keep it fast)."""
    if "MUTANT_UNDER_TEST" in os.environ:
        from opacus.accountants.analysis import rdp as opacus_rdp

        from dpgen_bench.privacy import accounting, rdp_orders

        for fn in (*vars(accounting).values(), *vars(rdp_orders).values(), opacus_rdp._compute_rdp):
            if callable(getattr(fn, "cache_clear", None)):
                fn.cache_clear()
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """``DPGEN_TEST_CPU=FILE``: append each test's CPU seconds (this process plus the children
    it reaped during the test) as ``seconds<TAB>test id<TAB>worker<TAB>start<TAB>end`` lines
    to FILE (start and end: wall-clock seconds since the epoch, to see how the workers' time
    lines up). Wall times (``--durations``) of tests that share two cores measure the
    neighbours as much as the test; CPU seconds are what a test costs the suite."""
    path = os.environ.get("DPGEN_TEST_CPU")
    if not path:
        yield
        return
    import resource
    import time

    def cpu() -> float:
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)
        return time.process_time() + kids.ru_utime + kids.ru_stime

    start, t0 = cpu(), time.time()
    yield
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    with open(path, "a") as f:
        f.write(f"{cpu() - start:.2f}\t{item.nodeid}\t{worker}\t{t0:.2f}\t{time.time():.2f}\n")
