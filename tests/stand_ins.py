"""Stand-in methods for tests: what the example method (methods/dummy.py) leaves out, kept
here so that the example stays the smallest file to copy. Register one for a test with the
``register_method`` fixture (tests/conftest.py)."""

from __future__ import annotations

import dataclasses

from methods.dummy import Dummy


class Overspending(Dummy):
    """Plans one private step fewer than it takes: the runner must refuse the run."""

    def plan(self, budget):
        return [dataclasses.replace(part, steps=part.steps - 1) for part in super().plan(budget)]


def new_method(quick_mnist_seconds: float) -> type:
    """A method file as a researcher adds it: a ``quick`` preset on mnist, and the measured
    seconds of one run of it (``Method.preset_seconds``)."""
    return type("NewMethod", (Dummy,), {"name": "new-method", "presets": {"quick": {"mnist": {"steps": 5}}},
                                        "preset_seconds": {"quick": {"mnist": quick_mnist_seconds}}})
