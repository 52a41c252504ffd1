"""Measured against bound-based noise to signal for every private part of every `quick` and
`long` preset on a dataset (default mnist, ε = 10): each preset's gradient probe
(``dpgen_bench.probe.measure_gradients``: the run's preparation, then every part's first steps
on the data), one markdown row per part. A part whose median contribution norm is below C/5
is flagged: its clip bound is a candidate to re-choose on the validation split.

    python benchmarks/telemetry_table.py                       # mnist, 5 steps a part
    python benchmarks/telemetry_table.py --dataset digits --steps 10 --methods dpgan,dpaf

The statistics are computed on the private data without noise (a diagnostic outside the
guarantee: docs/privacy.md, "Measured gradient telemetry"); the probe uses the training split.
"""

from __future__ import annotations

import argparse
import sys
import time

from dpgen_bench import registry
from dpgen_bench.config import build_config
from dpgen_bench.probe import measure_gradients

FLAG_SHARE = 0.2  # median below C/5: re-choose the clip on val


def _g(v, f=".3g") -> str:
    return "n/a" if v is None else format(v, f)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", default="mnist")
    ap.add_argument("--eps", type=float, default=10.0)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--presets", default="quick,long")
    ap.add_argument("--methods", default=None, help="comma-separated (default: every private method)")
    a = ap.parse_args()
    names = a.methods.split(",") if a.methods else [m for m in registry.methods.names()
                                                    if registry.methods.get(m).private]
    print("| method | preset | part | σ | C | median ‖g‖ | p90 ‖g‖ | clipped | noise / signal (bound) | "
          "noise / signal (measured) | median < C/5 |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for m in names:
        cls = registry.methods.get(m)
        for preset in a.presets.split(","):
            if not {a.dataset, "*"} & set(cls.presets.get(preset, {})):
                continue
            t = time.time()
            cfg = build_config(m, a.dataset, epsilon=a.eps, preset=preset, seed=0)
            probe = measure_gradients(cfg, steps=a.steps)
            for part, s in probe["parts"].items():
                share = None if s.get("median_norm") is None else s["median_norm"] / s["clip_bound"]
                flag = "n/a" if share is None else ("**yes**" if share < FLAG_SHARE else "no")
                print(f"| {m} | {preset} | {part} | {s['noise_multiplier']:.3g} | {_g(s.get('clip_bound'), 'g')} | "
                      f"{_g(s.get('median_norm'))} | {_g(s.get('p90_norm'))} | {_g(s.get('clip_fraction'), '.0%')} | "
                      f"{_g(s['noise_to_signal_bound'])} | {_g(s['noise_to_signal_measured'])} | {flag} |", flush=True)
            print(f"{m} {preset}: {time.time() - t:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
