"""DPAF's privacy budget: the split between conv1, conv2* and DPAGG, the number of steps
of each part, and the noise of each part (DPAF §5.4 Theorem 5 / App. A.6 Theorem 6;
§6.1 "Canonical Implementation" for the two notations of the split).

Notations (§6.1), given the total ε:

- ``(x1, ×, x3)``: absolute ε1 = x1 (conv1) and ε3 = x3 (DPAGG); conv2* gets the rest,
  ε2 = ε − ε1 − ε3. The canonical split is ``(0.1, ×, 0.1)``.
- ``(x1%, x2%, x3%)``: εk = xk·ε/100.

Both may be mixed ("10%, x, 0.1"); at most one part is "×" (ASCII "x" also accepted).
ε1 may be 0: conv1 then stays at its random initialisation (Table 4's "random conv1"
rows) and the part takes no step. ε2 and ε3 must be positive.

Theorem 5 composes T1·ε'(γ1, u1) + T2·ε'(γ2, u2) + T3·ε'(γ3, √m·p) in RDP. Each part
here is a Poisson-subsampled Gaussian mechanism whose noise multiplier is std /
sensitivity (u for DPSGD, √m·p for DPAGG), so the sensitivity drops out of the
accounting and each part is calibrated with ``calibrate_noise`` for (εk, δ) at its
sample rate γk and step count Tk. Calibrating every part at the full δ and εk with
Σεk = ε keeps the RDP composition of the three ≤ ε: with α the smallest of the parts'
optimal orders, Σk ρk(α) + c(α) ≤ Σk [ρk(αk) + c(αk)] = Σk εk because RDP grows with α
and the RDP→DP term c(α) ≥ 0 on the orders used (true for δ ≤ 1e-4; for larger δ,
c can dip to −0.01 and the shares are scaled down until the composition fits). The
ledger re-checks it anyway.
``fill_budget`` instead scales all εk by a common factor s ≥ 1 (the largest one whose
composition is still ≤ ε), spending the slack that the paper's additive split leaves.

Steps follow Algorithm 1's schedule: T1 = classifier batches (phase 1), T3 = 𝔹 (one
DPAGG per phase-2 batch), T2 = ⌊𝔹/μ⌋ (conv2* once every μ batches).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from dpgen_bench.api import PrivacyPart
from dpgen_bench.errors import UserError
from dpgen_bench.privacy import calibrate_noise, compose_rdp

PART_NAMES = ("conv1", "conv2", "dpagg")
REST_TOKENS = ("x", "×", "X", "*", "rest")


@dataclass(frozen=True)
class Share:
    kind: str  # "abs" | "pct" | "rest"
    value: float = 0.0


def parse_split(text: str) -> tuple[Share, Share, Share]:
    """Parse "(0.1, ×, 0.1)", "0.1,x,0.1", "20%,60%,20%" into three shares."""
    body = re.sub(r"[()\[\]\s]", "", str(text))
    items = [s for s in re.split(r"[,;/]", body)]
    if len(items) != 3 or any(not s for s in items):
        raise UserError(f"budget_split must have three parts (conv1, conv2, dpagg), e.g. '0.1,x,0.1' or "
                        f"'20%,60%,20%'; got {text!r}")
    shares = []
    for s in items:
        if s in REST_TOKENS:
            shares.append(Share("rest"))
            continue
        pct = s.endswith("%")
        num = s[:-1] if pct else s
        try:
            v = float(num)
        except ValueError:
            raise UserError(f"budget_split: cannot read {s!r} in {text!r} (a number, 'N%' or 'x')") from None
        if not v >= 0:
            raise UserError(f"budget_split: shares must be ≥ 0, got {s!r}")
        shares.append(Share("pct" if pct else "abs", v))
    if sum(sh.kind == "rest" for sh in shares) > 1:
        raise UserError(f"budget_split: at most one part may be 'x' (the remainder), got {text!r}")
    return tuple(shares)  # type: ignore[return-value]


def allocate(split: str | tuple[Share, Share, Share], epsilon: float) -> tuple[float, float, float]:
    """(ε1, ε2, ε3) for conv1, conv2*, DPAGG at total ``epsilon``."""
    shares = parse_split(split) if isinstance(split, str) else split
    eps: list[float | None] = []
    for sh in shares:
        if sh.kind == "abs":
            eps.append(sh.value)
        elif sh.kind == "pct":
            eps.append(sh.value * epsilon / 100.0)
        else:
            eps.append(None)
    known = sum(e for e in eps if e is not None)
    if None in eps:
        rest = epsilon - known
        if rest <= 1e-12:
            raise UserError(f"budget_split leaves nothing for the '×' part at ε={epsilon:g} "
                            f"(the other parts take {known:g}); lower them or raise ε")
        eps = [rest if e is None else e for e in eps]
    total = sum(eps)  # type: ignore[arg-type]
    if total > epsilon * (1 + 1e-9):
        raise UserError(f"budget_split takes ε={total:g} in all, more than the target {epsilon:g}")
    e1, e2, e3 = (float(e) for e in eps)  # type: ignore[arg-type]
    if e2 <= 0 or e3 <= 0:
        raise UserError(f"budget_split must give conv2 and dpagg a positive ε, got ({e1:g}, {e2:g}, {e3:g})")
    return e1, e2, e3


@dataclass(frozen=True)
class Schedule:
    """Steps and Poisson sample rates of the three parts."""

    steps: tuple[int, int, int]  # T1, T2, T3
    rates: tuple[float, float, float]  # γ1, γ2, γ3


def schedule(*, n_train: int, batch_size: int, batches: int, classifier_batches: int, mu: int,
             conv2_rate: str = "fresh") -> Schedule:
    """Algorithm 1's step counts. ``conv2_rate``: "fresh" — conv2*'s step draws its own
    Poisson sample of expected size μ·B (γ2 = μB/N); "union" — the union of the last μ
    Poisson batches (γ2 = 1 − (1 − B/N)^μ, the paper-literal mode)."""
    if batches < mu:
        raise UserError(f"batches (𝔹={batches}) must be ≥ mu (μ={mu}) for conv2* to take a step")
    q = min(1.0, batch_size / n_train)
    if conv2_rate == "fresh":
        q2 = min(1.0, mu * batch_size / n_train)
    elif conv2_rate == "union":
        q2 = 1.0 - (1.0 - q) ** mu
    else:
        raise ValueError(conv2_rate)
    return Schedule(steps=(int(classifier_batches), int(batches // mu), int(batches)), rates=(q, q2, q))


def _calibrated(eps: tuple[float, float, float], delta: float, sched: Schedule) -> list[PrivacyPart]:
    parts = []
    for name, e, q, t in zip(PART_NAMES, eps, sched.rates, sched.steps):
        if t == 0 or e == 0:
            if name != "conv1":
                raise UserError(f"part '{name}' needs a positive ε and at least one step")
            parts.append(PrivacyPart(name, noise_multiplier=0.0, sample_rate=q, steps=0))
            continue
        sigma = calibrate_noise(epsilon=e, delta=delta, sample_rate=q, steps=t)
        parts.append(PrivacyPart(name, noise_multiplier=float(sigma), sample_rate=q, steps=t))
    return parts


def plan_parts(*, split: str, epsilon: float, delta: float, sched: Schedule,
               fill_budget: bool = False) -> list[PrivacyPart]:
    """The three calibrated parts ("conv1", "conv2", "dpagg") for total (ε, δ)."""
    eps = allocate(split, epsilon)
    parts = _calibrated(eps, delta, sched)
    shrink = 1.0
    while compose_rdp(parts, delta) > epsilon:  # only possible for large δ (c(α) < 0): shrink the shares
        shrink *= 0.98
        parts = _calibrated(tuple(e * shrink for e in eps), delta, sched)  # type: ignore[arg-type]
    if not fill_budget:
        return parts
    # Largest common scale s of the shares whose RDP composition still fits the target.
    lo, hi = 1.0, epsilon / max(eps)  # s·max(εk) ≤ ε: no single part may exceed the target
    best = parts
    if hi <= lo:
        return parts
    for _ in range(8):
        mid = (lo + hi) / 2
        trial = _calibrated(tuple(min(epsilon, e * mid) for e in eps), delta, sched)  # type: ignore[arg-type]
        if compose_rdp(trial, delta) <= epsilon:
            lo, best = mid, trial
        else:
            hi = mid
    return best
