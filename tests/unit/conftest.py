"""Fixtures shared by the Inception extractor and FID / KID tests."""

from __future__ import annotations

import shutil

import pytest


@pytest.fixture
def inception_cache(tmp_path, monkeypatch):
    """An empty ``$DPGEN_CACHE`` and no in-process extractor or memo; yields the directory
    where the ``inception`` cache will live (created on first use)."""
    from evaluators import inception

    monkeypatch.setenv("DPGEN_CACHE", str(tmp_path / "cache"))
    inception.clear_memory_cache()
    yield tmp_path / "cache" / inception.CACHE_KIND
    inception.clear_memory_cache()


@pytest.fixture(scope="session")
def inception_weights(tmp_path_factory):
    """The converted Inception weights, made once per session (tests copy them into their cache)."""
    from evaluators import inception

    mp = pytest.MonkeyPatch()
    mp.setenv("DPGEN_CACHE", str(tmp_path_factory.mktemp("weights")))
    try:
        yield inception.converted_weights_path()
    finally:
        mp.undo()


@pytest.fixture
def warm_inception_cache(inception_cache, inception_weights):
    """``inception_cache`` with the converted weights already in it."""
    inception_cache.mkdir(parents=True, exist_ok=True)
    shutil.copy(inception_weights, inception_cache / inception_weights.name)
    return inception_cache


@pytest.fixture
def one_thread():
    """torch on one intra-op thread for the test (restored after): timings and float sums as on a worker."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
