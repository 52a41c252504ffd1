"""What GS-WGAN's published ε costs (docs/privacy.md, "What GS-WGAN's published ε costs").

GS-WGAN's accounting (its ``evaluation/privacy_analysis.py``: autodp's Theorem-9 bound of
Wang, Balle, Kasiviswanathan for T·B Gaussians of noise multiplier σ at rate 1/K) amplifies each
of a step's B rows separately, although all B come from the one discriminator drawn at that step.
Accounted jointly, a step is one Gaussian on the B×d batch: sensitivity 2C√B, noise 2σC per
coordinate (its ``SENSITIVITY = 2``), so noise multiplier σ/√B, at rate 1/K, T steps. The first
table gives that joint ε by dp-accounting's RDP and PLD (Poisson add/remove: an upper bound, and
the PLD's optimistic estimate, a lower bound) and by the project's Theorem 27 (what gswgan's sound
mode uses), and the noise the published ε needs jointly, for GS-WGAN's published setting,
DP-GAN-DPAC's and DPImageBench's GS-WGAN (σ from Opacus at rate 1/K for T steps, no factor B).
The second table: the σ at ε = 10 of the sound mode's step (sampling one of K without
replacement, replace-one neighbours) by Theorem 27 and by the PLD of its dominating pair.

    .venv/bin/python benchmarks/gswgan_eps.py      # both tables, markdown (a few minutes of one core)

Needs dp-accounting (a test extra: ``pip install -e '.[test]'``); autodp, if installed, gives its
per-row ε beside the project's Theorem 9.
"""

from __future__ import annotations

import functools
import math
import warnings
from dataclasses import dataclass

from dpgen_bench.api import PrivacyPart
from dpgen_bench.config import build_config
from dpgen_bench.privacy.accounting import WOR, WOR_GAUSSIAN, compose_rdp

DELTA = 1e-5
PLD_INTERVAL = 1e-3  # connect-the-dots, pessimistic: an upper bound (1e-4 moves GS-WGAN's by < 1e-3 relative)
PLD_LOWER_INTERVAL = 3e-4  # privacy buckets, optimistic: a lower bound of the same ε (finer: tighter, slower)


def _dp_accounting():
    try:
        import dp_accounting
        from dp_accounting.pld import privacy_loss_distribution
        from dp_accounting.rdp import rdp_privacy_accountant
    except ImportError:
        raise SystemExit("benchmarks/gswgan_eps.py needs dp-accounting: .venv/bin/pip install -e '.[test]'") from None
    return dp_accounting, privacy_loss_distribution, rdp_privacy_accountant


@dataclass(frozen=True)
class Setting:
    name: str
    sigma: float  # GS-WGAN's noise multiplier: the hook adds 2σC per coordinate to each of the B rows
    k: int  # discriminators: rate 1/K
    batch: int  # B rows per generator step
    steps: int  # T generator steps
    accountant: str  # how the published ε was accounted: "per-row" (T·B Theorem-9 Gaussians) or "opacus"
    target: float  # the ε the setting was published at


def per_row_epsilon(sigma: float, k: int, steps: int, batch: int, delta: float = DELTA) -> float:
    """GS-WGAN's accounting: T·B Gaussians of noise multiplier σ at rate 1/K, Theorem 9, the
    classical RDP conversion (the project's ``subsampled_gaussian_wor``, paper mode's part)."""
    return compose_rdp([PrivacyPart("per-row", sigma, 1 / k, steps * batch, mechanism=WOR)], delta)


def autodp_per_row_epsilon(sigma: float, k: int, steps: int, batch: int, delta: float = DELTA) -> float | None:
    """The same by autodp, as GS-WGAN's ``privacy_analysis.py`` calls it; None without autodp."""
    try:
        from autodp import rdp_acct, rdp_bank
    except ImportError:
        return None
    acct = rdp_acct.anaRDPacct()
    acct.compose_subsampled_mechanism(lambda a: rdp_bank.RDP_gaussian({"sigma": sigma}, a), 1 / k,
                                      coeff=steps * batch)
    return float(acct.get_eps(delta))


