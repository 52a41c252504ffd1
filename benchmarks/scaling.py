"""How the cost of each private method's PRIVATE PART grows with the work: step time and
peak memory against the batch size B (32 … 512) at the quick and the paper width of the
method, each private mode beside the same step without privacy.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/scaling.py --threads 1 [--json]
        [--figure benchmarks/scaling.png] [--methods dpgan,dpaf] [--batches 32,64]
        [--widths quick,paper] [--repeats 10] [--max-seconds 60]
    .venv/bin/python benchmarks/scaling.py --from-json results.json [--figure F]  # render only

The private parts (each step built from the method's own networks, hyperparameters and,
where it has one, its own step function; small synthetic data, no dataset):

- ``dpgan``: D's DPSGD step (``methods/dpgan.py`` ``_d_step``: B real + B fake rows, one
  forward/backward, Adam), built by ``dp_step.make_step``; modes ``non-private``, ``bk``
  (the method's default) and Opacus' ``hooks``.
- ``dpaf``: conv2*'s DPSGD step, ``DPAF._conv2_step_sound`` itself (B fresh reals + the
  window's μ fake batches, B fakes in all, per-example surrogate ⟨SIN(conv2*(conv1(x))), v⟩);
  modes ``non-private``, ``bk+gc`` (book-keeping with gradient compression: each example's
  gradient built a chunk of examples at a time, compressed, clipped; the method's default),
  ``hooks+gc`` (Opacus hooks + gradient compression of every per-example gradient: the
  default before 2026-11-26) and ``bk`` (``gc=false``).
- ``gswgan``: the generator step through the discriminator (B fakes, loss −Σ D(G(z), y),
  ``GSWGAN._generator_loss``), with GS-WGAN's ``GradientSanitizer`` on G's output
  (``sanitiser``: per-row clip + noise) or without it (``non-private``). DP-GAN-DPAC's
  private part is this same sanitised image gradient (its extra classifier term is not
  private work), so it is not measured separately.
- ``dpsinkhorn``: the generator step on the semi-debiased Sinkhorn loss
  (``DPSinkhorn.loss``; B fakes + ⌊0.2·B⌋ regenerated against B reals), with the
  whole-matrix clip + noise of ``BatchGradientSanitizer`` on the generated batch and the
  clip of the regenerated rows (``sanitiser``) or with neither (``non-private``).
- ``dpmean``, ``dpmerf``: one Gaussian release on the whole data set, no training step:
  nothing to measure (one sentence in the output says so).

Widths: ``quick`` is the method's ``quick`` preset (digits 16×16), ``paper`` its ``paper``
preset for MNIST (28×28); only the batch size is taken from the grid. The real batch is
a fixed B (no Poisson sampling), so that every timed step does the same work.

Timing: as ``dp_step.py``: one process builds every mode of a configuration, warms each
up (``--warmup``), then times them round-robin (one step of each mode per round,
``--repeats`` rounds, median), so that a change of machine load hits all modes alike;
``ratio`` is a mode's median over the non-private median of the same process.

Memory: the peak RSS (``ru_maxrss``) of a fresh process that builds ONE mode of one
configuration and takes ``--mem-steps`` steps (the first creates the optimiser state,
the second is a steady step). One process per (configuration, mode), because
``ru_maxrss`` is a high-water mark: in the timing process, which holds every mode at
once, it would be the peak of the hungriest mode plus the state of the others, and could
not be attributed. ``baseline_rss_mib`` is the RSS of that process before it builds
anything (after the imports), ``rss_increase_mib`` = peak − baseline is the memory the
step needs (networks, data, optimiser state, activations, per-example gradients).
Every process is forked from one ``multiprocessing`` forkserver that has imported torch,
Opacus and the methods once (an import costs ~5 s here; ~100 processes would otherwise
spend minutes importing); each starts with a fresh address space and its high-water mark
reset (``/proc/self/clear_refs``), so no process sees another's memory. The peak is
the host's RSS, also on a GPU (where ``peak_gpu_mib``, torch's allocator peak, is added).

Skips: configurations run in increasing B; each mode's step time and memory at the next
B are extrapolated from its last two measured points (power law, exponent clamped to
[1, 2.5]; linear after one point). When the estimated wall time of a configuration
(``(warmup + repeats + mem_steps)`` steps of every mode) exceeds ``--max-seconds``, or a
mode's estimated memory exceeds ``--max-rss-mib``, the most expensive private modes are
dropped first (down to one private mode: a non-private step alone says nothing about
privacy), then the whole configuration; each dropped entry is recorded with
``skipped`` (the reason) and null measurements.

``--json`` prints ``{"configs": [{"method", "part", "width", "batch", "mode", "step_ms",
"ratio", "peak_rss_mib", ...}, ...], ...}`` on stdout; by default a markdown table (one
per method). Logs go to stderr.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import math
import multiprocessing
import os
import resource
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from dp_step import PartContext, make_step, round_robin  # this directory: the script's own, on sys.path

from dpgen_bench.api import DataInfo, PrivacyPart, Split
from dpgen_bench.config import resolve_hparams
from dpgen_bench.privacy.dpsgd import make_private, private_backward
from dpgen_bench.privacy.sanitizer import GradientSanitizer
from methods.dpaf import DPAF
from methods.dpaf.dpagg import dpagg
from methods.dpdm import DPDM, edm_loss
from methods.dpgan import DPGAN
from methods.dpsinkhorn import BatchGradientSanitizer, DPSinkhorn
from methods.gswgan import GSWGAN

NON_PRIVATE = "non-private"
# width name: (preset, dataset, image shape, training-set size)
WIDTHS = {"quick": ("quick", "digits", (1, 16, 16), 1437), "paper": ("paper", "mnist", (1, 28, 28), 60_000)}
DEFAULT_BATCHES = (32, 64, 128, 256, 512)
ONE_SHOT = {
    "dpmean": "dpmean releases its noisy class sums and counts once (the Gaussian mechanism on the whole "
              "training set) and never trains: there is no private step to scale, nothing is measured.",
    "dpmerf": "dpmerf releases its noisy random-feature mean embedding once and trains the generator on it "
              "without touching the data again (post-processing): there is no private step to scale, "
              "nothing is measured.",
}
SHARED = {
    "dpac": "dpac's private part is gswgan's (the sanitised gradient on the generated images; its classifier "
            "term flows through the same hook): see the gswgan rows.",
}


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _generator(device, seed: int = 0) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


# ------------------------------------------------------------------ the private parts


def _dpgan_step(hp, info: DataInfo, batch: int, mode: str, device) -> Callable[[], None]:
    """``dp_step.make_step``: D's step of ``DPGAN._d_step`` on B real + B fake rows."""
    return make_step(info.image_shape, hp.d_width, batch, mode, device)


