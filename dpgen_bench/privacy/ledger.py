"""The privacy ledger: the runner's own count of every private step a method takes.

A method declares its calibrated parts (``plan``) before training; each private step is
counted (``RunContext.spend``, or the DPSGD optimizer's step) before its output is used.
Spending beyond the plan raises ``PrivacyViolation`` at once, so a misbehaving method
cannot exceed its budget silently; the final report is composed from the steps actually
taken, not from what the method claims.

``switch_noise_off`` turns a ledger into the diagnostic of ``bench run --noise-off``: the
same plan (steps, sample rates, clipping) with every part's noise multiplier handed to the
method as 0, and a report of ε = ∞ that keeps the calibrated σ it replaced. With part names
(``--noise-off-part``) only those parts lose their noise: the one-at-a-time diagnostic of which
part's noise costs what; the run is not private either (ε = ∞), the other parts keep their ε.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from ..api import Budget, PrivacyPart, PrivacyReport
from ..errors import PrivacyViolation, UserError
from .accounting import compose_prv, compose_rdp, part_epsilon


NOISE_OFF_CAVEAT = ("noise switched off (--noise-off): a diagnostic run of the same pipeline without noise, "
                    "not private; the parts keep the σ the target calibrated")


def partial_noise_off_caveat(parts) -> str:
    return (f"noise switched off in {', '.join(parts)} (--noise-off-part): a diagnostic run, not private; "
            "the other parts keep their noise and ε, every part keeps the σ the target calibrated")


class PrivacyLedger:
    def __init__(self, budget: Budget, planned: Sequence[PrivacyPart]):
        names = [p.name for p in planned]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate privacy part names: {names}")
        self.budget = budget
        self.planned = {p.name: p for p in planned}
        self.taken = {p.name: 0 for p in planned}
        self.noise_off = False
        self.quiet_parts: frozenset[str] = frozenset()  # the parts whose σ is handed out as 0
        if budget.private:
            planned_eps = compose_rdp(list(planned), budget.delta)
            if planned_eps > budget.epsilon:
                raise PrivacyViolation(
                    f"planned ε={planned_eps:.4f} exceeds the target ε={budget.epsilon} before training"
                )
        elif planned:
            raise PrivacyViolation("a non-private run cannot declare private parts")

    def part(self, name: str) -> PrivacyPart:
        if name not in self.planned:
            raise PrivacyViolation(f"private part '{name}' was not declared by plan() (declared: "
                                   f"{', '.join(self.planned) or 'none'})")
        part = self.planned[name]
        return dataclasses.replace(part, noise_multiplier=0.0) if name in self.quiet_parts else part

    @property
    def partial(self) -> bool:
        """Only some parts' noise is off (``--noise-off-part``)."""
        return self.noise_off and self.quiet_parts != frozenset(self.planned)

    def switch_noise_off(self, parts: Sequence[str] | None = None) -> None:
        """The noise multiplier of every part (or of ``parts``) 0 from now on (a diagnostic run:
        not private)."""
        if not self.budget.private:
            raise ValueError("a non-private run has no noise to switch off")
        names = frozenset(self.planned) if parts is None else frozenset(parts)
        unknown = sorted(names - set(self.planned))
        if unknown:
            raise UserError(f"--noise-off-part: {', '.join(unknown)} is not a private part of this run "
                            f"(its parts: {', '.join(self.planned)})")
        self.noise_off, self.quiet_parts = True, names

    def spend(self, name: str, steps: int = 1) -> None:
        if name not in self.planned:
            raise PrivacyViolation(f"private step on undeclared part '{name}'")
        if self.taken[name] + steps > self.planned[name].steps:
            raise PrivacyViolation(
                f"part '{name}' took more than its calibrated {self.planned[name].steps} steps"
            )
        self.taken[name] += steps

    def report(self, taken: dict[str, int] | None = None) -> PrivacyReport:
        """The report of the steps taken (or of ``taken``)."""
        b = self.budget
        if not b.private:
            return PrivacyReport(b, epsilon_rdp=float("inf"), epsilon_prv=float("inf"))
        taken = self.taken if taken is None else taken
        parts = [dataclasses.replace(plan, steps=taken[name]) for name, plan in self.planned.items()]
        if self.noise_off:  # the calibrated σ stay in the record: what the run would have had
            inf = float("inf")
            parts = [dataclasses.replace(p, epsilon=(inf if p.steps else 0.0) if p.name in self.quiet_parts
                                         else part_epsilon(p, b.delta)) for p in parts]
            quiet = tuple(n for n in self.planned if n in self.quiet_parts)
            return PrivacyReport(b, parts=tuple(parts), epsilon_rdp=inf, epsilon_prv=inf, noise_off=True,
                                 caveat=partial_noise_off_caveat(quiet) if self.partial else NOISE_OFF_CAVEAT,
                                 noise_off_parts=quiet if self.partial else ())
        parts = [dataclasses.replace(p, epsilon=part_epsilon(p, b.delta)) for p in parts]
        return PrivacyReport(b, parts=tuple(parts), epsilon_rdp=compose_rdp(parts, b.delta),
                             epsilon_prv=compose_prv(parts, b.delta))

    def planned_report(self) -> PrivacyReport:
        """The report of a run that takes every planned step (``bench privacy``)."""
        return self.report({name: p.steps for name, p in self.planned.items()})
