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


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if item.get_closest_marker("gpu"):  # not `"gpu" in keywords`: that matches the tests/gpu folder
            item.add_marker(skip)


os.environ.setdefault("PYTHONHASHSEED", "0")
