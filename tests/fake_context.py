"""A ``TrainingContext`` for calling ``Method.fit`` directly in unit tests (no runner, no
run directory, silent progress, records kept in a list)."""

import torch

from dpgen_bench.context import TrainingContext


class _Bar:
    def update(self, n=1):
        pass

    def close(self):
        pass


class FakeContext(TrainingContext):
    def __init__(self, ledger, seed=0, device="cpu"):
        super().__init__(torch.device(device), seed, ledger)
        self.records = []

    def progress(self, total, desc):
        return _Bar()

    def _write(self, line):
        self.records.append({k: v for k, v in line.items() if k != "time"})


class PartContext:
    """Just enough of a RunContext for ``make_private`` alone: one part ``"d"`` with the
    given noise multiplier and no step limit; ``spent`` counts the optimizer's steps."""

    def __init__(self, noise_multiplier: float, name: str = "d"):
        from dpgen_bench.api import PrivacyPart

        self._part = PrivacyPart(name, noise_multiplier, 1.0, 10**9)
        self.spent = 0
        self.watched = []  # (part, mechanism) pairs handed to watch: a white-box audit's hook

    def part(self, name):
        assert name == self._part.name
        return self._part

    def spend(self, name, steps=1):
        self.spent += steps

    def watch(self, name, mechanism):
        self.watched.append((name, mechanism))
