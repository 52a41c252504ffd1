"""DPDM: Differentially Private Diffusion Models (Dockhorn, Cao, Vahdat, Kreis; TMLR 2023).

A class-conditional denoiser D(x; σ, y) trained with DP-SGD on every parameter, sampled
with the EDM sampler (Karras et al. 2022). What the paper's method is, and where it is in
this file:

- **Preconditioning and loss (EDM, the paper's choice at ε = 1 and 10):**
  D(x; σ) = c_skip(σ)·x + c_out(σ)·F(c_in(σ)·x; c_noise(σ), y) with σ_data = 0.5,
  c_skip = σ_d²/(σ²+σ_d²), c_out = σσ_d/√(σ²+σ_d²), c_in = 1/√(σ²+σ_d²), c_noise = ln(σ)/4;
  the loss of an image x at noise level σ ~ exp(N(P_mean, P_std²)) (−1.2, 1.2) is
  λ(σ)·mean((D(x + σn; σ) − x)²), λ = (σ²+σ_d²)/(σσ_d)² (``edm_loss``).
- **Noise multiplicity K:** each example's loss is the mean over K independent (σ, n)
  draws *before* its gradient is clipped (§3.2): K rows per example in one forward pass,
  clipped as one example by the book-keeping path (``private_backward(..., group=K)``,
  ``dpgen_bench/privacy/fastclip.py``). K costs compute, not privacy: the per-example
  gradient is still one bounded contribution.
- **DP-SGD:** Poisson sampling at rate B/N, clip C, Gaussian noise σ_DP·C on the sum,
  divided by the expected batch size B, Adam; steps counted by the DP optimizer
  (``make_private``) on the part ``denoiser``. T is fixed by the preset (σ_DP calibrated
  from the target) or derived from a fixed σ_DP.
- **EMA** of the weights (decay 0.999 in the paper): a function of the released iterates,
  no privacy cost; samples come from the EMA weights.
- **Sampler:** EDM's Heun sampler (``edm_sample``): N steps on the ρ = 7 schedule from
  σ_max = 80 to σ_min = 0.002, deterministic, or with "churn" (S_churn > 0: noise
  re-injected on [S_tmin, S_tmax]).

Network: ``dpgen_bench.nets.unet.ConditionalUNet`` (DDPM++-style; the paper's MNIST
network is nf = 32, (1, 2, 2), 2 blocks, attention at 7×7).

- **Sampler:** also the authors' deterministic "ddim" sampler (``sampler: euler``,
  ``euler_sample``): Euler steps of the same ODE on the ρ schedule, output D(x; σ_min); the
  one their MNIST / Fashion-MNIST / CelebA configs use, so the ``paper`` presets use it.
  Sampling runs on fit's device (the other methods sample on the CPU: one generator pass
  an image, where DPDM's sampler makes N U-Net evaluations), with the starting noise (and
  churn) drawn from the runner's CPU generator, so CUDA and the CPU integrate the same ODE
  from the same points; the weights rest on the CPU between calls.

Departures from the paper and the authors' code (docs/provenance.md, value by value):
- ``paper`` presets (MNIST, Fashion-MNIST, CelebA-Gender-32) take the authors' configs:
  B = 4,096 (2,048), K = 32, Adam 3e-4, EMA 0.999, C = 1, 300 epochs = T = 4,500 (27,000
  on our CelebA-Gender-32), 50 Euler steps. σ is calibrated here at q = B/N with our RDP
  orders; theirs come from Opacus' loader rate 1/⌈N/B⌉ (σ 2.549 here vs 2.488 at ε = 10).
  At ε = 0.2 their MNIST config uses a v-prediction denoiser (and sets ε = 10 inside a file
  named eps_0.2): here it is EDM at every ε. Their CelebA model is unconditional; ours is
  conditional on gender (the harness' CelebA-Gender tables need labels). The network is our
  DDPM++-style ``ConditionalUNet`` with NCSN++'s widths, depth and attention, not NCSN++
  itself (plain conv down/up-sampling instead of BigGAN blocks). The paper presets have not
  run yet (a GPU job).
- ``quick`` (digits 16×16, CPU): nf = 8, levels (1, 2), one block per level, no attention,
  K = 2, B = 32, 1,000 steps, 12 Heun steps, chosen on the validation part
  (benchmarks/presets.md, "dpdm"); the paper's network, K = 32 and B = 4,096 are far beyond a
  CPU budget. The DP step costs ~2.7× the same non-private step here (one thread, B·K = 64
  rows).

DP-FETA's warm start (``--set warmup=central``; Li et al., *From Easy to Hard: Building a
Shortcut for Differentially Private Image Synthesis*, S&P 2025, as DPImageBench runs it,
``data/dataset_loader.py:CentralDataset`` and ``models/dpsgd_diffusion.py:warm_up``):

- **Central images** (``central_images``): ``central_queries`` times, a Poisson sample of
  the training split at rate ``central_batch``/N; per class, the sum of the sample's images
  (pixels in [0, 1]) average-pooled by ``central_downsample``, released with Gaussian noise
  of std ``central_sigma``·Δ, Δ = √(pixels of one pooled image), the most one record can move
  the sums (``privacy.release.GaussianRelease``: counted before the noise, audited
  white-box like every release); divided by the expected class count central_batch/K;
  clamped, upsampled (bilinear), quantised, median-filtered (3×3) and sharpened (grey only),
  as DPImageBench does. In the ledger: the part ``central``, a Poisson subsampled Gaussian
  (noise multiplier ``central_sigma``, rate central_batch/N, ``central_queries`` steps;
  or, with ``central_share`` s, the σ whose queries alone spend s·ε); DP-SGD's σ is
  calibrated for what they leave of the target (``calibrate_beside``).
- **Warm-up** (``_warm_up``): ``warmup_steps`` non-private Adam steps (``warmup_lr``) of the
  EDM loss (K = 1) on batches of ``warmup_batch`` central images, each through RandAugment
  (2 ops, magnitude uniform in 1..9); an EMA alongside, whose weights start DP-SGD (a fresh
  Adam, a fresh EMA). A function of the released central images: no privacy cost.

Departures from DPImageBench's DP-FETA: the central images are noisy *sums* divided by the
expected class count (theirs: each class's mean over the sample, with the noise scaled for
the expected count: the actual count is a private number, so the exact mean's sensitivity
is not the one their noise is scaled for); pooling by averaging (theirs: nearest-neighbour
``F.interpolate``); no label dropout during the warm-up (their pretraining drops labels 10 %
of the time for classifier-free guidance, which our sampler does not use). The ``feta``
presets (MNIST, Fashion-MNIST) take their configs: central batch 6,000, σ 5, 5 queries,
2,000 warm-up steps of 50, then their DPDM settings (150 epochs: T = 2,250; NCSN++ nf = 32,
ch_mult (2, 2), attention at 14, B = 4,096, K = 32, 50-step "ddim"). ``quick-feta`` (digits,
mnist-5k, CPU): the central images from the whole split (rate 1), five queries, σ calibrated
to 30 % of ε (``central_share``), 600 warm-up steps.

The runs behind the presets (the quick ones, DP-FETA's warm start, the `long` one on full
MNIST): benchmarks/presets.md, "dpdm".
"""

