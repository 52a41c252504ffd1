"""The one cache resolver: ``$DPGEN_CACHE/<kind>``, else ``~/.cache/dpgen_bench/<kind>``,
created on demand, one UserError line when it cannot be written."""

from __future__ import annotations

import os

import pytest
import torch

from dpgen_bench.cache import cache_dir
from dpgen_bench.errors import UserError


def test_under_dpgen_cache_when_set(tmp_path, monkeypatch):
    monkeypatch.setenv("DPGEN_CACHE", str(tmp_path / "c"))
    path = cache_dir("datasets")
    assert path == tmp_path / "c" / "datasets" and path.is_dir()
    assert cache_dir("inception") == tmp_path / "c" / "inception"
    assert cache_dir("datasets") == path  # existing: reused
    assert not [p for p in path.iterdir()]  # the write probe leaves nothing behind


def test_under_the_home_cache_when_unset_or_empty(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for unset in (True, False):
        if unset:
            monkeypatch.delenv("DPGEN_CACHE", raising=False)
        else:
            monkeypatch.setenv("DPGEN_CACHE", "")
        path = cache_dir("mia_reference")
        assert path == tmp_path / "home" / ".cache" / "dpgen_bench" / "mia_reference" and path.is_dir()


def test_tilde_in_dpgen_cache_is_expanded(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("DPGEN_CACHE", "~/elsewhere")
    assert cache_dir("datasets") == tmp_path / "elsewhere" / "datasets"


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root can write anywhere")
def test_unwritable_directory_is_one_user_error_line(tmp_path, monkeypatch):
    locked = tmp_path / "locked"
    locked.mkdir()
    monkeypatch.setenv("DPGEN_CACHE", str(locked))
    (locked / "inception").mkdir()
    locked.chmod(0o555)
    (locked / "inception").chmod(0o555)
    try:
        for kind in ("datasets", "inception"):  # cannot be created / exists but cannot be written
            with pytest.raises(UserError) as e:
                cache_dir(kind)
            msg = str(e.value)
            assert "\n" not in msg and str(locked / kind) in msg
            assert "set $DPGEN_CACHE to a writable directory" in msg
    finally:
        (locked / "inception").chmod(0o755)
        locked.chmod(0o755)


def test_a_refused_write_is_one_user_error_line(tmp_path, monkeypatch):
    """The same check as above where the tests run as root (chmod does not stop root)."""
    import tempfile

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setenv("DPGEN_CACHE", str(tmp_path))
    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    with pytest.raises(UserError, match=r"^cannot write the inception cache at .* \(Permission denied\): "
                                        r"set \$DPGEN_CACHE to a writable directory$"):
        cache_dir("inception")


def test_a_file_in_the_way_is_one_user_error_line(tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    monkeypatch.setenv("DPGEN_CACHE", str(blocker))
    with pytest.raises(UserError, match=r"^cannot write the datasets cache at .*not-a-directory/datasets .*: "
                                        r"set \$DPGEN_CACHE to a writable directory$"):
        cache_dir("datasets")


@pytest.mark.parametrize("kind", ["", ".", "..", "a/b"])
def test_kind_is_a_plain_name(kind, tmp_path, monkeypatch):
    monkeypatch.setenv("DPGEN_CACHE", str(tmp_path))
    with pytest.raises(ValueError):
        cache_dir(kind)


def test_every_cache_uses_the_resolver(tmp_path, monkeypatch):
    """Datasets, Inception weights / statistics and MIA reference models all live in one
    root, one directory per kind."""
    from dpgen_bench.data import files
    from evaluators import inception, mia

    monkeypatch.setenv("DPGEN_CACHE", str(tmp_path))
    assert cache_dir(files.CACHE_KIND) == tmp_path / "datasets"
    stats = inception.real_stats_path("digits", "test", torch.zeros(2, 1, 8, 8), "0" * 40)
    assert stats.parent == tmp_path / "inception" and stats.parent.is_dir()
    assert mia._cache_dir() == tmp_path / "mia_reference"
