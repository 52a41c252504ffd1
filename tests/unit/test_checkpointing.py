"""When a run writes its resume checkpoint: every $DPGEN_CHECKPOINT_SECONDS, but never so
often that writing checkpoints takes more than ~5% of training."""

import json
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


def test_a_resumed_log_continues_from_the_checkpoint(tmp_path):
    """``accumulate``'s means go into the next line (a value given to ``record`` wins) and are
    then emptied; the checkpoint carries the window in progress and the log's length, so a
    resumed context cuts the lines written after it and finishes the window's mean."""
    ctx = _ctx(tmp_path)
    ctx.accumulate(loss=1.0)
    ctx.accumulate(loss=3.0, acc=0.5)
    ctx.record(step=1, acc=0.9)
    ctx.accumulate(loss=5.0)
    ctx.checkpoint({})
    ctx.accumulate(loss=100.0)
    ctx.record(step=2)  # after the checkpoint: the resumed run redoes this step
    ctx.close()
    resume = torch.load(tmp_path / RESUME_FILE, weights_only=True)
    again = TrainingContext(torch.device("cpu"), 0, SimpleNamespace(taken={}, spend=lambda *a: None), tmp_path,
                            resume=resume)
    again.accumulate(loss=7.0)
    again.record(step=2)
    again.record(step=3)  # an empty window: no mean
    again.close()
    lines = [json.loads(x) for x in (tmp_path / "train.jsonl").read_text().splitlines()]
    assert [{k: v for k, v in x.items() if k != "time"} for x in lines] == [
        {"step": 1, "loss": 2.0, "acc": 0.9}, {"step": 2, "loss": 6.0}, {"step": 3}]
    assert [x["time"] for x in lines] == sorted(x["time"] for x in lines)  # times go on across the resume