from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass
from typing import Annotated

import torch
import torch.nn.functional as F
from torch import nn

from dpgen_bench.api import Budget, DataInfo, Method, PrivacyPart, RunContext, Split
from dpgen_bench.errors import UserError
from dpgen_bench.nets.averaging import EmaWarmup, settle_warmup, update_average
from dpgen_bench.nets.unet import ConditionalUNet
from dpgen_bench.privacy import (calibrate_noise, dpsgd_noise_to_signal, parameter_count, release_noise_to_signal,
                                 steps_and_noise)
from dpgen_bench.privacy.accounting import calibrate_beside
from dpgen_bench.privacy.dpsgd import empty_batch, make_private, poisson_batch, private_chunk
from dpgen_bench.privacy.release import GaussianRelease
from dpgen_bench.settings import (Decay, Finite, Interval, NonNegativeFloat, NonNegativeInt, PositiveFloat,
                                  PositiveInt, check_declared)

PART = "denoiser"
CENTRAL = "central"
SIGMA_DATA = 0.5
SAMPLERS = ("heun", "euler")
WARMUPS = ("none", "central")


@dataclass(frozen=True)
class DPDMHparams:
    batch_size: PositiveInt = 4096  # expected examples per step B (Poisson); each gives K rows
    noise_multiplicity: PositiveInt = 32  # K
    steps: PositiveInt | None = None  # T; σ_DP calibrated from it
    noise_multiplier: PositiveFloat | None = None  # σ_DP fixed; T from the budget
    max_grad_norm: PositiveFloat = 1.0  # C
    lr: PositiveFloat = 3e-4
    ema_decay: Decay = 0.999
    # how the average starts (dpgen_bench/nets/averaging.py): bias-corrected keeps none of the
    # net's initial weights; "none" (records before it) keeps β^T of them
    ema_warmup: EmaWarmup = "bias-corrected"
    nf: PositiveInt = 32
    ch_mult: tuple[PositiveInt, ...] = (1, 2, 2)
    num_res_blocks: PositiveInt = 2
    attn_resolutions: tuple[PositiveInt, ...] = (7,)
    dropout: Annotated[float, Interval(0, 1, "[)")] = 0.0
    p_mean: Annotated[float, Finite()] = -1.2  # log σ of training noise levels ~ N(p_mean, p_std²): any sign
    p_std: PositiveFloat = 1.2
    sampler: str = "heun"  # "heun": EDM's Heun (2N − 1 evaluations); "euler": the authors' "ddim" (N)
    sampler_steps: PositiveInt = 18  # N: points of the ρ schedule from σ_max to σ_min
    sigma_min: PositiveFloat = 0.002
    sigma_max: PositiveFloat = 80.0
    rho: PositiveFloat = 7.0
    s_churn: NonNegativeFloat = 0.0  # 0: deterministic Heun
    s_tmin: NonNegativeFloat = 0.05
    s_tmax: NonNegativeFloat = 50.0
    s_noise: NonNegativeFloat = 1.003
    log_every: PositiveInt = 50
    max_physical_batch: PositiveInt | None = None  # examples (K rows each) per chunk of a step; None: one pass
    # DP-FETA's warm start (module docstring): "central" pretrains on noisy class means first
    warmup: str = "none"
    central_batch: PositiveInt = 6000  # expected records per central-image query (Poisson, rate central_batch/N)
    central_queries: PositiveInt = 5  # queries, each one noisy image per class
    central_sigma: PositiveFloat = 5.0  # noise multiplier of each query (std central_sigma·Δ)
    # instead of central_sigma: σ calibrated so that the queries spend this share of ε
    central_share: Annotated[float, Interval(0, 1, "()")] | None = None
    central_downsample: PositiveInt = 2  # average-pooling factor before the release
    warmup_steps: NonNegativeInt = 2000
    warmup_batch: PositiveInt = 50
    warmup_lr: PositiveFloat = 3e-4
    warmup_augment: bool = True  # RandAugment (2 ops, magnitude 1..9) on every central image drawn

    def __post_init__(self):
        check_declared(self)
        settle_warmup(self, "none")
        if self.sampler not in SAMPLERS:
            raise ValueError(f"sampler must be one of {', '.join(SAMPLERS)}")
        if self.warmup not in WARMUPS:
            raise ValueError(f"warmup must be one of {', '.join(WARMUPS)}")
        if not self.sigma_min < self.sigma_max:
            raise ValueError(f"sigma_min ({self.sigma_min}) must be below sigma_max ({self.sigma_max})")
        object.__setattr__(self, "ch_mult", tuple(int(c) for c in self.ch_mult))
        object.__setattr__(self, "attn_resolutions", tuple(int(r) for r in self.attn_resolutions))