def _dpaf_step(hp, info: DataInfo, batch: int, mode: str, device) -> Callable[[], None]:
    """``DPAF._conv2_step_sound`` with B reals (a Poisson sample at rate 1 of B images: all
    of them) and a window of μ fake batches holding B fakes in all."""
    private = mode != NON_PRIVATE
    gc = mode.endswith("+gc")
    hp = dataclasses.replace(hp, gc=gc, grad_sample_mode="auto" if mode == NON_PRIVATE else mode.removesuffix("+gc"))
    torch.manual_seed(0)
    m = DPAF(hp, info)
    for net in (m.conv1, m.conv2, m.head, m.G):
        net.to(device)
    m.conv1.requires_grad_(False)
    gen = _generator(device)
    k = info.num_classes
    images = torch.rand(batch, *m.train_shape, device=device, generator=gen) * 2 - 1
    labels = torch.randint(0, k, (batch,), device=device, generator=gen)
    xf = torch.rand(batch, *m.train_shape, device=device, generator=gen) * 2 - 1
    yf = torch.randint(0, k, (batch,), device=device, generator=gen)
    window = []
    with torch.no_grad():  # the window DPAGG released (what the μ batches before the step leave)
        for xr_k, yr_k, xf_k, yf_k in zip(images.tensor_split(hp.mu), labels.tensor_split(hp.mu),
                                          xf.tensor_split(hp.mu), yf.tensor_split(hp.mu)):
            s_real = dpagg(m._features(xr_k, yr_k), 1.0, m.sensitivity, gen)
            s_fake = dpagg(m._features(xf_k, yf_k), 1.0, m.sensitivity, gen)
            window.append((s_real, s_fake, None, xf_k, yf_k))
    opt = torch.optim.Adam(m.conv2.parameters(), lr=hp.lr_conv2, betas=(hp.beta1, hp.beta2))
    if private:
        gsm2, dp_opt2 = make_private(m.conv2, opt, ctx=PartContext(1.0), part="conv2", max_grad_norm=hp.max_grad_norm,
                                     expected_batch_size=2 * batch, noise_generator=gen,
                                     grad_sample_mode=hp.dpsgd_mode, per_example_transform=m._gc(gen))
    else:  # private_backward on a plain module is a plain backward
        gsm2, dp_opt2 = m.conv2, opt
    part2 = PrivacyPart("conv2", 1.0, 1.0, 10**9)  # rate 1: the B images above, every step

    def step():
        m._conv2_step_sound(images, labels, window, part2, gsm2, dp_opt2, gen)
        _sync(device)

    return step


