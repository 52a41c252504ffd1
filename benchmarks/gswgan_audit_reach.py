"""Where a one-run white-box audit can reject GS-WGAN's per-row accounting (docs/auditing.md,
"GS-WGAN's per-row accounting, rejected"), without training: each canary's projections are
drawn from the mechanism the audit observes (a draw with probability 1/K per release, then a
shift of μ = 2C√B / noise std; standard normal noise otherwise), scored as
``privacy.canaries.SanitizerCanaries`` scores GS-WGAN's (``mixture_log_ratio``, one release at a
time), and tested as ``bench audit --white-box`` tests one part (ε-bound and the accountant's
curve, each at 97.5 %). σ is each mode's calibration at the target ε: paper mode T·B
Theorem-9 compositions with hook noise 2σC (μ = √B/σ), sound mode T Theorem-27 compositions
with hook noise 2√B·σC (μ = 1/σ). The real gradients of D_k are left out (on digits the runs'
bounds come out of the simulated size, docs/auditing.md).

    python benchmarks/gswgan_audit_reach.py 1000,2000,2000 1437,1000,4000   # K,T,canaries ...

prints, per setting and mode, σ, μ, the expected draws per canary T/K and the ε-bound of each
seed (R: the accountant's curve rejected). A few seconds to a minute per setting on one core.
"""

from __future__ import annotations

import argparse
import math

import numpy as np

from dpgen_bench.api import PrivacyPart
from dpgen_bench.privacy.accounting import WOR, WOR_GAUSSIAN, calibrate_noise, privacy_profile
from dpgen_bench.privacy.audit_bounds import best_one_run_bound, profile_rejected
from dpgen_bench.privacy.canaries import mixture_log_ratio

DELTA, CONFIDENCE = 1e-5, 1 - 0.05 / 2  # one part: two tests, as bench audit --white-box


def scores(mu: float, rate: float, steps: int, m: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """The canaries' mixture scores and inclusion (a coin each), one release at a time."""
    included = rng.random(m) < 0.5
    total = np.zeros(m)
    shift = np.full(m, mu)
    for _ in range(steps):
        z = rng.standard_normal(m) + mu * (included & (rng.random(m) < rate))
        total += mixture_log_ratio(z, shift, rate)
    return total, included


def audit(k: int, steps: int, m: int, batch: int, epsilon: float, seeds: int) -> None:
    rate = 1.0 / k
    for mode, mechanism, per in (("paper", WOR, batch), ("sound", WOR_GAUSSIAN, 1)):
        sigma = calibrate_noise(epsilon=epsilon, delta=DELTA, sample_rate=rate, steps=steps * per,
                                mechanism=mechanism)
        mu = (math.sqrt(batch) if mode == "paper" else 1.0) / sigma
        profile = privacy_profile([PrivacyPart("g", sigma, rate, steps * per, mechanism=mechanism)], DELTA)
        cells = []
        for seed in range(seeds):
            s, inc = scores(mu, rate, steps, m, np.random.default_rng([seed, k, steps, m]))
            bound = best_one_run_bound(s, inc, delta=DELTA, confidence=CONFIDENCE)["epsilon_lower_bound"]
            rejected = profile_rejected(s, inc, profile=profile, confidence=CONFIDENCE)["rejected"]
            cells.append(f"{bound:.2f}{'R' if rejected else ''}")
        print(f"K={k} T={steps} canaries={m} T/K={steps / k:.2g} {mode}: σ={sigma:.4g} μ={mu:.3g}: "
              + " / ".join(cells), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("settings", nargs="+", help="K,T,canaries")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--eps", type=float, default=1.0)
    ap.add_argument("--seeds", type=int, default=3)
    args = ap.parse_args()
    for setting in args.settings:
        k, steps, m = (int(x) for x in setting.split(","))
        audit(k, steps, m, args.batch, args.eps, args.seeds)


if __name__ == "__main__":
    main()