def precondition(sigma: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """EDM's (c_skip, c_out, c_in, c_noise) at noise levels ``sigma`` (one per row)."""
    s2 = sigma ** 2 + SIGMA_DATA ** 2
    return SIGMA_DATA ** 2 / s2, sigma * SIGMA_DATA / s2.sqrt(), 1 / s2.sqrt(), sigma.log() / 4


def denoise(net: nn.Module, x: torch.Tensor, sigma: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """D(x; σ, y) = c_skip·x + c_out·F(c_in·x; c_noise, y)."""
    c_skip, c_out, c_in, c_noise = precondition(sigma)
    view = (-1, 1, 1, 1)
    return c_skip.view(view) * x + c_out.view(view) * net(c_in.view(view) * x, c_noise, labels)


def edm_loss(net: nn.Module, x: torch.Tensor, labels: torch.Tensor, sigma: torch.Tensor,
             noise: torch.Tensor) -> torch.Tensor:
    """Per-row λ(σ)·mean((D(x + σn; σ) − x)²) (EDM's loss, weighted to unit variance at init)."""
    weight = (sigma ** 2 + SIGMA_DATA ** 2) / (sigma * SIGMA_DATA) ** 2
    d = denoise(net, x + sigma.view(-1, 1, 1, 1) * noise, sigma, labels)
    return weight * (d - x).pow(2).flatten(1).mean(1)


def sigma_schedule(h: DPDMHparams, device=None) -> torch.Tensor:
    """EDM's t_0 > … > t_{N−1} on the ρ schedule, then t_N = 0."""
    i = torch.arange(h.sampler_steps, dtype=torch.float64, device=device)
    n = max(h.sampler_steps - 1, 1)
    t = (h.sigma_max ** (1 / h.rho) + i / n * (h.sigma_min ** (1 / h.rho) - h.sigma_max ** (1 / h.rho))) ** h.rho
    return torch.cat([t, torch.zeros(1, dtype=torch.float64, device=device)])


@torch.no_grad()
def edm_sample(net: nn.Module, labels: torch.Tensor, shape: tuple[int, ...], h: DPDMHparams,
               rng: torch.Generator) -> torch.Tensor:
    """EDM's Heun sampler (Algorithm 2 of Karras et al.; deterministic when S_churn = 0).
    Runs on ``net``'s device; its noise is drawn from ``rng`` on the CPU, so the draws do
    not depend on the device."""
    dev = _device_of(net)
    labels = labels.to(dev)
    t = sigma_schedule(h)
    x = torch.randn(len(labels), *shape, generator=rng, dtype=torch.float64).to(dev) * t[0]
    n = h.sampler_steps
    for i in range(n):
        t_cur, t_next = t[i], t[i + 1]
        gamma = min(h.s_churn / n, math.sqrt(2) - 1) if h.s_tmin <= t_cur <= h.s_tmax else 0.0
        t_hat = t_cur * (1 + gamma)
        if gamma > 0:
            x = x + (t_hat ** 2 - t_cur ** 2).sqrt() * h.s_noise * torch.randn(x.shape, generator=rng,
                                                                                dtype=torch.float64).to(dev)
        d = (x - _d(net, x, t_hat, labels)) / t_hat
        x_next = x + (t_next - t_hat) * d
        if t_next > 0:  # Heun's correction
            d2 = (x_next - _d(net, x_next, t_next, labels)) / t_next
            x_next = x + (t_next - t_hat) * (d + d2) / 2
        x = x_next
    return x.float()


@torch.no_grad()
def euler_sample(net: nn.Module, labels: torch.Tensor, shape: tuple[int, ...], h: DPDMHparams,
                 rng: torch.Generator) -> torch.Tensor:
    """The authors' deterministic "ddim" sampler (``samplers.py`` of nv-tlabs/DPDM, the one
    their MNIST / Fashion-MNIST / CelebA configs use): Euler steps of the probability-flow
    ODE dx/dt = (x − D(x; t))/t between the N points t_0 = σ_max > … > t_{N−1} = σ_min of
    the ρ schedule (N − 1 evaluations), then the output is the denoiser's estimate
    D(x; σ_min) (one more): N network evaluations in all. Runs on ``net``'s device, its
    noise drawn from ``rng`` on the CPU."""
    dev = _device_of(net)
    labels = labels.to(dev)
    t = sigma_schedule(h)[:-1]  # t_0 … t_{N−1}; no t_N = 0 here
    x = torch.randn(len(labels), *shape, generator=rng, dtype=torch.float64).to(dev) * t[0]
    for i in range(len(t) - 1):
        x = x + (t[i + 1] - t[i]) * (x - _d(net, x, t[i], labels)) / t[i]
    return _d(net, x, t[-1], labels).float()


def _d(net, x, t, labels):
    sigma = torch.full((len(x),), float(t), device=x.device)
    return denoise(net, x.float(), sigma, labels).double()


def _device_of(net: nn.Module) -> torch.device:
    return next(iter(net.parameters()), torch.empty(0)).device


def median3(x: torch.Tensor) -> torch.Tensor:
    """3×3 median filter per channel, edges replicated (OpenCV's ``medianBlur(·, 3)``)."""
    n, c, h, w = x.shape
    patches = F.unfold(F.pad(x, (1, 1, 1, 1), mode="replicate"), 3)  # [n, c·9, h·w]
    return patches.view(n, c, 9, h * w).median(dim=2).values.view(n, c, h, w)


SHARPEN = torch.tensor([[0.0, -1.0, 0.0], [-1.0, 5.0, -1.0], [0.0, -1.0, 0.0]])


def sharpen(x: torch.Tensor) -> torch.Tensor:
    """OpenCV's ``filter2D`` with DPImageBench's sharpening kernel, reflected edges
    (BORDER_REFLECT_101), on 0..255 values, saturated to 0..255."""
    k = SHARPEN.to(x).view(1, 1, 3, 3).repeat(x.shape[1], 1, 1, 1)
    out = F.conv2d(F.pad(x, (1, 1, 1, 1), mode="reflect"), k, groups=x.shape[1])
    return out.round().clamp(0, 255)


def central_sums(images: torch.Tensor, labels: torch.Tensor, num_classes: int, downsample: int) -> torch.Tensor:
    """Per-class sums of the images (in [-1, 1]) mapped to [0, 1] and average-pooled by
    ``downsample``: [K, C, H/ds, W/ds]. One record moves one class's sum by its pooled image,
    whose pixels are in [0, 1]: by at most √(C·H·W/ds²) in L2 (the release's Δ)."""
    k = num_classes
    c, h, w = images.shape[1:]
    sums = torch.zeros(k, c, h // downsample, w // downsample, device=images.device)
    if len(images):
        sums.index_add_(0, labels.long(), F.avg_pool2d((images.float() + 1) / 2, downsample))
    return sums


def central_post_process(means01: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """Released pooled means in [0, 1]-ish → uint8 images of ``size``: clamp, bilinear
    upsampling, quantisation, median 3×3, and the sharpening kernel for grey images
    (DPImageBench's ``CentralDataset.post_process``; post-processing, no privacy cost)."""
    x = F.interpolate(means01.clamp(0, 1), size=size, mode="bilinear", align_corners=False)
    x = (x * 255).floor().clamp(0, 255)  # their .to(torch.uint8) truncates
    x = median3(x)
    if x.shape[1] == 1:
        x = sharpen(x)
    return x.to(torch.uint8)


# the quick preset on mnist (the demo's minute); mnist-5k's trains it longer, `long` longer at a larger batch
_QUICK_MNIST = dict(batch_size=32, noise_multiplicity=1, steps=100, nf=8, ch_mult=(1, 2), num_res_blocks=1,
                    attn_resolutions=(), lr=1e-3, ema_decay=0.98, sampler_steps=4, samples_per_class=100)
_PAPER_28 = dict(batch_size=4096, noise_multiplicity=32, steps=4500, max_grad_norm=1.0, lr=3e-4, ema_decay=0.999,
                 nf=32, ch_mult=(1, 2, 2), num_res_blocks=2, attn_resolutions=(7,), dropout=0.0, p_mean=-1.2,
                 p_std=1.2, sampler="euler", sampler_steps=50, max_physical_batch=64)


class DPDM(Method):
    """DPDM: a class-conditional diffusion model (EDM) trained with DP-SGD and noise multiplicity."""

    name = "dpdm"
    private = True
    conditional = True
    Hparams = DPDMHparams
    bookkeeping_hparams = Method.bookkeeping_hparams | {"max_physical_batch"}
    # DP-FETA's warm start came after the first dpdm runs: at these values a run is as before
    late_hparams = {"ema_warmup": "none"} | {f.name: f.default for f in dataclasses.fields(DPDMHparams)
                    if f.name in ("warmup", "central_batch", "central_queries", "central_sigma", "central_share",
                                  "central_downsample", "warmup_steps", "warmup_batch", "warmup_lr", "warmup_augment")}
    presets = {
        "quick": {
            # a narrow U-Net and more steps, chosen on val (benchmarks/presets.md, "dpdm")
            "digits": dict(batch_size=32, noise_multiplicity=2, steps=1000, nf=8, ch_mult=(1, 2),
                           num_res_blocks=1, attn_resolutions=(), lr=1e-3, ema_decay=0.99, sampler_steps=12,
                           samples_per_class=100),
            # the demo's budget; nothing within it beats this on val (benchmarks/presets.md, "dpdm")
            "mnist-5k": dict(_QUICK_MNIST, steps=150, sampler_steps=6),
            # T = 100, 4 sampler steps: at chance as mnist-5k's (presets.md, "The demo on full MNIST")
            "mnist": _QUICK_MNIST,
        },
        # the quick net at B = 256, T = 1,500: noise to signal 0.40 (benchmarks/presets.md, "dpdm's hour on mnist")
        "long": {
            "mnist": dict(_QUICK_MNIST, batch_size=256, steps=1500, sampler_steps=8),
        },
        # the paper's MNIST preset cut to T = 12 steps (benchmarks/README.md, "MNIST on a GPU")
        "gpu-short": {"mnist": dict(_PAPER_28, steps=12, samples_per_class=6000)},
        # the authors' configs, T = 300 epochs of ⌈N/B⌉ batches (docs/provenance.md, "dpdm")
        "paper": {
            "mnist": dict(_PAPER_28, samples_per_class=6000),
            "fashion-mnist": dict(_PAPER_28, samples_per_class=6000),
            "celeba-gender-32": dict(_PAPER_28, batch_size=2048, steps=27_000, attn_resolutions=(16, 8),
                                     max_physical_batch=32, delta=1e-6, samples_per_class=30_000),
        },
        # the first increment's digits net + DP-FETA's warm start (benchmarks/presets.md, "DP-FETA's warm start")
        "quick-feta": {
            "digits": dict(batch_size=32, noise_multiplicity=2, steps=400, nf=16, ch_mult=(1, 2), num_res_blocks=1,
                           attn_resolutions=(), lr=1e-3, ema_decay=0.99, sampler_steps=12, samples_per_class=100,
                           warmup="central", central_batch=1437, central_queries=5, central_share=0.3,
                           warmup_steps=600, warmup_batch=50, warmup_lr=3e-4),
            "mnist-5k": dict(_QUICK_MNIST, steps=150, sampler_steps=6,
                             warmup="central", central_batch=4000, central_queries=5, central_share=0.3,
                             warmup_steps=600, warmup_batch=50, warmup_lr=3e-4),
        },
        # DP-FETA as DPImageBench runs it (docs/provenance.md, "dpdm --preset feta")
        "feta": {
            "mnist": dict(_PAPER_28, steps=2250, ch_mult=(2, 2), attn_resolutions=(14,), warmup="central",
                          central_batch=6000, central_queries=5, central_sigma=5.0, warmup_steps=2000,
                          warmup_batch=50, warmup_lr=3e-4, samples_per_class=6000),
            "fashion-mnist": dict(_PAPER_28, steps=2250, ch_mult=(2, 2), attn_resolutions=(14,), warmup="central",
                                  central_batch=6000, central_queries=5, central_sigma=5.0, warmup_steps=2000,
                                  warmup_batch=50, warmup_lr=3e-4, samples_per_class=6000),
        },
        "tiny": {
            "*": dict(batch_size=16, noise_multiplicity=2, steps=8, nf=8, ch_mult=(1, 2), num_res_blocks=1,
                      attn_resolutions=(), lr=1e-3, ema_decay=0.9, sampler_steps=3, samples_per_class=10),
        },
    }

    def __init__(self, hparams: DPDMHparams, info: DataInfo):
        super().__init__(hparams, info)
        h = hparams
        self.net = ConditionalUNet(info.image_shape, info.num_classes, h.nf, h.ch_mult, h.num_res_blocks,
                                   h.attn_resolutions, h.dropout)
        self.ema = copy.deepcopy(self.net).requires_grad_(False)
        # where sample() runs the U-Net: fit's device (the weights rest on the CPU between
        # calls, as every method's do). 50-odd network evaluations per image make sampling a
        # GPU's job: the paper preset's 60,000 images would take hours on a few CPU cores.
        self.sample_device = torch.device("cpu")

    @property
    def central_rate(self) -> float:
        return min(1.0, self.hparams.central_batch / self.info.n_train)

    def noise_to_signal(self, part: PrivacyPart) -> float:
        """DP-SGD: σ·√d_U-Net / B. The central images: each class's noisy sum of pooled
        images read as the mean of its expected rate·N/k records (``central_images``)."""
        h = self.hparams
        if part.name == CENTRAL:
            c, hh, ww = self.info.image_shape
            pooled = c * (hh // h.central_downsample) * (ww // h.central_downsample)
            per_class = self.central_rate * self.info.n_train / self.info.num_classes
            return release_noise_to_signal(part.noise_multiplier, pooled, per_class)
        return dpsgd_noise_to_signal(part.noise_multiplier, parameter_count(self.net), h.batch_size)

    def plan(self, budget: Budget) -> list[PrivacyPart]:
        h = self.hparams
        if h.warmup == "none":
            sigma, steps = steps_and_noise(method=self.name, epsilon=budget.epsilon, delta=budget.delta,
                                           sample_rate=self.sample_rate, steps=h.steps,
                                           noise_multiplier=h.noise_multiplier)
            return [PrivacyPart(PART, noise_multiplier=float(sigma), sample_rate=self.sample_rate, steps=int(steps))]
        sigma_c = h.central_sigma
        if h.central_share is not None:  # the queries alone spend share·ε (RDP); DP-SGD gets the rest
            sigma_c = calibrate_noise(epsilon=h.central_share * budget.epsilon, delta=budget.delta,
                                      sample_rate=self.central_rate, steps=int(h.central_queries))
        central = PrivacyPart(CENTRAL, noise_multiplier=float(sigma_c), sample_rate=self.central_rate,
                              steps=int(h.central_queries))
        if h.steps is None or h.noise_multiplier is not None:
            raise UserError("dpdm with warmup=central needs steps set and noise_multiplier unset: DP-SGD's σ is "
                            "calibrated for what the central images leave of the budget (--set steps=N)")
        sigma = calibrate_beside([central], epsilon=budget.epsilon, delta=budget.delta,
                                 sample_rate=self.sample_rate, steps=int(h.steps))
        return [central, PrivacyPart(PART, noise_multiplier=float(sigma), sample_rate=self.sample_rate,
                                     steps=int(h.steps))]

    # ----------------------------------------------------------------- DP-FETA's warm start

    def central_images(self, train: Split, ctx: RunContext, data_gen: torch.Generator,
                       noise_gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """``central_queries`` noisy class means (module docstring), uint8 [Q·K, C, H, W] and
        their labels. Each query: a Poisson sample at ``central_rate``, per-class sums of the
        pooled [0, 1] images through the part's ``GaussianRelease`` (Δ = √(pooled pixels))."""
        h, k = self.hparams, self.info.num_classes
        c, hh, ww = self.info.image_shape
        ds = h.central_downsample
        if hh % ds or ww % ds:
            raise UserError(f"central_downsample {ds} does not divide the image size {hh}×{ww}")
        pooled = c * (hh // ds) * (ww // ds)
        release = GaussianRelease(ctx, CENTRAL, sensitivity=math.sqrt(pooled), generator=noise_gen)
        # the plan's expected class count: public (the plan's N and the rate), never the split's
        # size, which depends on the data (under bench audit's canaries, on which were drawn in)
        per_class = self.central_rate * self.info.n_train / k
        images, labels = [], []
        for _ in range(h.central_queries):
            idx = poisson_batch(len(train), self.central_rate, data_gen, train.images.device)
            sums = central_sums(train.images[idx], train.labels[idx], k, ds)
            noisy = release(sums)  # counted in the ledger before the noise is drawn
            images.append(central_post_process(noisy.cpu() / per_class, (hh, ww)))
            labels.append(torch.arange(k))
        return torch.cat(images), torch.cat(labels)

    def _warm_up(self, images: torch.Tensor, labels: torch.Tensor, ctx: RunContext) -> None:
        """``warmup_steps`` non-private Adam steps of the EDM loss (K = 1) on the central
        images (RandAugment on each draw); the net ends at its EMA weights."""
        from torchvision.transforms import v2

        h, dev = self.hparams, ctx.device
        opt = torch.optim.Adam(self.net.parameters(), lr=h.warmup_lr)
        gen = ctx.generator("warmup", offset=3)
        diff_gen = ctx.generator("warmup-diffusion", offset=4)
        self.ema.load_state_dict(self.net.state_dict())
        order = torch.zeros(0, dtype=torch.long)
        bar = ctx.progress(total=h.warmup_steps, desc=f"{self.name} warm-up")
        seed = int(torch.randint(0, 2 ** 31 - 1, (1,), generator=gen, device=gen.device))
        with torch.random.fork_rng(devices=[]):  # RandAugment draws from the global generator
            torch.manual_seed(seed)
            for t in range(1, h.warmup_steps + 1):
                if len(order) < h.warmup_batch:
                    order = torch.cat([order, torch.randperm(len(images), generator=gen, device=gen.device).cpu()])
                idx, order = order[:h.warmup_batch], order[h.warmup_batch:]
                x = images[idx]
                if h.warmup_augment:
                    x = torch.stack([v2.RandAugment(num_ops=2, magnitude=int(torch.randint(1, 10, (1,))))(img)
                                     for img in x])
                x, y, sigma, noise = self._rows((x.float() / 127.5 - 1).to(dev), labels[idx].to(dev), diff_gen, k=1)
                loss = edm_loss(self.net, x, y, sigma, noise).mean()
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                update_average(self.ema, self.net, h.ema_decay, t, h.ema_warmup)
                bar.update(1)
                if t % h.log_every == 0 or t == h.warmup_steps:
                    ctx.record(step=t, warmup_loss=loss.item())
        bar.close()
        self.net.load_state_dict(self.ema.state_dict())

    # ----------------------------------------------------------------- training

    def _rows(self, x: torch.Tensor, y: torch.Tensor, gen: torch.Generator, k: int | None = None):
        """K noised copies of each example, side by side (rows iK … iK+K−1 are example i);
        ``k`` overrides K (the warm-up draws one row per image)."""
        k = self.hparams.noise_multiplicity if k is None else k
        x, y = x.repeat_interleave(k, 0), y.repeat_interleave(k, 0)
        sigma = (torch.randn(len(x), generator=gen, device=x.device) * self.hparams.p_std + self.hparams.p_mean).exp()
        noise = torch.randn(x.shape, generator=gen, device=x.device)
        return x, y, sigma, noise

    def _step(self, net, opt, train: Split, idx: torch.Tensor, gen: torch.Generator) -> float:
        """One update on the examples ``idx`` (K noised rows each); returns the mean row loss.

        With ``max_physical_batch`` the examples go through the network in chunks (the
        authors use Opacus' BatchMemoryManager, physical batches of 8,192). Private: each
        chunk's per-example gradients (each over its K rows) are clipped and summed with the
        step skipped (``signal_skip_step``); the last chunk adds the noise once and steps,
        so the update is Σ clip(g_i, C) + N(0, σ²C²) over the whole batch, divided by B,
        whatever the chunking. Non-private: chunk means weighted by their share of the rows.
        Every row's (σ, n) is drawn for the whole batch first: chunking changes nothing."""
        k, cap = self.hparams.noise_multiplicity, self.hparams.max_physical_batch
        x, y, sigma, noise = self._rows(train.images[idx], train.labels[idx], gen)
        chunks = 1 if cap is None or len(idx) <= cap else math.ceil(len(idx) / cap)
        total = 0.0
        for i, ex in enumerate(torch.arange(len(idx)).tensor_split(chunks)):
            rows = slice(int(ex[0]) * k, (int(ex[-1]) + 1) * k)
            losses = edm_loss(net, x[rows], y[rows], sigma[rows], noise[rows])
            total += losses.detach().sum().item()
            if not self.private:
                (losses.mean() * (len(losses) / len(x))).backward()
                continue
            private_chunk(net, opt, losses, last=i == chunks - 1, group=k)
        if not self.private:
            opt.step()
        return total / len(x)

    def fit(self, train: Split, budget: Budget, ctx: RunContext) -> None:
        h, dev = self.hparams, ctx.device
        self.sample_device = torch.device(dev)
        train = train.to(dev)
        self.net.to(dev).train()
        self.ema.to(dev)
        data_gen = ctx.generator("data")
        diff_gen = ctx.generator("diffusion", offset=1)  # σ and n of every row
        noise_gen = ctx.generator("noise", offset=2)  # DP-SGD's noise
        r = ctx.restore()
        if r is None and h.warmup == "central":  # before DP-SGD (a resumed run is past it)
            if not self.private:
                raise UserError("warmup=central releases noisy class means: it needs a private run (a finite --eps)")
            images, labels = self.central_images(train, ctx, data_gen, ctx.generator("central-noise", offset=5))
            self.central = (images, labels)  # kept for inspection (tests, benchmarks)
            self._warm_up(images, labels, ctx)  # ends with the net at its EMA weights: DP-SGD's start and EMA's
        opt = torch.optim.Adam(self.net.parameters(), lr=h.lr)
        if self.private:
            total = ctx.part(PART).steps
            net, opt = make_private(self.net, opt, ctx=ctx, part=PART, max_grad_norm=h.max_grad_norm,
                                    expected_batch_size=h.batch_size, grad_sample_mode="bk",
                                    noise_generator=noise_gen)
        else:
            total, net = h.steps, self.net
        q = self.sample_rate
        start = 1
        inner = opt.original_optimizer if self.private else opt
        if r is not None:
            self.net.load_state_dict(r["net"])
            self.ema.load_state_dict(r["ema"])
            inner.load_state_dict(r["opt"])
            start = r["t"] + 1
        bar = ctx.progress(total=total, desc=f"{self.name} steps")
        bar.update(start - 1)
        for t in range(start, total + 1):
            idx = poisson_batch(len(train), q, data_gen, dev)
            opt.zero_grad(set_to_none=True)
            if len(idx) == 0:  # an empty Poisson batch: a pure-noise step, counted like every other
                if self.private:
                    empty_batch(net)
                opt.step()
            else:
                ctx.accumulate(loss=self._step(net, opt, train, idx, diff_gen))
            update_average(self.ema, self.net, h.ema_decay, t, h.ema_warmup)
            bar.update(1)
            if t % h.log_every == 0 or t == total:
                ctx.record(step=t)
            if t < total and ctx.checkpoint_due():
                ctx.checkpoint({"net": self.net.state_dict(), "ema": self.ema.state_dict(),
                                "opt": inner.state_dict(), "t": t})
        bar.close()
        if self.private:
            net._close()
        self.net.cpu().eval()
        self.ema.cpu().eval()

    # ----------------------------------------------------------------- sampling

    def sample(self, n: int, labels: torch.Tensor | None, rng: torch.Generator):
        if labels is None:
            labels = torch.randint(0, self.info.num_classes, (n,), generator=rng)
        labels = labels.long().cpu()
        net = self.ema.to(self.sample_device).eval()
        sampler = edm_sample if self.hparams.sampler == "heun" else euler_sample
        try:
            out = [sampler(net, labels[i:i + 512], self.info.image_shape, self.hparams, rng).cpu()
                   for i in range(0, n, 512)]
        finally:
            self.ema.cpu()
        images = torch.cat(out) if out else torch.zeros(0, *self.info.image_shape)
        return images.clamp(-1, 1), labels

    def state_dict(self) -> dict:
        return {"net": self.net.state_dict(), "ema": self.ema.state_dict(),
                "hparams": dataclasses.asdict(self.hparams)}

    def load_state_dict(self, state: dict) -> None:
        self.net.load_state_dict(state["net"])
        self.ema.load_state_dict(state["ema"])