def _gswgan_step(hp, info: DataInfo, batch: int, mode: str, device) -> Callable[[], None]:
    """The generator step of ``GSWGAN.fit``: B fakes through D_k, −Σ D(G(z), y), backward into G
    (through the sanitiser when private; the mean loss without it), Adam."""
    private = mode != NON_PRIVATE
    torch.manual_seed(0)
    m = GSWGAN(hp, info)
    G = m.G.to(device).train()
    D = m._new_discriminator().to(device)
    opt_g = torch.optim.Adam(G.parameters(), lr=hp.lr_g,
                             betas=(hp.beta1 if hp.beta1_g is None else hp.beta1_g, hp.beta2))
    gen = _generator(device)
    sanitizer = GradientSanitizer(hp.max_grad_norm, m.hook_noise_multiplier(1.0), generator=gen, scale=1.0 / batch)
    subset = Split(torch.rand(batch, *info.image_shape, device=device) * 2 - 1,
                   torch.randint(0, info.num_classes, (batch,), device=device))
    g_params = list(G.parameters())

    def step():
        y = torch.randint(0, info.num_classes, (batch,), device=device, generator=gen)
        x = G(m._latent(batch, device, gen), y)
        handle = sanitizer.attach(x) if private else None
        loss = m._generator_loss(x, y, D, subset, 1, gen, {})
        if not private:
            loss = loss / batch  # what the sanitiser's scale does
        opt_g.zero_grad(set_to_none=True)
        loss.backward(inputs=g_params)
        if handle is not None:
            handle.remove()
        opt_g.step()
        _sync(device)

    return step


def _dpsinkhorn_step(hp, info: DataInfo, batch: int, mode: str, device) -> Callable[[], None]:
    """The step of ``DPSinkhorn._fit`` with a real batch of exactly B: one forward of G for
    X and X_alt, ``DPSinkhorn.loss``, backward into G (through the two sanitisers when
    private), Adam."""
    private = mode != NON_PRIVATE
    torch.manual_seed(0)
    m = DPSinkhorn(hp, info)
    G = m.G.to(device).train()
    opt = torch.optim.Adam(G.parameters(), lr=hp.lr, betas=(hp.beta1, hp.beta2), weight_decay=hp.weight_decay)
    gen = _generator(device)
    k = info.num_classes
    real = Split(torch.rand(batch, *info.image_shape, device=device, generator=gen) * 2 - 1,
                 torch.randint(0, k, (batch,), device=device, generator=gen))
    sanitizer = BatchGradientSanitizer(hp.max_grad_norm, m.hook_noise_multiplier(1.0), generator=gen)
    alt_clip = BatchGradientSanitizer(hp.max_grad_norm, 0.0)
    n_regen = int(hp.debias_ratio * batch)
    g_params = list(G.parameters())

    def step():
        y = torch.randint(0, k, (batch,), generator=gen, device=device)
        z = torch.randn(batch + n_regen, hp.latent_dim, generator=gen, device=device)
        out = G(z, torch.cat([y, y[:n_regen]]))
        x, x_alt = out[:batch], out[batch:]
        handles = []
        if private:
            handles = [sanitizer.attach(x)] + ([alt_clip.attach(x_alt)] if n_regen else [])
        loss = m.loss(x, y, x_alt, real)
        opt.zero_grad(set_to_none=True)
        loss.backward(inputs=g_params)
        for handle in handles:
            handle.remove()
        opt.step()
        _sync(device)

    return step


