"""DPGAN discriminator step: non-private vs DPSGD (Opacus per-example gradients), per
grad-sample mode, at the quick (digits) and paper (MNIST) widths.

    .venv/bin/python benchmarks/dp_step.py [--repeats 20] [--threads N]

One process, same batch, same networks; each configuration is warmed up, then timed over
``--repeats`` steps (median). The step is the one ``methods/dpgan.py`` takes: one forward
and backward over B real + B fake examples, then the optimiser step (with clipping and
noise when private).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dpgen_bench.nets.dcgan import ConditionalDiscriminator  # noqa: E402
from dpgen_bench.api import PrivacyPart  # noqa: E402
from dpgen_bench.privacy.dpsgd import make_private  # noqa: E402


class PartContext:
    """The part ``make_private`` reads (σ given, no step limit), steps counted."""

    def __init__(self, noise_multiplier: float):
        self._part, self.spent = PrivacyPart("d", noise_multiplier, 1.0, 10**9), 0

    def part(self, name):
        return self._part

    def spend(self, name, steps=1):
        self.spent += steps

CONFIGS = {  # name: (image shape, width, real batch B)
    "quick (digits 16x16, d=32, B=64)": ((1, 16, 16), 32, 64),
    "paper (MNIST 28x28, d=128, B=128)": ((1, 28, 28), 128, 128),
}


def time_steps(step, repeats: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        step()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        step()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def bench(shape, width, batch, mode: str | None, repeats: int, device) -> float:
    torch.manual_seed(0)
    D = ConditionalDiscriminator(shape, 10, width).to(device)
    opt = torch.optim.Adam(D.parameters(), lr=2e-4, betas=(0.5, 0.999))
    model = D
    if mode is not None:
        model, opt = make_private(D, opt, ctx=PartContext(1.0), part="d", max_grad_norm=1.0,
                                  expected_batch_size=2 * batch, grad_sample_mode=mode)
    x = torch.rand(2 * batch, *shape, device=device) * 2 - 1
    y = torch.randint(0, 10, (2 * batch,), device=device)
    t = torch.cat([torch.ones(batch), torch.zeros(batch)]).to(device)

    def step():
        loss = F.binary_cross_entropy_with_logits(model(x, y), t)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return time_steps(step, repeats)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    print(f"device {device}, torch {torch.__version__}, threads {torch.get_num_threads()}")
    print("| config | mode | step (ms) | ratio to non-private |")
    print("|---|---|---|---|")
    for name, (shape, width, batch) in CONFIGS.items():
        base = bench(shape, width, batch, None, args.repeats, device)
        print(f"| {name} | non-private | {base * 1e3:.1f} | 1.00 |", flush=True)
        for mode in ("hooks", "functorch", "ew"):
            try:
                t = bench(shape, width, batch, mode, args.repeats, device)
                print(f"| {name} | {mode} | {t * 1e3:.1f} | {t / base:.2f} |", flush=True)
            except Exception as e:  # noqa: BLE001 - a mode Opacus cannot run on this net
                print(f"| {name} | {mode} | fails: {type(e).__name__}: {str(e)[:60]} | — |", flush=True)


if __name__ == "__main__":
    main()
