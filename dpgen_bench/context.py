"""``TrainingContext``: the ``RunContext`` that ``Method.fit`` gets from the runner, also
usable on its own (an evaluator's reference model, a notebook, a test) with no run
directory: then nothing is written and checkpoints are never due."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch

from . import store
from .api import PrivacyPart, RunContext
from .errors import Interrupted
from .privacy.ledger import PrivacyLedger
from .privacy.telemetry import GradientTelemetry

RESUME_FILE = "resume.pt"
# resume.pt layout: {"format", "method", "ledger", "rng", "time", "device"} and, optional, "telemetry"
CHECKPOINT_FORMAT = 2
log = logging.getLogger("dpgen_bench")


def checkpoint_interval() -> float:
    return float(os.environ.get("DPGEN_CHECKPOINT_SECONDS", "300"))


def progress_interval() -> float:
    """Seconds between progress lines when stderr is not a terminal (``$DPGEN_PROGRESS_SECONDS``, default 30)."""
    return float(os.environ.get("DPGEN_PROGRESS_SECONDS", "30"))


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s" if m else f"{s}s"


class LogProgress:
    """A progress bar for a stderr that is not a terminal (a log file, a job scheduler, CI),
    where tqdm prints nothing: a log line every ``interval`` seconds with the phase,
    step / total, steps/s and ETA, and one when the phase ends. The rate counts from the
    first update (a resumed run's jump to its start step is not a step taken here)."""

    def __init__(self, total: int, desc: str, interval: float):
        self.total, self.desc, self.interval, self.n = int(total), desc, interval, 0
        self._t0 = self._last = self._t_first = time.monotonic()
        self._n0: int | None = None  # n at the first update
        self._closed = False

    def update(self, n: int = 1) -> None:
        now = time.monotonic()
        if self._n0 is None:
            self._n0, self._t_first = self.n + n, now
        self.n += n
        if now - self._last >= self.interval and self.n < self.total:
            self._last = now
            log.info("%s", self.line(now))

    def line(self, now: float | None = None) -> str:
        now = time.monotonic() if now is None else now
        done = self.n - (self._n0 or 0)
        rate = done / (now - self._t_first) if done > 0 and now > self._t_first else None
        pct = f" ({100 * self.n / self.total:.0f}%)" if self.total else ""
        speed = f", {rate:.3g} steps/s" if rate else ""
        eta = f", ETA {_duration((self.total - self.n) / rate)}" if rate and self.total >= self.n else ""
        return f"{self.desc}: step {self.n}/{self.total}{pct}{speed}{eta}"

    def close(self) -> None:
        if self._n0 is not None and not self._closed:
            log.info("%s: %d/%d steps in %s", self.desc, self.n, self.total, _duration(time.monotonic() - self._t0))
        self._closed = True

    def set_postfix(self, *args: Any, **kwargs: Any) -> None:
        return None


def stream_seed(seed: int, name: str, key: str = "") -> int:
    """A 63-bit seed for the stream ``name`` of a run with ``seed`` and settings ``key``:
    the first 8 bytes of SHA-256 over the three."""
    digest = hashlib.sha256(f"{int(seed)}\x1f{key}\x1f{name}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


class TrainingContext(RunContext):
    """Privacy counts through ``ledger``; generators, checkpoints and ``train.jsonl`` in
    ``run_dir`` (None: none of them); ``resume``: a checkpoint read by the runner."""

    # a checkpoint is written at most every CHECKPOINT_OVERHEAD⁻¹ × its own write time, so a
    # large one (GS-WGAN's paper preset: 1,000 discriminators and their Adam states, ~13 GB)
    # never takes more than ~5% of training, whatever $DPGEN_CHECKPOINT_SECONDS says
    CHECKPOINT_OVERHEAD = 0.05

    def __init__(self, device: torch.device, seed: int, ledger: PrivacyLedger, run_dir: Path | None = None,
                 resume: dict | None = None, audit=None, stream_key: str = ""):
        self.device = torch.device(device)
        self.audit = audit  # privacy.canaries.GradientAudit under bench audit --white-box, else None
        self.seed = seed
        self.stream_key = stream_key  # the run's training settings (config.stream_key): see generator
        self.ledger = ledger
        self.run_dir = run_dir
        self.stop_requested: int | None = None
        self._resume = resume
        self.resuming = resume is not None
        self._restored = False
        self._generators: dict[str, torch.Generator] = {}
        log_path = run_dir / "train.jsonl" if run_dir else None
        if log_path and resume and resume.get("train_log_bytes") is not None and log_path.is_file():
            # lines written after the checkpoint describe steps the resumed run redoes: cut them
            with open(log_path, "r+b") as f:
                f.truncate(min(resume["train_log_bytes"], log_path.stat().st_size))  # never pads with zeros
        self._train_log = open(log_path, "a") if log_path else None  # noqa: SIM115
        self._means: dict[str, list[float]] = dict(resume.get("means", {})) if resume else {}
        self._t0 = self._last_checkpoint = time.time()
        self._t0 -= resume.get("elapsed", 0.0) if resume else 0.0  # train.jsonl's times go on
        self._checkpoint_seconds = 0.0  # how long the last checkpoint took to write
        self.telemetry = GradientTelemetry()  # measured gradient norms: a diagnostic (privacy.telemetry)
        if resume and resume.get("telemetry"):
            self.telemetry.load_state_dict(resume["telemetry"])
        if resume:
            for name, taken in resume["ledger"].items():
                if taken:
                    ledger.spend(name, taken)  # the steps already spent stay spent

    # ------------------------------------------------------------------ privacy

    def part(self, name: str) -> PrivacyPart:
        return self.ledger.part(name)

    def spend(self, name: str, steps: int = 1) -> None:
        self.ledger.spend(name, steps)

    def watch(self, part: str, mechanism: Any) -> None:
        if self.audit is not None:
            self.audit.watch(part, self.part(part), mechanism)

    def observe(self, part: str, *, norms, clip: float, clipped_sum_norm: float, noise_norm: float) -> None:
        self.telemetry.observe(part, norms=norms, clip=clip, clipped_sum_norm=clipped_sum_norm,
                               noise_norm=noise_norm)

    # --------------------------------------------------------------- randomness

    def generator(self, name: str, offset: int = 0) -> torch.Generator:
        """The run's random stream ``name``, seeded by ``stream_seed(seed, name, stream_key)``:
        a run's streams are independent of one another and of every other run's, so no run
        releases another's noise (dpmerf's released frequencies at seed s were the noise of
        its run at seed s + 2 while streams were seeded ``seed + offset``), and two runs of
        the same seed at different ε or settings do not share their noise (two releases of
        one sum with the same draw, scaled by different σ, give the sum back exactly).
        ``offset`` is ignored (streams are told apart by name); kept for plugins that pass it."""
        if name in self._generators:
            raise ValueError(f"generator '{name}' was already made in this run")
        g = torch.Generator(device=self.device).manual_seed(stream_seed(self.seed, name, self.stream_key))
        if self._restored:
            g.set_state(self._resume["rng"]["generators"][name])
        self._generators[name] = g
        return g

    def _rng_state(self) -> dict:
        cuda = self.device.type == "cuda"
        return {"torch": torch.get_rng_state(), "cuda": torch.cuda.get_rng_state(self.device) if cuda else None,
                "generators": {k: g.get_state() for k, g in self._generators.items()}}

    @property
    def restored(self) -> bool:
        """Whether ``restore()`` was called (a resumed run must call it)."""
        return self._restored

    def restore(self) -> dict | None:
        if self._resume is None:
            return None
        if self._restored:
            raise RuntimeError("restore() was already called in this run")
        rng = self._resume["rng"]
        torch.set_rng_state(rng["torch"])
        if rng["cuda"] is not None and self.device.type == "cuda":
            torch.cuda.set_rng_state(rng["cuda"], self.device)
        for name, g in self._generators.items():
            g.set_state(rng["generators"][name])
        self._restored = True
        return self._resume["method"]

    # -------------------------------------------------------------- checkpoints

    def checkpoint_due(self) -> bool:
        if self.run_dir is None:
            return False
        if self.stop_requested is not None:
            return True
        interval = checkpoint_interval()
        if interval <= 0:  # "every chance" (tests, debugging): no overhead cap
            return True
        wait = max(interval, self._checkpoint_seconds / self.CHECKPOINT_OVERHEAD)
        return time.time() - self._last_checkpoint >= wait

    def checkpoint(self, state: dict) -> None:
        if self.run_dir is None:
            return
        t = time.time()
        with store.atomic_open(self.run_dir / RESUME_FILE) as f:
            torch.save({"format": CHECKPOINT_FORMAT, "method": state, "ledger": dict(self.ledger.taken),
                        "rng": self._rng_state(), "time": time.time(), "device": self.device.type,
                        "telemetry": self.telemetry.state_dict(), "means": {k: list(v) for k, v in self._means.items()},
                        "train_log_bytes": self._train_log.tell() if self._train_log else None,
                        "elapsed": time.time() - self._t0}, f)
        self._last_checkpoint = time.time()
        self._checkpoint_seconds = self._last_checkpoint - t
        if self.stop_requested is not None:
            raise Interrupted(f"stopped by signal {self.stop_requested} after a checkpoint")

    # -------------------------------------------------------- progress, records

    def progress(self, total: int, desc: str):
        """tqdm's bar on a terminal; elsewhere a log line every ``progress_interval()`` seconds."""
        if not sys.stderr.isatty():
            return LogProgress(total, desc, progress_interval())
        from tqdm.auto import tqdm

        return tqdm(total=total, desc=desc, file=sys.stderr, mininterval=2.0, leave=False, disable=None)

    def accumulate(self, **values: float) -> None:
        for key, v in values.items():
            acc = self._means.setdefault(key, [0.0, 0])  # [sum, count]
            acc[0] += float(v)
            acc[1] += 1

    def record(self, **values: Any) -> None:
        means = {key: total / n for key, (total, n) in self._means.items() if n}
        self._means = {}
        gradients = self.telemetry.window()  # the private parts' steps since the last line
        self._write({"time": round(time.time() - self._t0, 3), **means, **values,
                     **({"gradients": gradients} if gradients else {})})

    def _write(self, line: dict) -> None:
        if self._train_log:
            self._train_log.write(store.json_line(line))
            self._train_log.flush()

    def close(self) -> None:
        if self._train_log:
            self._train_log.close()


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)  # what asks a run to checkpoint and stop (and a sweep: sweep.py)


@contextlib.contextmanager
def handling_stops(handler):
    """``handler`` answers STOP_SIGNALS while the block runs, the previous handlers after it;
    off the main thread (where Python cannot install handlers) nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, previous in old.items():
            signal.signal(sig, previous)


@contextlib.contextmanager
def stop_on_signals(ctx: TrainingContext):
    """SIGINT / SIGTERM ask the method to checkpoint and stop (main thread only); a second
    one stops now (KeyboardInterrupt), without a checkpoint."""

    def ask_to_stop(signum, frame):
        if ctx.stop_requested is not None:
            raise KeyboardInterrupt
        ctx.stop_requested = signum

    with handling_stops(ask_to_stop):
        yield