def _dpdm_step(hp, info: DataInfo, batch: int, mode: str, device) -> Callable[[], None]:
    """The step of ``DPDM.fit`` on exactly B examples: K noised rows each (``DPDM._rows``), EDM's
    loss, DP-SGD on every parameter through bk with the K rows of an example clipped as one
    (``private_backward(..., group=K)``), or the mean loss's plain backward; Adam."""
    private = mode != NON_PRIVATE
    torch.manual_seed(0)
    m = DPDM(hp, info)
    net = m.net.to(device).train()
    opt = torch.optim.Adam(net.parameters(), lr=hp.lr)
    gen = _generator(device)
    x = torch.rand(batch, *info.image_shape, device=device, generator=gen) * 2 - 1
    y = torch.randint(0, info.num_classes, (batch,), device=device, generator=gen)
    if private:
        model, opt = make_private(net, opt, ctx=PartContext(1.0), part="denoiser", max_grad_norm=hp.max_grad_norm,
                                  expected_batch_size=batch, noise_generator=gen, grad_sample_mode="bk")
    else:
        model = net

    def step():
        losses = edm_loss(model, *m._rows(x, y, gen))
        opt.zero_grad(set_to_none=True)
        if private:
            private_backward(model, opt, losses, group=hp.noise_multiplicity)
        else:
            losses.mean().backward()
        opt.step()
        _sync(device)

    return step


@dataclass(frozen=True)
class Part:
    method_cls: type
    part: str  # what the step is
    short: str  # the same, for the figure
    modes: tuple[str, ...]  # non-private first
    build: Callable
    describe: Callable  # hparams -> the width in words


PARTS = {
    "dpgan": Part(DPGAN, "D's DPSGD step (B real + B fake rows)", "D's DPSGD step", (NON_PRIVATE, "bk", "hooks"),
                  _dpgan_step, lambda h: f"D width {h.d_width}"),
    "dpaf": Part(DPAF, "conv2*'s DPSGD step (B real + B fake rows)", "conv2*'s DPSGD step",
                 (NON_PRIVATE, "hooks+gc", "bk+gc", "bk"), _dpaf_step, lambda h: f"{h.layer_config}, d={h.d_width}, μ={h.mu}"),
    "gswgan": Part(GSWGAN, "G's step through D, sanitised image gradient (B fakes)", "G step, per-row sanitiser",
                   (NON_PRIVATE, "sanitiser"), _gswgan_step,
                   lambda h: f"G {h.g_width} / D {h.d_width}{', spectral norm' if h.d_spectral_norm else ''}"),
    "dpdm": Part(DPDM, "the denoiser's DP-SGD step (B examples × K noise draws, clipped per example)",
                 "denoiser's DP-SGD step", (NON_PRIVATE, "bk"), _dpdm_step,
                 lambda h: f"U-Net nf {h.nf}, mult {h.ch_mult}, K = {h.noise_multiplicity}"),
    "dpsinkhorn": Part(DPSinkhorn, "G's step, clipped + noised generated-batch gradient (B fakes vs B reals)",
                       "G step, whole-batch sanitiser", (NON_PRIVATE, "sanitiser"), _dpsinkhorn_step,
                       lambda h: f"G width {h.g_width}"),
}
ALL_METHODS = (*PARTS, *SHARED, *ONE_SHOT)


def _setup(method: str, width: str):
    preset, dataset, shape, n = WIDTHS[width]
    part = PARTS[method]
    hp, _ = resolve_hparams(part.method_cls, preset, dataset, {})
    info = DataInfo(dataset, shape, 10, n)
    return part, hp, info, f"{dataset} {shape[1]}×{shape[2]}, {part.describe(hp)}"


# ------------------------------------------------------------------ worker processes


