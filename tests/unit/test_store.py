"""The atomic write protocol (``store.atomic_path`` / ``atomic_open``): a temp file in the
same directory, with the umask's mode, fsynced and renamed; nothing is left under the
final name or beside it when the writer fails."""

from __future__ import annotations

import os
import stat

import pytest

from dpgen_bench import store


def _leftovers(directory):
    return [p.name for p in directory.iterdir() if p.name.endswith(".tmp")]


def test_atomic_open_writes_binary_and_text(tmp_path):
    with store.atomic_open(tmp_path / "a.bin") as f:
        f.write(b"\x00\x01")
    with store.atomic_open(tmp_path / "a.txt", "w") as f:
        f.write("hello\n")
    assert (tmp_path / "a.bin").read_bytes() == b"\x00\x01"
    assert (tmp_path / "a.txt").read_text() == "hello\n"
    assert not _leftovers(tmp_path)
    with pytest.raises(ValueError):
        with store.atomic_open(tmp_path / "a.txt", "ab"):
            pass


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temp(tmp_path):
    target = tmp_path / "eval.json"
    store.write_json(target, {"old": 1})
    with pytest.raises(RuntimeError):
        with store.atomic_open(target, "w") as f:
            f.write('{"new": ')
            raise RuntimeError("crash mid-write")
    assert store.read_json(target) == {"old": 1}
    assert not _leftovers(tmp_path)
    with pytest.raises(RuntimeError):
        with store.atomic_path(tmp_path / "never.npy") as tmp:
            tmp.write_bytes(b"partial")
            raise RuntimeError("crash mid-build")
    assert not (tmp_path / "never.npy").exists() and not _leftovers(tmp_path)


def test_atomic_path_hands_over_a_temp_file_by_name(tmp_path):
    target = tmp_path / "big.npy"
    with store.atomic_path(target) as tmp:
        assert tmp.parent == tmp_path and tmp.name.startswith(".big.npy.") and tmp.name.endswith(".tmp")
        assert tmp.exists() and not target.exists()  # nothing under the final name while writing
        fd = os.open(tmp, os.O_WRONLY)  # e.g. pwrite from worker processes
        try:
            os.pwrite(fd, b"rows", 0)
        finally:
            os.close(fd)
    assert target.read_bytes() == b"rows" and not _leftovers(tmp_path)


def test_files_get_the_umask_mode_not_0600(tmp_path):
    old = os.umask(0o022)
    try:
        with store.atomic_open(tmp_path / "shared.pt") as f:
            f.write(b"x")
        with store.atomic_path(tmp_path / "shared.npy") as tmp:
            tmp.write_bytes(b"x")
    finally:
        os.umask(old)
    for name in ("shared.pt", "shared.npy"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o644
