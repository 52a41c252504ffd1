"""Progress of a training run: tqdm's bar on a terminal, a log line every N seconds
elsewhere (a log file, a job scheduler, CI), so that a long run never looks frozen."""

import io
import logging

import torch

from dpgen_bench import context
from dpgen_bench.api import Budget
from dpgen_bench.context import LogProgress, TrainingContext
from dpgen_bench.privacy.ledger import PrivacyLedger


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _ctx() -> TrainingContext:
    return TrainingContext(torch.device("cpu"), 0, PrivacyLedger(Budget(float("inf")), []))


def test_a_terminal_gets_tqdm_and_a_log_file_gets_log_lines(monkeypatch):
    from tqdm.auto import tqdm

    monkeypatch.setattr("sys.stderr", _Terminal())
    bar = _ctx().progress(10, "phase")
    assert isinstance(bar, tqdm)
    bar.close()
    monkeypatch.setattr("sys.stderr", io.StringIO())
    monkeypatch.setenv("DPGEN_PROGRESS_SECONDS", "45")
    bar = _ctx().progress(10, "phase")
    assert isinstance(bar, LogProgress) and bar.interval == 45.0


def test_log_lines_say_phase_step_rate_and_eta_every_interval(monkeypatch, caplog):
    clock = [1000.0]
    monkeypatch.setattr(context.time, "monotonic", lambda: clock[0])
    bar = LogProgress(1000, "dpgan D steps", interval=30)
    with caplog.at_level(logging.INFO, logger="dpgen_bench"):
        bar.update(100)  # a resumed run's jump to its start step: not a step taken here
        for _ in range(40):  # 40 steps over 40 s: one line at 30 s
            clock[0] += 1
            bar.update(1)
        clock[0] += 20
        bar.update(60)
        bar.close()
        bar.close()
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["dpgan D steps: step 130/1000 (13%), 1 steps/s, ETA 14m30s",
                     "dpgan D steps: step 200/1000 (20%), 1.67 steps/s, ETA 8m00s",
                     "dpgan D steps: 200/1000 steps in 1m00s"]


def test_no_line_before_the_first_interval(monkeypatch, caplog):
    clock = [0.0]
    monkeypatch.setattr(context.time, "monotonic", lambda: clock[0])
    bar = LogProgress(10, "short", interval=30)
    with caplog.at_level(logging.INFO, logger="dpgen_bench"):
        for _ in range(10):
            clock[0] += 0.5
            bar.update(1)
    assert caplog.records == []