def _proc_kib_field(path: str, key: str) -> float | None:
    """A ``key: N kB`` line of a /proc file, in MiB (None where there is no /proc)."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def _rss_mib() -> float:
    rss = _proc_kib_field("/proc/self/status", "VmRSS")
    return _maxrss_mib() if rss is None else rss


def _maxrss_mib() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r / 2**20 if sys.platform == "darwin" else r / 1024  # bytes on macOS, KiB on Linux


def _reset_peak() -> None:
    """Reset this process' RSS high-water mark (and so ru_maxrss) to its current RSS."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass  # not Linux: the baseline below is then the fork's inherited peak


def _child_setup(spec: dict):
    if spec["threads"]:
        torch.set_num_threads(spec["threads"])
    device = torch.device(spec["device"])
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    part, hp, info, _ = _setup(spec["method"], spec["width"])
    return part, hp, info, device


def _time_worker(spec: dict) -> dict:
    """Build every mode of one configuration, warm each up, time them round-robin."""
    t0 = time.perf_counter()
    part, hp, info, device = _child_setup(spec)
    builders = {mode: (lambda mode=mode: part.build(hp, info, spec["batch"], mode, device)) for mode in spec["modes"]}
    res = round_robin(builders, spec["repeats"], spec["warmup"])
    return {"times": {m: t for m, t in res.items() if isinstance(t, float)},
            "errors": {m: t for m, t in res.items() if isinstance(t, str)}, "wall_s": time.perf_counter() - t0}


def _mem_worker(spec: dict) -> dict:
    """Build one mode of one configuration in this fresh process and take a few steps:
    the RSS before (after the imports) and the peak."""
    _reset_peak()
    baseline = _rss_mib()
    t0 = time.perf_counter()
    part, hp, info, device = _child_setup(spec)
    (mode,) = spec["modes"]
    step = part.build(hp, info, spec["batch"], mode, device)
    last = 0.0
    for _ in range(spec["mem_steps"]):
        t = time.perf_counter()
        step()
        last = time.perf_counter() - t
    out = {"baseline_rss_mib": baseline, "peak_rss_mib": _maxrss_mib(), "step_s": last,
           "wall_s": time.perf_counter() - t0}
    if device.type == "cuda":
        out["peak_gpu_mib"] = torch.cuda.max_memory_allocated(device) / 2**20
    return out


_MP_CONTEXT = None
# imported once by the forkserver; torch._dynamo is what torch.optim imports lazily on first
# use (~120 MiB, ~1 s): preloaded, it is in every process' baseline, not in its increase
PRELOAD = [__name__, "torch", "torch._dynamo", "opacus", "methods.dpgan", "methods.dpaf", "methods.gswgan",
           "methods.dpsinkhorn"]


def _mp_context():
    """A forkserver that imported torch, Opacus and the methods once (spawn where there is none)."""
    global _MP_CONTEXT
    if _MP_CONTEXT is None:
        if "forkserver" in multiprocessing.get_all_start_methods():
            ctx = multiprocessing.get_context("forkserver")
            ctx.set_forkserver_preload(PRELOAD)
        else:
            ctx = multiprocessing.get_context("spawn")
        _MP_CONTEXT = ctx
    return _MP_CONTEXT


def _in_fresh_process(fn, spec: dict) -> dict:
    """``fn(spec)`` in a new process (an exception, or the process dying, becomes ``{"error"}``)."""
    try:
        with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=_mp_context()) as ex:
            return ex.submit(fn, spec).result()
    except concurrent.futures.process.BrokenProcessPool:
        return {"error": "the process died (out of memory?)"}
    except Exception as e:  # noqa: BLE001 - reported in the results
        return {"error": f"{type(e).__name__}: {str(e)[:160]}"}


# ------------------------------------------------------------------ the grid


