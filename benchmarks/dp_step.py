"""DPGAN discriminator step: non-private vs DPSGD in every grad-sample mode, at the quick
(digits) and paper (MNIST) widths, and at dpgan's `long` preset on MNIST (width 64, B = 64).

    .venv/bin/python benchmarks/dp_step.py [--repeats 20] [--threads N] [--json] [--config quick|paper|long]

One process, same batch, same networks; every configuration is built and warmed up, then
the modes are timed round-robin (one step of each mode per round, ``--repeats`` rounds,
median), so that a change of machine load hits every mode alike. The step is the one
``methods/dpgan.py`` takes: one forward and backward over B real + B fake examples, then
the optimiser step (with clipping and noise when private). ``bk:ghost`` and
``bk:per_example`` are the book-keeping mode with one norm rule forced on every layer (the
default ``bk`` picks per layer): diagnostics of the mixed rule, not modes a method offers.

``--json`` prints ``{"configs": [{"name", "mode", "step_ms", "ratio"}, ...]}`` (a mode
Opacus cannot run on this network has ``step_ms`` and ``ratio`` null and an ``error``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from dpgen_bench.api import PrivacyPart
from dpgen_bench.nets.dcgan import ConditionalDiscriminator
from dpgen_bench.privacy.dpsgd import GRAD_SAMPLE_MODES, make_private, private_backward


class PartContext:
    """The part ``make_private`` reads (σ given, no step limit), steps counted."""

    def __init__(self, noise_multiplier: float):
        self._part, self.spent = PrivacyPart("d", noise_multiplier, 1.0, 10**9), 0

    def part(self, name):
        return self._part

    def spend(self, name, steps=1):
        self.spent += steps

    def watch(self, name, mechanism):  # no audit here
        pass


CONFIGS = {  # name: (image shape, width, real batch B)
    "quick (digits 16x16, d=32, B=64)": ((1, 16, 16), 32, 64),
    "paper (MNIST 28x28, d=128, B=128)": ((1, 28, 28), 128, 128),
    "long (MNIST 28x28, d=64, B=64)": ((1, 28, 28), 64, 64),  # dpgan's `long` preset on mnist
}
MODES = ("non-private", *GRAD_SAMPLE_MODES, "bk:ghost", "bk:per_example")


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def make_step(shape, width, batch, mode: str, device):
    """A closure taking one D step of ``mode`` (``"non-private"`` or a grad-sample mode)."""
    torch.manual_seed(0)
    D = ConditionalDiscriminator(shape, 10, width).to(device)
    opt = torch.optim.Adam(D.parameters(), lr=2e-4, betas=(0.5, 0.999))
    model, private = D, mode != "non-private"
    if private:
        base, _, norms = mode.partition(":")
        model, opt = make_private(D, opt, ctx=PartContext(1.0), part="d", max_grad_norm=1.0,
                                  expected_batch_size=2 * batch, grad_sample_mode=base)
        if norms:
            model.norms = norms
    x = torch.rand(2 * batch, *shape, device=device) * 2 - 1
    y = torch.randint(0, 10, (2 * batch,), device=device)
    t = torch.cat([torch.ones(batch), torch.zeros(batch)]).to(device)

    def step():
        losses = F.binary_cross_entropy_with_logits(model(x, y), t, reduction="none")
        opt.zero_grad(set_to_none=True)
        if private:
            private_backward(model, opt, losses)
        else:
            losses.mean().backward()
        opt.step()
        _sync()

    return step


def round_robin(builders: dict, repeats: int, warmup: int = 3) -> dict[str, float | str]:
    """``builders``: mode -> a function returning that mode's step. Build and warm up each,
    then time them round-robin (one step of each mode per round); the median seconds per
    step of each mode, or the error its build or warm-up raised (e.g. a mode Opacus cannot
    run on the network), in the order of ``builders``."""
    steps: dict = {}
    out: dict[str, float | str] = {}
    for mode, build in builders.items():
        try:
            step = build()
            for _ in range(warmup):
                step()
            steps[mode] = step
        except Exception as e:  # noqa: BLE001 - reported per mode
            out[mode] = f"{type(e).__name__}: {str(e)[:80]}"
    times: dict[str, list[float]] = {m: [] for m in steps}
    for _ in range(repeats):
        for mode, step in steps.items():
            t = time.perf_counter()
            step()
            times[mode].append(time.perf_counter() - t)
    for mode in steps:
        out[mode] = statistics.median(times[mode])
    return {m: out[m] for m in builders}


def bench_config(shape, width, batch, repeats: int, device, modes=MODES, warmup: int = 3) -> dict[str, float | str]:
    """Median seconds per step of each mode (or the error a mode raised), timed round-robin."""
    builders = {mode: (lambda mode=mode: make_step(shape, width, batch, mode, device)) for mode in modes}
    return round_robin(builders, repeats, warmup)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--json", action="store_true", help="print the results as JSON on stdout")
    ap.add_argument("--config", choices=["quick", "paper", "long"], default=None,
                    help="only this configuration (default: all)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    print(f"device {device}, torch {torch.__version__}, threads {torch.get_num_threads()}, "
          f"repeats {args.repeats}", file=sys.stderr)
    rows = []
    if not args.json:
        print("| config | mode | step (ms) | ratio to non-private |")
        print("|---|---|---|---|")
    for name, (shape, width, batch) in CONFIGS.items():
        if args.config and not name.startswith(args.config):
            continue
        res = bench_config(shape, width, batch, args.repeats, device)
        base = res["non-private"]
        for mode, t in res.items():
            ok = isinstance(t, float)
            row = {"name": name, "mode": mode, "step_ms": round(t * 1e3, 2) if ok else None,
                   "ratio": round(t / base, 3) if ok else None}
            if not ok:
                row["error"] = t
            rows.append(row)
            if not args.json:
                cell = f"{row['step_ms']:.1f} | {row['ratio']:.2f}" if ok else f"fails: {t} | —"
                print(f"| {name} | {mode} | {cell} |", flush=True)
    if args.json:
        print(json.dumps({"device": str(device), "torch": torch.__version__, "threads": torch.get_num_threads(),
                          "configs": rows}, indent=1))


if __name__ == "__main__":
    main()
