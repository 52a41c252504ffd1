"""Log lines to stderr (data goes to stdout): ``setup_logging`` for the CLI, sweep workers
and notebooks."""

from __future__ import annotations

import logging
import sys

LOGGER = "dpgen_bench"


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at the time (test runners swap it)."""

    def emit(self, record):
        self.stream = sys.stderr
        super().emit(record)


def setup_logging(verbose: bool = False) -> None:
    """``[bench] message`` lines on stderr, INFO and up (DEBUG with ``verbose``)."""
    logger = logging.getLogger(LOGGER)
    if not logger.handlers:
        h = _StderrHandler(sys.stderr)
        h.setFormatter(logging.Formatter("[bench] %(message)s"))
        logger.addHandler(h)
    logger.setLevel(logging.DEBUG if verbose else logging.INFO)
    logger.propagate = False