def opacus_epsilon(sigma: float, k: int, steps: int, delta: float = DELTA) -> float:
    """DPImageBench's accounting: T Poisson-subsampled Gaussians of multiplier σ at rate 1/K (no B)."""
    return compose_rdp([PrivacyPart("opacus", sigma, 1 / k, steps)], delta)


def dpimagebench_sigma(epsilon: float, k: int = 1000, steps: int = 20_000, delta: float = DELTA) -> float:
    """σ as DPImageBench's GS-WGAN calibrates it: Opacus' ``get_noise_multiplier`` (RDP, its default
    tolerance 0.01) at rate 1/K for T steps."""
    from opacus.accountants.utils import get_noise_multiplier

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return float(get_noise_multiplier(target_epsilon=epsilon, target_delta=delta, sample_rate=1 / k,
                                          steps=steps, accountant="rdp", epsilon_tolerance=0.01))


@functools.lru_cache(maxsize=None)
def pld_epsilon(multiplier: float, k: int, steps: int, delta: float = DELTA, *, lower: bool = False,
                replace_one: bool = False) -> float:
    """ε of T Poisson-subsampled Gaussians (noise multiplier ``multiplier``, rate 1/K) by
    dp-accounting's PLD: add/remove neighbours, the worse of both directions (``replace_one``: its
    REPLACE_ONE pair instead); an upper bound (connect-the-dots), or with ``lower`` its optimistic
    estimate (privacy buckets), a lower bound of the same ε."""
    dpa, pld, _ = _dp_accounting()
    rel = dpa.NeighboringRelation.REPLACE_ONE if replace_one else dpa.NeighboringRelation.ADD_OR_REMOVE_ONE
    step = pld.from_gaussian_mechanism(standard_deviation=multiplier, sampling_prob=1 / k,
                                       value_discretization_interval=PLD_LOWER_INTERVAL if lower else PLD_INTERVAL,
                                       pessimistic_estimate=not lower, use_connect_dots=not lower,
                                       neighboring_relation=rel)
    return float(step.self_compose(steps).get_epsilon_for_delta(delta))


def joint_epsilon_pld(sigma: float, k: int, steps: int, batch: int, delta: float = DELTA, *,
                      lower: bool = False) -> float:
    """ε of the setting with a step's B rows accounted jointly (noise multiplier σ/√B), by PLD."""
    return pld_epsilon(sigma / math.sqrt(batch), k, steps, delta, lower=lower)


def joint_epsilon_rdp(sigma: float, k: int, steps: int, batch: int, delta: float = DELTA) -> float:
    """The same by dp-accounting's RDP accountant (its default orders)."""
    dpa, _, rdp = _dp_accounting()
    acc = rdp.RdpAccountant()
    acc.compose(dpa.PoissonSampledDpEvent(1 / k, dpa.GaussianDpEvent(sigma / math.sqrt(batch))), steps)
    return float(acc.get_epsilon(delta))


def joint_epsilon_t27(sigma: float, k: int, steps: int, batch: int, delta: float = DELTA) -> float:
    """The same by the project's sound accounting: Theorem 27 (sampling without replacement,
    replace-one), the part ``subsampled_gaussian_wor_t27`` of gswgan's sound mode."""
    return t27_epsilon(sigma / math.sqrt(batch), k, steps, delta)


def t27_epsilon(multiplier: float, k: int, steps: int, delta: float = DELTA) -> float:
    return compose_rdp([PrivacyPart("joint", multiplier, 1 / k, steps, mechanism=WOR_GAUSSIAN)], delta)


def smallest_multiplier(eps_of, target: float, rel: float = 1e-3) -> float:
    """The smallest noise multiplier s (to ``rel``) with eps_of(s) ≤ target; eps_of decreases in s."""
    lo, hi = 0.0, 1.0
    while eps_of(hi) > target:
        lo, hi = hi, 2 * hi
    while hi - lo > rel * hi:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if eps_of(mid) > target else (lo, mid)
    return hi