def _extrapolate(points: list[tuple[int, float]], batch: int) -> float | None:
    """Value at ``batch`` from the last two (batch, value) points: a power law with the
    exponent clamped to [1, 2.5] (linear in B from one point)."""
    if not points:
        return None
    b1, v1 = points[-1]
    alpha = 1.0
    if len(points) >= 2:
        b0, v0 = points[-2]
        if v0 > 0 and v1 > 0 and b1 != b0:
            alpha = min(2.5, max(1.0, math.log(v1 / v0) / math.log(b1 / b0)))
    return v1 * (batch / b1) ** alpha


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def plan_modes(all_modes, est_t: dict, est_m: dict, steps: int, max_seconds: float, max_mib: float):
    """The modes of one configuration to run, and the reason for each one dropped.

    ``est_t`` / ``est_m``: estimated seconds per step / MiB per mode (None: unknown, run it).
    Private modes over the memory limit go first; then the most expensive private modes
    while the configuration (``steps`` steps of every mode) would exceed ``max_seconds``,
    down to one; if it still does not fit, or no private mode is left, the whole
    configuration is skipped."""
    modes, skipped = list(all_modes), {}

    def seconds(ms):
        return steps * sum(est_t[m] for m in ms if est_t[m] is not None)

    for m in all_modes[1:]:
        if est_m[m] is not None and est_m[m] > max_mib:
            modes.remove(m)
            skipped[m] = f"estimated {est_m[m]:.0f} MiB > --max-rss-mib {max_mib:.0f}"
    for m in sorted(modes[1:], key=lambda m: -(est_t[m] or 0))[:-1]:  # keep one private mode
        if seconds(modes) <= max_seconds:
            break
        modes.remove(m)
        skipped[m] = f"estimated {seconds(modes) + steps * est_t[m]:.0f} s for the configuration with it > " \
                     f"--max-seconds {max_seconds:.0f}"
    reason = None
    if seconds(modes) > max_seconds:
        reason = f"estimated {seconds(modes):.0f} s > --max-seconds {max_seconds:.0f}"
    elif est_m[all_modes[0]] is not None and est_m[all_modes[0]] > max_mib:
        reason = f"estimated {est_m[all_modes[0]]:.0f} MiB > --max-rss-mib {max_mib:.0f}"
    elif len(modes) < 2:
        reason = "no private mode left to compare with"
    if reason:
        skipped.update({m: reason for m in modes})
        modes = []
    return modes, skipped


def run_grid(args) -> list[dict]:
    rows: list[dict] = []
    steps_per_config = args.warmup + args.repeats + args.mem_steps
    for method in args.methods:
        if method not in PARTS:
            continue
        for width in args.widths:
            part, hp, _, detail = _setup(method, width)
            t_hist: dict[str, list] = {m: [] for m in part.modes}  # (B, seconds per step)
            m_hist: dict[str, list] = {m: [] for m in part.modes}  # (B, MiB over the baseline)
            for batch in sorted(args.batches):
                base = {"method": method, "part": part.part, "width": width, "net": detail, "batch": batch}
                est_t = {m: _extrapolate(t_hist[m], batch) for m in part.modes}
                est_m = {m: _extrapolate(m_hist[m], batch) for m in part.modes}
                modes, skipped = plan_modes(part.modes, est_t, est_m, steps_per_config, args.max_seconds,
                                            args.max_rss_mib)
                for m, reason in skipped.items():
                    _log(f"{method} {width} B={batch} {m}: skipped ({reason})")
                if modes:
                    t0 = time.perf_counter()
                    spec = {"method": method, "width": width, "batch": batch, "modes": modes,
                            "repeats": args.repeats, "warmup": args.warmup, "mem_steps": args.mem_steps,
                            "threads": args.threads, "device": args.device}
                    mem = {m: _in_fresh_process(_mem_worker, {**spec, "modes": [m]}) for m in modes}
                    timing = _in_fresh_process(_time_worker, spec)
                    _log(f"{method} {width} B={batch}: {time.perf_counter() - t0:.1f} s "
                         + ", ".join(f"{m} {1e3 * timing.get('times', {}).get(m, math.nan):.1f} ms "
                                     f"+{mem[m].get('peak_rss_mib', math.nan) - mem[m].get('baseline_rss_mib', 0):.0f}"
                                     f" MiB" for m in modes))
                times = timing.get("times", {}) if modes else {}
                base_t = times.get(NON_PRIVATE)
                for m in part.modes:
                    row = {**base, "mode": m, "step_ms": None, "ratio": None, "peak_rss_mib": None,
                           "baseline_rss_mib": None, "rss_increase_mib": None}
                    if m in skipped:
                        row["skipped"] = skipped[m]
                        if est_t[m] is not None:
                            row["estimated_step_ms"] = round(1e3 * est_t[m], 1)
                        rows.append(row)
                        continue
                    t = times.get(m)
                    if t is not None:
                        row["step_ms"] = round(1e3 * t, 3)
                        row["ratio"] = round(t / base_t, 3) if base_t else None
                        t_hist[m].append((batch, t))
                    err = timing.get("errors", {}).get(m) or timing.get("error")
                    if err:
                        row["error"] = err
                    mm = mem[m]
                    if "error" in mm:
                        row["memory_error"] = mm["error"]
                        if t is None:  # neither: assume the worst for later batches
                            t_hist[m].append((batch, math.inf))
                    else:
                        row["peak_rss_mib"] = round(mm["peak_rss_mib"], 1)
                        row["baseline_rss_mib"] = round(mm["baseline_rss_mib"], 1)
                        row["rss_increase_mib"] = round(mm["peak_rss_mib"] - mm["baseline_rss_mib"], 1)
                        if "peak_gpu_mib" in mm:
                            row["peak_gpu_mib"] = round(mm["peak_gpu_mib"], 1)
                        m_hist[m].append((batch, max(1.0, row["rss_increase_mib"])))
                        if t is None:
                            t_hist[m].append((batch, mm["step_s"]))
                    rows.append(row)
    return rows


