"""The privacy ledger: the runner's own count of every private step a method takes.

A method declares its calibrated parts (``plan``) before training and calls
``spend(name)`` once per private step. Spending beyond the plan raises
``PrivacyViolation`` at once, so a misbehaving method cannot exceed its budget silently;
the final report is composed from the steps actually taken, not from what the method
claims.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from ..api import Budget, PrivacyPart, PrivacyReport
from ..errors import PrivacyViolation
from .accounting import compose_prv, compose_rdp, part_epsilon


class PrivacyLedger:
    def __init__(self, budget: Budget, planned: Sequence[PrivacyPart]):
        names = [p.name for p in planned]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate privacy part names: {names}")
        self.budget = budget
        self.planned = {p.name: p for p in planned}
        self.taken = {p.name: 0 for p in planned}
        if budget.private:
            planned_eps = compose_rdp(list(planned), budget.delta)
            if planned_eps > budget.epsilon:
                raise PrivacyViolation(
                    f"planned ε={planned_eps:.4f} exceeds the target ε={budget.epsilon} before training"
                )
        elif planned:
            raise PrivacyViolation("a non-private run cannot declare private parts")

    def spend(self, name: str, steps: int = 1) -> None:
        if name not in self.planned:
            raise PrivacyViolation(f"private step on undeclared part '{name}'")
        if self.taken[name] + steps > self.planned[name].steps:
            raise PrivacyViolation(
                f"part '{name}' took more than its calibrated {self.planned[name].steps} steps"
            )
        self.taken[name] += steps

    def remaining(self, name: str) -> int:
        return self.planned[name].steps - self.taken[name]

    def parts(self) -> list[PrivacyPart]:
        out = []
        for name, plan in self.planned.items():
            part = dataclasses.replace(plan, steps=self.taken[name])
            out.append(dataclasses.replace(part, epsilon=part_epsilon(part, self.budget.delta)))
        return out

    def report(self) -> PrivacyReport:
        b = self.budget
        if not b.private:
            return PrivacyReport(private=False, target_epsilon=float("inf"), target_delta=b.delta,
                                 epsilon_rdp=float("inf"), epsilon_prv=float("inf"))
        parts = self.parts()
        return PrivacyReport(
            private=True,
            target_epsilon=b.epsilon,
            target_delta=b.delta,
            parts=tuple(parts),
            epsilon_rdp=compose_rdp(parts, b.delta),
            epsilon_prv=compose_prv(parts, b.delta),
        )


def planned_report(budget: Budget, planned: Sequence[PrivacyPart]) -> PrivacyReport:
    """The report a run would have if it takes every planned step (``bench privacy``)."""
    ledger = PrivacyLedger(budget, planned)
    for p in planned:
        ledger.taken[p.name] = p.steps
    return ledger.report()