def settings() -> list[Setting]:
    gswgan = dict(sigma=1.07, k=1000, batch=32, steps=20_000)  # GS-WGAN's source/config.py (MNIST, F-MNIST)
    return [
        Setting("GS-WGAN", accountant="per-row", target=10.0, **gswgan),
        # DP-GAN-DPAC §5.1: σ = 1.07, δ = 1e-5, 20,000 iterations, GS-WGAN's accounting; K and B unstated: GS-WGAN's
        Setting("DP-GAN-DPAC", accountant="per-row", target=10.0, **gswgan),
        # DPImageBench's GS-WGAN configs for MNIST and Fashion-MNIST: K, B, T as GS-WGAN's
        *(Setting(f"DPImageBench ε = {e:g}", dpimagebench_sigma(e), 1000, 32, 20_000, "opacus", e)
          for e in (10.0, 1.0)),
    ]


def _fmt(x: float | None) -> str:
    """Three significant digits: 0.470, 9.99, 366, 2,750, 297,000."""
    if x is None:
        return "—"
    if abs(x) >= 100:
        return f"{float(f'{x:.3g}'):,.0f}"
    return f"{x:#.3g}"


def cost_table() -> str:
    lines = ["| setting | σ | K | B | T | ε published | autodp | joint ε: RDP | PLD | PLD, lower | Theorem 27 | "
             "noise ×: PLD | Theorem 27 |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in settings():
        args = (s.sigma, s.k, s.steps, s.batch)
        if s.accountant == "per-row":
            published, theirs = per_row_epsilon(*args), autodp_per_row_epsilon(*args)
        else:
            published, theirs = opacus_epsilon(s.sigma, s.k, s.steps), None
        row_multiplier = s.sigma / math.sqrt(s.batch)  # the published noise, as a joint multiplier
        pld_x = smallest_multiplier(lambda m: pld_epsilon(m, s.k, s.steps), s.target) / row_multiplier
        t27_x = smallest_multiplier(lambda m: t27_epsilon(m, s.k, s.steps), s.target) / row_multiplier
        cells = [s.name, _fmt(s.sigma), f"{s.k:,}", str(s.batch), f"{s.steps:,}", _fmt(published), _fmt(theirs),
                 _fmt(joint_epsilon_rdp(*args)), _fmt(joint_epsilon_pld(*args)),
                 _fmt(joint_epsilon_pld(*args, lower=True)), _fmt(joint_epsilon_t27(*args)),
                 f"{pld_x:.3g}×", f"{t27_x:.3g}×"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def sound_mode_table(epsilon: float = 10.0) -> str:
    """σ at ``epsilon`` of gswgan's sound-mode part (noise multiplier of the whole batch, rate
    1/K, T steps) by Theorem 27 and by PLD: the add/remove pair (the dominating pair of one
    step, docs/privacy.md) and dp-accounting's REPLACE_ONE pair."""
    long = build_config("gswgan", "mnist", epsilon=epsilon, preset="long").hparams
    rows = [("paper, MNIST", 1000, 20_000), ("`long`, mnist", long["num_discriminators"], long["steps"])]
    lines = [f"| gswgan preset | K | T | σ at ε = {epsilon:g}: Theorem 27 | PLD, dominating pair | "
             "PLD, REPLACE_ONE | noise saved |", "|---|---|---|---|---|---|---|"]
    for name, k, steps in rows:
        t27 = smallest_multiplier(lambda m: t27_epsilon(m, k, steps), epsilon)
        pair = smallest_multiplier(lambda m: pld_epsilon(m, k, steps), epsilon)
        replace = smallest_multiplier(lambda m: pld_epsilon(m, k, steps, replace_one=True), epsilon)
        lines.append(f"| {name} | {k:,} | {steps:,} | {t27:.3g} | {pair:.3g} | {replace:.3g} | "
                     f"{1 - pair / t27:.0%} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    from importlib.metadata import version

    _dp_accounting()
    print(f"δ = {DELTA:g}; dp-accounting {version('dp-accounting')}\n")
    print(cost_table())
    print(sound_mode_table())


if __name__ == "__main__":
    main()