# ------------------------------------------------------------------ output


def _fmt(v, spec: str, none: str = "—") -> str:
    return none if v is None else format(v, spec)


def markdown(rows: list[dict], methods: list[str]) -> str:
    lines = []
    for method in methods:
        if method in ONE_SHOT:
            lines += [f"**{method}**: {ONE_SHOT[method]}", ""]
            continue
        if method in SHARED:
            lines += [f"**{method}**: {SHARED[method]}", ""]
            continue
        mine = [r for r in rows if r["method"] == method]
        if not mine:
            continue
        modes = PARTS[method].modes
        lines.append(f"**{method}**: {mine[0]['part']}; step ms (× non-private), peak RSS increase MiB")
        lines.append("")
        head = ["width", "B", *(x for m in modes for x in (f"{m} ms", f"{m} +MiB"))]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for key in dict.fromkeys((r["width"], r["net"], r["batch"]) for r in mine):
            cells = [f"{key[0]} ({key[1]})", str(key[2])]
            for m in modes:
                (r,) = [r for r in mine if (r["width"], r["net"], r["batch"], r["mode"]) == (*key, m)]
                if "skipped" in r:
                    cells += ["skipped", "—"]
                    continue
                ms = _fmt(r["step_ms"], ".1f", "error")
                if r["ratio"] is not None and m != NON_PRIVATE:
                    ms += f" (×{r['ratio']:.2f})"
                cells += [ms, _fmt(r["rss_increase_mib"], ".0f")]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    skipped = [r for r in rows if "skipped" in r]
    if skipped:
        lines.append("Skipped:")
        for r in skipped:
            lines.append(f"- {r['method']} {r['width']} B={r['batch']} {r['mode']}: {r['skipped']}")
        lines.append("")
    errors = [r for r in rows if "error" in r or "memory_error" in r]
    for r in errors:
        lines.append(f"- error: {r['method']} {r['width']} B={r['batch']} {r['mode']}: "
                     f"{r.get('error') or r.get('memory_error')}")
    return "\n".join(lines)


