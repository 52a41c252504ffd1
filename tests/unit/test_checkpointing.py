"""When a run writes its resume checkpoint: every $DPGEN_CHECKPOINT_SECONDS, but never so
often that writing checkpoints takes more than ~5% of training."""

import time
from types import SimpleNamespace

import torch

from dpgen_bench.context import RESUME_FILE, TrainingContext


def _ctx(tmp_path):
    return TrainingContext(torch.device("cpu"), 0, SimpleNamespace(taken={"d": 3}), tmp_path)


def test_a_slow_checkpoint_spaces_out_the_next(tmp_path, monkeypatch):
    monkeypatch.setenv("DPGEN_CHECKPOINT_SECONDS", "10")
    ctx = _ctx(tmp_path)
    try:
        ctx._last_checkpoint = time.time() - 11
        assert ctx.checkpoint_due()  # cheap checkpoints: the interval rules
        ctx._checkpoint_seconds = 2.0  # the last one took 2 s to write: wait 40 s, not 10
        assert not ctx.checkpoint_due()
        ctx._last_checkpoint = time.time() - 41
        assert ctx.checkpoint_due()
    finally:
        ctx.close()


def test_interval_zero_checkpoints_at_every_chance_and_a_stop_request_always(tmp_path, monkeypatch):
    ctx = _ctx(tmp_path)
    try:
        ctx._checkpoint_seconds = 100.0
        monkeypatch.setenv("DPGEN_CHECKPOINT_SECONDS", "0")
        assert ctx.checkpoint_due()
        monkeypatch.setenv("DPGEN_CHECKPOINT_SECONDS", "300")
        assert not ctx.checkpoint_due()
        ctx.stop_requested = 15
        assert ctx.checkpoint_due()
    finally:
        ctx.close()


def test_checkpoint_records_its_write_time_and_device(tmp_path):
    ctx = _ctx(tmp_path)
    try:
        ctx.checkpoint({"w": torch.zeros(1000)})
        assert ctx._checkpoint_seconds > 0
        saved = torch.load(tmp_path / RESUME_FILE, weights_only=True)
        assert saved["ledger"] == {"d": 3} and saved["device"] == "cpu"
    finally:
        ctx.close()
