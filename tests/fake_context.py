"""A minimal RunContext for calling ``Method.fit`` directly in unit tests (no runner,
no checkpoints, silent progress)."""

import torch

from dpgen_bench.api import RunContext


class _Bar:
    def update(self, n=1):
        pass

    def close(self):
        pass


class FakeContext(RunContext):
    def __init__(self, ledger, seed=0):
        self.device = torch.device("cpu")
        self.seed = seed
        self.ledger = ledger
        self.records = []

    def progress(self, total, desc):
        return _Bar()

    def record(self, **values):
        self.records.append(values)