def figure(rows: list[dict], path: str | Path) -> None:
    """Step time against B, log-log, one panel per method; a line per width × mode,
    non-private dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    methods = list(dict.fromkeys(r["method"] for r in rows))
    n = max(1, len(methods))
    cols = min(2, n)
    fig, axes = plt.subplots((n + cols - 1) // cols, cols, figsize=(6 * cols, 4.2 * ((n + cols - 1) // cols)),
                             squeeze=False)
    colours = {NON_PRIVATE: "black", "bk": "tab:blue", "hooks": "tab:red", "hooks+gc": "tab:red",
               "bk+gc": "tab:purple",
               "sanitiser": "tab:green"}
    for ax, method in zip(axes.flat, methods):
        mine = [r for r in rows if r["method"] == method and r["step_ms"] is not None]
        for width in dict.fromkeys(r["width"] for r in mine):
            for mode in PARTS[method].modes:
                pts = sorted((r["batch"], r["step_ms"]) for r in mine if r["width"] == width and r["mode"] == mode)
                if not pts:
                    continue
                xs, ys = zip(*pts)
                ax.plot(xs, ys, linestyle="--" if mode == NON_PRIVATE else "-",
                        marker="o" if width == "quick" else "s", color=colours.get(mode, "tab:purple"),
                        alpha=0.55 if width == "quick" else 1.0, label=f"{width}: {mode}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        batches = sorted({r["batch"] for r in mine})
        ax.set_xticks(batches, [str(b) for b in batches])
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.set_title(f"{method}: {PARTS[method].short}", fontsize=10)
        ax.set_xlabel("batch size B")
        ax.set_ylabel("step time (ms)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(methods):]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _list(text: str, kind=str) -> list:
    return [kind(x) for x in text.split(",") if x.strip()]


def _available_mib() -> float:
    avail = _proc_kib_field("/proc/meminfo", "MemAvailable")
    return 16 * 1024.0 if avail is None else avail


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--methods", type=_list, default=list(ALL_METHODS), help=f"comma-separated, of {ALL_METHODS}")
    ap.add_argument("--batches", type=lambda s: _list(s, int), default=list(DEFAULT_BATCHES))
    ap.add_argument("--widths", type=_list, default=list(WIDTHS), help="comma-separated: quick,paper")
    ap.add_argument("--repeats", type=int, default=10, help="timed rounds (median)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps of each mode first")
    ap.add_argument("--mem-steps", type=int, default=2, help="steps of the memory process")
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads in every process")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--max-seconds", type=float, default=60.0,
                    help="skip what would take longer than this per configuration (estimated)")
    ap.add_argument("--max-rss-mib", type=float, default=None,
                    help="skip modes whose estimated memory exceeds this (default: 70%% of MemAvailable)")
    ap.add_argument("--json", action="store_true", help="print the results as JSON on stdout")
    ap.add_argument("--figure", default=None, help="write the step-time figure here (PNG, PDF, ...)")
    ap.add_argument("--from-json", default=None, metavar="FILE",
                    help="measure nothing: render the table / figure of an earlier --json output")
    args = ap.parse_args(argv)
    bad = [m for m in args.methods if m not in ALL_METHODS] + [w for w in args.widths if w not in WIDTHS]
    if bad:
        ap.error(f"unknown method or width: {', '.join(bad)}")
    if args.repeats < 1 or args.warmup < 0 or args.mem_steps < 1 or min(args.batches, default=1) < 1:
        ap.error("--repeats, --mem-steps and batches must be ≥ 1, --warmup ≥ 0")
    if args.max_rss_mib is None:
        args.max_rss_mib = 0.7 * _available_mib()
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.from_json:
        saved = json.loads(Path(args.from_json).read_text())
        rows = saved["configs"]
        methods = list(dict.fromkeys([r["method"] for r in rows] + list(saved.get("notes", {}))))
        if args.figure:
            figure(rows, args.figure)
        print(markdown(rows, methods))
        return 0
    if args.threads:  # every worker process inherits it (and sets torch's threads too)
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ.setdefault(var, str(args.threads))
    t0 = time.perf_counter()
    _log(f"device {args.device}, torch {torch.__version__}, threads {args.threads or 'default'}, repeats "
         f"{args.repeats}, warm-up {args.warmup}, max {args.max_seconds:.0f} s / {args.max_rss_mib:.0f} MiB "
         f"per configuration")
    rows = run_grid(args)
    wall = time.perf_counter() - t0
    _log(f"total {wall:.0f} s")
    if args.figure:
        figure(rows, args.figure)
        _log(f"figure: {args.figure}")
    if args.json:
        notes = {m: ONE_SHOT.get(m) or SHARED[m] for m in args.methods if m in ONE_SHOT or m in SHARED}
        print(json.dumps({"device": args.device, "torch": torch.__version__, "threads": args.threads,
                          "repeats": args.repeats, "warmup": args.warmup, "max_seconds": args.max_seconds,
                          "wall_s": round(wall, 1), "notes": notes, "configs": rows}, indent=1))
    else:
        print(markdown(rows, args.methods))
        print(f"\nTotal wall time {wall:.0f} s.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
