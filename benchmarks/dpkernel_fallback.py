"""How often DPImageBench's DP-Kernel step adds no noise, on real batches of the full ``mnist``.

DPImageBench draws each step's Gaussian-process noise from ``MultivariateNormal(0, K·coeff)``
inside a bare try/except: when torch refuses K·coeff (its Cholesky fails, or its
positive-definiteness check), the step adds no noise. ``methods.dpkernel`` with
``gp_noise=dpimagebench`` runs that step; this script builds the same K with that mode's own
functions (``dpimagebench_gram`` over Z = X ∪ Y with the one-hot label product, then
``dpimagebench_noise``, which reports whether the draw was dropped), on Poisson batches X of
the training split drawn as the fit loop draws them (``poisson_batch`` at q = B/N, seeded), with
Y what that mode's first step generates (the preset's generator at initialisation, built and
seeded by ``runner.prepare``, fed the batch's labels, |S| points), for each bandwidth set, at the
expected batch B of each preset, with coeff = √(2m)/|S|·σ and σ the preset's calibrated noise at
``--eps``. Counted per matrix:

- K over X ∪ Y in float32, what the mode runs (its points are float32 images);
- the real block K_XX alone (no generator in it), float32;
- the same two in float64 (the inputs cast), to see whether precision is what fails;
- with ``--generator RUN_DIR`` (repeatable), the same with the trained G of a finished dpkernel
  run on mnist (its ``checkpoint.pt``, its preset) instead of G at initialisation;
- the sound path at the same bandwidths (``gp_noise=sound``: M balanced labels, the per-class
  covariance of values and derivatives, ``joint_covariance`` and ``psd_factor``): the largest
  jitter it needed relative to mean(diag C); it never drops the noise.

A dropped draw is also classified: Cholesky of K·coeff failed (``cholesky_ex``) or not (torch's
argument validation refused it for another reason, e.g. symmetry).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/dpkernel_fallback.py            # markdown table
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/dpkernel_fallback.py --json     # one JSON object
    ... --presets "" --generator results/RUN_A --generator results/RUN_B         # trained Gs only

Logs go to stderr, the table (or JSON) to stdout. The default run (20 `quick` batches of B = 1,000,
200 `paper` batches of B = 60) takes ~3 min on one core shared with other jobs (benchmarks/dpkernel.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from dpgen_bench import runner
from dpgen_bench.config import build_config
from dpgen_bench.privacy.dpsgd import poisson_batch
from methods.dpkernel import (PART, dpimagebench_coeff, dpimagebench_gram, dpimagebench_noise, joint_covariance,
                              psd_factor)

BANDWIDTH_SETS = ("1", "2", "4", "8", "16", "8,16", "1,2,4,8,16")  # 8,16: the quick presets'
PRESETS = ("quick", "paper")
DEFAULT_BATCHES = {"quick": 20, "paper": 200}  # B = 1,000 makes 2,000 × 2,000 matrices: fewer batches


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def step_kernel(x: Tensor, lx: Tensor, y: Tensor, ly: Tensor, bandwidths, num_classes: int,
                dtype: torch.dtype = torch.float32) -> Tensor:
    """K over Z = X ∪ Y as the dpimagebench step builds it (``dpimagebench_gram``), in ``dtype``."""
    zs = torch.cat([x.flatten(1), y.flatten(1)]).to(dtype)
    onehot = F.one_hot(torch.cat([lx, ly]), num_classes).to(dtype)
    return dpimagebench_gram(zs, onehot, bandwidths)


def noise_outcome(k: Tensor, coeff: float, generator: torch.Generator) -> dict:
    """What ``dpimagebench_noise`` does with K·coeff: dropped or not, and if dropped whether
    the Cholesky is what failed."""
    noise, dropped = dpimagebench_noise(k, coeff, generator)
    out = {"dropped": bool(dropped), "cholesky_failed": False, "noise_norm": float(noise.norm())}
    if dropped:
        out["cholesky_failed"] = int(torch.linalg.cholesky_ex(k.detach() * coeff).info) != 0
    return out


def sound_jitter(y: Tensor, labels: Tensor, bandwidths) -> float:
    """The largest jitter j / mean(diag C) the sound draw (``gp_draw``'s factors) needs at the
    points ``y``, over classes and both factors (C and A)."""
    y = y.detach().flatten(1).to(torch.float64)
    worst = 0.0
    for c in torch.unique(labels).tolist():
        yc = y[labels == c]
        _, cov, big_a = joint_covariance(yc, bandwidths)
        for mat in (cov, big_a):
            scale = float(mat.diagonal().mean()) or 1.0
            worst = max(worst, psd_factor(mat)[1] / scale)
    return worst


def trial(x: Tensor, lx: Tensor, y: Tensor, ly: Tensor, bandwidths, num_classes: int, sigma: float,
          generator: torch.Generator, dtypes=(torch.float32, torch.float64)) -> dict:
    """One batch, one bandwidth set: the dpimagebench draw over X ∪ Y and over K_XX alone in
    each of ``dtypes``. Keys ``"<f32|f64>_xy"`` and ``"<f32|f64>_xx"``, each ``noise_outcome``."""
    coeff = dpimagebench_coeff(bandwidths, len(x), sigma)
    out = {}
    for dt in dtypes:
        tag = {torch.float32: "f32", torch.float64: "f64"}[dt]
        k = step_kernel(x, lx, y, ly, bandwidths, num_classes, dt)
        out[f"{tag}_xy"] = noise_outcome(k, coeff, generator)
        out[f"{tag}_xx"] = noise_outcome(k[:len(x), :len(x)].contiguous(), coeff, generator)
    return out


@dataclasses.dataclass
class Row:
    preset: str
    batch_size: int
    sigma: float
    bandwidths: str
    batches: int = 0
    realised: list = dataclasses.field(default_factory=list)
    dropped: dict = dataclasses.field(default_factory=dict)  # key → count
    not_cholesky: int = 0
    sound_jitter: float = 0.0
    seconds: float = 0.0
    generator: str = "init"


def measure(preset: str, batches: int, eps: float, seed: int, sets=BANDWIDTH_SETS, dataset: str = "mnist",
            generator: Path | None = None) -> list[Row]:
    """Every bandwidth set of ``sets`` on the same ``batches`` Poisson batches of the preset, with
    the preset's G at initialisation, or G loaded from the finished dpkernel run ``generator``."""
    cfg = build_config("dpkernel", dataset, epsilon=eps, preset=preset, seed=seed, device="cpu",
                       sets=["gp_noise=dpimagebench"])
    p = runner.prepare(cfg)  # the data, the generator at initialisation (seeded), σ calibrated
    train, method, h = p.data.train, p.method, p.method.hparams
    sigma = float(p.ledger.planned[PART].noise_multiplier)  # σ depends on q, T, ε: not on the bandwidths
    n, q, k = len(train), method.sample_rate, method.info.num_classes
    log(f"{preset}: N = {n}, B = {h.batch_size}, q = {q:.5g}, σ = {sigma:.4g}, G width {h.g_width}, "
        f"latent {h.latent_dim}, {batches} batches")
    widths = {bw: dataclasses.replace(h, bandwidths=bw).widths() for bw in sets}
    rows = [Row(preset, h.batch_size, sigma, bw) for bw in sets]
    data_gen = torch.Generator().manual_seed(seed)
    latent = torch.Generator().manual_seed(seed + 1)
    noise = torch.Generator().manual_seed(seed + 2)
    g_name = "init"
    if generator is not None:  # a finished run's released G (checkpoint.pt: the method's state_dict)
        method.load_state_dict(torch.load(Path(generator) / "checkpoint.pt", weights_only=True, map_location="cpu"))
        g_name = Path(generator).name
    for row in rows:
        row.generator = g_name
    G = method.G.train()  # as fit has it; the same weights for every bandwidth set
    gen_labels = method._gen_labels(torch.device("cpu"))
    for b in range(batches):
        idx = poisson_batch(n, q, data_gen, torch.device("cpu"))
        real = train.subset(idx)
        with torch.no_grad():
            y = G(torch.randn(len(idx), method.hparams.latent_dim, generator=latent), real.labels)
            y_sound = G(torch.randn(len(gen_labels), method.hparams.latent_dim, generator=latent), gen_labels)
        for row in rows:
            t0 = time.perf_counter()
            w = widths[row.bandwidths]
            out = trial(real.images, real.labels, y, real.labels, w, k, row.sigma, noise)
            row.batches += 1
            row.realised.append(len(idx))
            for key, o in out.items():
                row.dropped[key] = row.dropped.get(key, 0) + int(o["dropped"])
                row.not_cholesky += int(o["dropped"] and not o["cholesky_failed"])
            row.sound_jitter = max(row.sound_jitter, sound_jitter(y_sound, gen_labels, w))
            row.seconds += time.perf_counter() - t0
        if (b + 1) % max(1, batches // 5) == 0:
            log(f"  {preset}: {b + 1}/{batches} batches; dropped (f32, X∪Y): "
                + ", ".join(f"{r.bandwidths}: {r.dropped.get('f32_xy', 0)}" for r in rows))
    return rows


def markdown(rows: list[Row]) -> str:
    lines = ["| preset | G | B (mean \\|S\\|) | σ | bandwidths | batches | dropped, float32 X ∪ Y (the mode) "
             "| dropped, float32 K_XX | dropped, float64 X ∪ Y | dropped, float64 K_XX "
             "| dropped not by Cholesky | sound draw: max jitter / mean diag |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        mean_s = sum(r.realised) / max(1, len(r.realised))
        cells = [f"{r.dropped.get(key, 0)}/{r.batches}" for key in ("f32_xy", "f32_xx", "f64_xy", "f64_xx")]
        lines.append(f"| {r.preset} | {r.generator} | {r.batch_size} ({mean_s:.0f}) | {r.sigma:.3g} | {r.bandwidths} "
                     f"| {r.batches} | "
                     + " | ".join(cells) + f" | {r.not_cholesky} | {r.sound_jitter:.0e} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--presets", default=",".join(PRESETS), help="dpkernel presets on mnist (quick, paper)")
    ap.add_argument("--batches", type=int, default=None,
                    help=f"Poisson batches per preset [default: {DEFAULT_BATCHES}]")
    ap.add_argument("--bandwidths", default=";".join(BANDWIDTH_SETS), help="bandwidth sets, ';'-separated")
    ap.add_argument("--eps", type=float, default=1.0, help="ε the noise σ is calibrated for")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--generator", action="append", default=[], metavar="RUN_DIR",
                    help="also measure with the G of this finished dpkernel run on mnist (its preset; repeatable)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    sets = tuple(s.strip() for s in args.bandwidths.split(";") if s.strip())
    t0 = time.perf_counter()
    rows = []
    for preset in (s.strip() for s in args.presets.split(",") if s.strip()):
        batches = args.batches if args.batches is not None else DEFAULT_BATCHES.get(preset, 200)
        rows += measure(preset, batches, args.eps, args.seed, sets)
    for run in args.generator:
        cfg = json.loads((Path(run) / "config.json").read_text())
        if cfg.get("method") != "dpkernel":
            ap.error(f"--generator {run}: not a dpkernel run")
        preset = cfg["preset"]
        batches = args.batches if args.batches is not None else DEFAULT_BATCHES.get(preset, 200)
        rows += measure(preset, batches, args.eps, args.seed, sets, generator=Path(run))
    wall = time.perf_counter() - t0
    log(f"done in {wall:.0f} s")
    if args.json:
        print(json.dumps({"eps": args.eps, "seed": args.seed, "seconds": wall, "torch": torch.__version__,
                          "rows": [{**r.__dict__, "realised": None,
                                    "mean_batch": sum(r.realised) / max(1, len(r.realised))} for r in rows]}))
    else:
        print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
