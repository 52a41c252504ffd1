"""GS-WGAN (Chen, Orekondy, Fritz; NeurIPS 2020), the base of DP-GAN-DPAC (Chen et al.,
CVPR 2023, §3-4.1 "Remark on privacy-preservation", Eq. 5-9, §5.1).

Training (GS-WGAN Alg. 1; official code ``source/main.py``, ``pretrain.py``):

- The private training set is split once into K disjoint subsets d_1..d_K: every record
  is assigned to one subset, independently and uniformly at random (seeded).
  Discriminator D_k sees only d_k. Each D_k is first *pretrained* on d_k against its own throw-away non-private
  generator (``pretrain_steps`` iterations of ``n_d`` critic steps + one generator step).
  The official code pretrains in parallel jobs and saves each D_k; here they run in turn,
  from one random stream, and the run's checkpoints cover them (within a D_k, with its
  throw-away generator), so a day of pretraining survives a killed job.
- Each generator iteration t = 1..T: draw k uniformly from {1..K} (seeded, independent
  across steps); train D_k ``n_d`` steps of WGAN-GP (λ = 10) with the drift penalty
  0.001·D(x)² on real batches of d_k and fakes of the *same* labels; then one
  generator step on B fresh fakes with uniform labels, loss −Σᵢ D_k(G(zᵢ, yᵢ), yᵢ).
- The generator's gradient is sanitised on the generated images (Eq. 5, 9): a hook on
  x = G(z, y) clips each example's ∂L/∂xᵢ to L2 norm C (ζ = 1) and adds N(0, σ_h²C²) per
  coordinate (``dpgen_bench.privacy.sanitizer``); only G's parameters receive gradient.
- Adam(1e-4, β = (0.5, 0.9)) for D and G; spectral norm in D (projection discriminator,
  DCGAN-style 5×5 stride-2 convolutions) and G (``dpgen_bench.nets.resnet``, BigGAN-style);
  samples come from an exponential moving average of G's weights (0.999, as ``netGS``).
- Only the generator is released: the discriminators (and the pretraining generators)
  are discarded; ``state_dict`` holds the sampling generator only.

Privacy (the ledger's part ``generator_gradient``). What reaches the output is the
sequence of sanitised image-gradient batches M_t (G's weights are post-processing of
them: the Jacobian J_G does not depend on data). Fix a record x; it lies in exactly one
subset d_{k(x)}. Everything that depends on x -- D_{k(x)}'s pretraining and every later
update of D_{k(x)} -- feeds into M_t only at steps where k_t = k(x), which happens with
probability 1/K, independently at each step. At such a step D_{k(x)} is a function of
the *whole* subset, not of the B records in this step's batch (it was pretrained on all
of d_k and keeps training on it), so every member of d_k must be counted as used. Hence:

- sampling rate q = 1/K per generator step (GS-WGAN's ``privacy_analysis.py`` also uses
  ``prob = 1/num_discriminators``). The rate B/N ("a discriminator w.p. 1/K, then B of its
  N/K records") would be right only if D_k depended on this step's batch alone; it
  depends on all of d_k, so B/N under-counts and is not used;
- sensitivity: every discriminator's sanitised batch is N(μ, σ_h²C²·I) with each of the B
  rows of μ clipped to norm C, whatever the data, so any two such means are at most 2C√B
  apart (GS-WGAN's ``SENSITIVITY = 2``, times √B because all B rows come from the same
  D_k, and so from the same sampling event). The accounted noise multiplier is therefore
  σ = σ_h / (2√B), i.e. the hook adds per-coordinate noise σ_h·C = 2√B·σ·C;
- the mechanism: with probability 1 − 1/K another discriminator is drawn (P0, the same
  for both neighbours), with probability 1/K D_{k(x)} is (A versus A′). Neither side is
  P0 alone, which is the structure of sampling *without replacement*, not of Poisson
  add/remove. The step *is* the WOR-subsampled Gaussian mechanism with a sample of 1 out of
  K and sensitivity 2C√B (docs/privacy.md, Claim 3), so the part
  ``subsampled_gaussian_wor_t27`` is accounted with Theorem 27 of Wang, Balle,
  Kasiviswanathan (arXiv 1808.00087), the Gaussian-specific bound dp-accounting implements
  (``dpgen_bench.privacy.accounting``). Theorem 9 of the same paper (the generic bound
  autodp computes, used here before) has a σ-independent floor: at the digits quick preset
  ε = 1 needed σ = 130, now 4.44.
- Pretraining costs nothing *separately*: its only effect on the output is through
  D_{k(x)}, i.e. through the steps already counted above. This needs each D_k's
  pretraining generator to be its own (as in GS-WGAN's ``pretrain.py``): one generator
  shared across discriminators would carry every subset into every D_k, and then every
  step would touch every record (q = 1).
- T = number of generator steps; the ledger is charged once per generator step.

Departures from the papers:
- Accounting. GS-WGAN's code composes T·B subsampled Gaussians (σ = 1.07, rate 1/K,
  autodp's Theorem-9 bound), amplifying each of the B per-example gradients of a step
  separately although all B share one sampling event (the choice of k). We compose T
  steps of one subsampled Gaussian over the whole batch (noise multiplier σ_h/(2√B), rate
  1/K, Theorem 27's bound, above): at the same σ_h this is far more expensive, so σ_h (or
  T) is calibrated from the target ε as everywhere in this harness. The paper's σ = 1.07 /
  20,000 iterations (ε = 10 by its accounting) is not reproduced by default; ``paper``
  presets keep T = 20,000, K = 1,000, B = 32 and calibrate σ.
  ``--set privacy_mode=paper`` runs GS-WGAN's accounting instead, to reproduce its
  published setting: the ledger is charged B Gaussians per generator step (T·B in all,
  rate 1/K, noise multiplier σ, Theorem 9 as in autodp) and the hook adds 2σ·C per
  coordinate, so σ = 1.07, T = 20,000, B = 32, K = 1,000 composes to ε = 9.99 (δ = 1e-5),
  exactly autodp's number, and ``--eps 10`` calibrates σ = 1.07. Its ε is not a DP
  guarantee: privacy.json carries the caveat and ``bench report`` marks it ‡. DP-GAN-DPAC
  inherits both modes.
- The latent is N(0, I) (GS-WGAN's default is Bernoulli(0.5)) so that the membership
  attacks, which search z under a Gaussian prior, apply.
- Images are in [-1, 1] with a tanh output (GS-WGAN: [0, 1], sigmoid).
- The generator is BigGAN-style with halving channels and class-conditional pixel norm
  (``dpgen_bench.nets.resnet``); GS-WGAN's keeps 4·width channels and concatenates a
  one-hot label to z. 28×28 is reached from a 7×7 grid instead of cropping 32×32.
- The discriminator's three convolutions and projection head follow GS-WGAN's
  ``DiscriminatorDCGAN``; for 16×16 and 32×32 its last feature map is 2×2 / 4×4.
- Each record's subset is drawn independently (sizes are Binomial(N, 1/K)); GS-WGAN
  shuffles the indices and cuts N/K-sized pieces, dropping the N mod K remainder. With
  independent assignment, adding or removing one record leaves the other records'
  subsets distributed as before, which is what the 1/K argument assumes; a balanced cut
  moves records between subsets when N changes. An empty subset (probability
  K·(1−1/K)^N) trains nothing: its steps are still taken and accounted. Real batches are
  drawn uniformly without replacement from d_k at each critic step (GS-WGAN cycles
  through d_k in epochs). The choice of k has its own seeded generator.
- The hook sits on the generated image tensor, not on D's first convolution (GS-WGAN's
  ``register_backward_hook`` on ``netD.conv1``, switched between a dummy and the DP hook):
  the same gradient for GS-WGAN, but every consumer of x is covered (DP-GAN-DPAC's C), D's
  own training can never pass through it, and it avoids the module backward hook whose
  ``grad_input`` semantics changed across PyTorch versions (GS-WGAN's README warns).
  G's loss is a per-example sum and the hook scales by 1/B, which equals GS-WGAN's mean
  loss with its clip bound C/B.
- ``quick`` presets (CPU) shrink K, T, pretraining, widths and the EMA horizon, drop
  spectral norm and raise D's learning rate (1e-3) and G's Adam β₁ (0.9, with lr 2e-4) so
  that D learns in a few dozen steps and G averages its noisy gradient (``tiny``, for tests,
  only shrinks); the ``paper`` presets use the papers' values (see ``presets``).

Why GS-WGAN (and DP-GAN-DPAC) stays at chance on mnist-5k at every ε (the runs:
benchmarks/presets.md, "gswgan"). Two limits, measured apart:

- *Compute* binds the ``quick`` preset. With the digits settings (K = 50 discriminators, 3
  pretraining and ~10 critic steps each, T = 500) the pipeline stays at chance even without
  noise; the mnist-5k quick preset takes K = 10 (5 pretraining and ~50 critic steps each)
  and B = 16, the smallest budget seen at which it learns without noise (at the edge: one
  seed of three stays at chance). With four times the digits settings' compute (the
  ``long`` preset: 40 pretraining steps per discriminator, T = 2,000) the pipeline
  **without noise** draws digits.
- *Noise* binds everything else: the same long setting stays at chance at ε = 10 and near it
  at ε = 1,000, and so does K = 200 at ε = 10. The reason is structural. Under the sound
  accounting the hook adds 2√B·σ·C per coordinate to each of the B rows and scales by 1/B,
  so the noise reaching G's parameters, (1/B)·Σᵢ J_iᵀ nᵢ, has covariance 4σ²C²·E[JᵀJ]:
  the noise of one example's full-image gradient at multiplier 2σ, whatever B is (DP-SGD on
  a network's own parameters gets σC/B; ``tests/unit/test_gswgan.py`` checks the 2σC). The
  batch buys no averaging, so the only levers are σ and T, and at rate q = 1/K both move
  together: in the amplified regime σ grows like q·√T, so the noise averaged over T steps
  stops improving with T at fixed K. At K = 50 and T = 2,000 σ is 1.16 at ε = 10 and still
  0.39 at ε = 1,000 (noise 2σ = 0.77 per step); GS-WGAN's published MNIST run has 2σ/√B =
  0.38 per step (σ = 1.07 under its own per-row accounting) over 20,000 steps, and the sound
  accounting of that very setting 2·0.508 = 1.02. A smaller q needs a larger K, and so
  more records per discriminator and K pretrainings: at N = 4,000 on a CPU that is out of
  reach, and at ε ≤ 10 the sound mechanism stays far noisier than the paper's.

The runs behind the presets, on digits, mnist-5k and full MNIST: benchmarks/presets.md, "gswgan".
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from torch import nn

from dpgen_bench.api import Budget, DataInfo, Method, PrivacyPart, RunContext, Split
from dpgen_bench.errors import UserError
from dpgen_bench.nets.averaging import EmaWarmup, settle_warmup, update_average
from dpgen_bench.nets.projection import ProjectionDiscriminator
from dpgen_bench.nets.resnet import ConditionalResNetGenerator
from dpgen_bench.nets.sampling import ConditionalSampling
from dpgen_bench.privacy import steps_and_noise
from dpgen_bench.privacy.accounting import WOR, WOR_GAUSSIAN
from dpgen_bench.privacy.sanitizer import GradientSanitizer
from dpgen_bench.settings import (Decay, NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt,
                                  check_declared)

PART = "generator_gradient"


# ------------------------------------------------------------------------ hparams


@dataclass(frozen=True)
class GSWGANHparams:
    num_discriminators: PositiveInt = 1000  # K; sampling rate 1/K
    batch_size: PositiveInt = 32  # B: real batch per critic step and fakes per generator step
    n_d: PositiveInt = 5  # critic steps per generator step (GS-WGAN's critic_iters)
    steps: PositiveInt | None = None  # T generator steps; noise calibrated from the target
    noise_multiplier: PositiveFloat | None = None  # accounted σ = hook noise / (2√B); T derived
    max_grad_norm: PositiveFloat = 1.0  # C = ζ
    pretrain_steps: NonNegativeInt = 2000  # per discriminator, free (see module docstring)
    latent_dim: PositiveInt = 10  # GS-WGAN's z_dim
    g_width: PositiveInt = 64  # GS-WGAN's model_dim
    d_width: PositiveInt = 64
    embed_dim: PositiveInt = 32
    g_spectral_norm: bool = True
    d_spectral_norm: bool = True
    lr_d: PositiveFloat = 1e-4
    lr_g: PositiveFloat = 1e-4
    beta1: Decay = 0.5
    beta2: Decay = 0.9
    beta1_g: Decay | None = None  # the generator's Adam β₁ (default: beta1)
    gp_weight: NonNegativeFloat = 10.0  # λ of WGAN-GP
    drift_weight: NonNegativeFloat = 0.001  # GS-WGAN's L_epsilon
    ema_decay: Decay = 0.999  # EMA of G for sampling (netGS); 0: none
    # how the average starts (dpgen_bench/nets/averaging.py): bias-corrected keeps none of G's
    # initial weights; "uniform" (records before it) is netGS's min(1 − 1/(t+1), β) as run here
    ema_warmup: EmaWarmup = "bias-corrected"
    privacy_mode: Literal["sound", "paper"] = "sound"  # "paper": GS-WGAN's own accounting (module docstring)
    log_every: PositiveInt = 100  # generator steps between train.jsonl lines

    def __post_init__(self):
        check_declared(self)
        settle_warmup(self, "uniform")
        if self.privacy_mode not in ("sound", "paper"):
            raise ValueError("privacy_mode must be 'sound' or 'paper'")


# ------------------------------------------------------------------------ method


# the quick preset on digits (see GSWGAN.presets for how it was chosen); mnist-5k shortens it
_QUICK_DIGITS = dict(num_discriminators=50, batch_size=32, n_d=1, steps=700, pretrain_steps=3, latent_dim=16,
                     g_width=16, d_width=8, embed_dim=8, g_spectral_norm=False, d_spectral_norm=False, lr_d=1e-3,
                     lr_g=2e-4, beta1_g=0.9, ema_decay=0.995, log_every=50, samples_per_class=100)


class GSWGAN(ConditionalSampling, Method):
    """GS-WGAN: K non-private discriminators on disjoint subsets, sanitised generator gradient."""

    name = "gswgan"
    private = True
    conditional = True
    Hparams = GSWGANHparams
    renamed_hparams = {"ema": "ema_decay"}  # one name per concept across methods
    # settings added after runs were recorded, at their "as before" value (config.stable_hparams)
    late_hparams = {"ema_warmup": "uniform"}
    presets = {
        "quick": {
            # D learns in a few dozen steps, G averages its noisy gradient; all at chance on val (benchmarks/presets.md)
            "digits": _QUICK_DIGITS,
            # the smallest budget seen that learns without noise (benchmarks/presets.md, "The demo's budget")
            "mnist-5k": dict(_QUICK_DIGITS, num_discriminators=10, pretrain_steps=5, batch_size=16, steps=500),
            # at chance at T = 500 and 250 alike on val (presets.md, "The demo on full MNIST")
            "mnist": dict(_QUICK_DIGITS, num_discriminators=10, pretrain_steps=5, batch_size=16, steps=250),
        },
        "long": {
            # the digits settings at 4× the compute: learns only without noise (presets.md, "gswgan", mnist-5k)
            "mnist-5k": dict(_QUICK_DIGITS, steps=2000, pretrain_steps=40),
            # mnist-5k's (no part depends on N): the hour's noise-or-compute diagnostic (CLAIMS.md, mnist-long)
            "mnist": dict(_QUICK_DIGITS, steps=2000, pretrain_steps=40),
        },
        "tiny": {  # tests only: seconds
            "*": dict(num_discriminators=4, batch_size=16, n_d=1, steps=30, pretrain_steps=3, latent_dim=8,
                      g_width=8, d_width=4, embed_dim=4, g_spectral_norm=False, d_spectral_norm=False, ema_decay=0.9,
                      log_every=5, samples_per_class=10),
        },
        "paper": {
            # GS-WGAN's source/config.py, σ from the sound accounting; CelebA: MNIST's (docs/provenance.md, "gswgan")
            "mnist": dict(num_discriminators=1000, batch_size=32, n_d=5, steps=20_000, pretrain_steps=2000,
                          samples_per_class=6000),
            "fashion-mnist": dict(num_discriminators=1000, batch_size=32, n_d=5, steps=20_000, pretrain_steps=2000,
                                  samples_per_class=6000),
            "celeba-gender-32": dict(num_discriminators=1000, batch_size=32, n_d=5, steps=20_000,
                                     pretrain_steps=2000, samples_per_class=30_000),
        },
    }

    def __init__(self, hparams: GSWGANHparams, info: DataInfo):
        super().__init__(hparams, info)
        h = hparams
        self.G = ConditionalResNetGenerator(info.image_shape, info.num_classes, h.g_width, h.latent_dim,
                                            h.embed_dim, h.g_spectral_norm)
        self.G_ema = copy.deepcopy(self.G) if h.ema_decay > 0 else None
        self.discriminators: list[nn.Module] = []  # built in fit, discarded after it

    # ------------------------------------------------------------------ privacy

    @property
    def sample_rate(self) -> float:
        return 1.0 / self.hparams.num_discriminators

    @property
    def compositions_per_step(self) -> int:
        """Mechanisms the ledger is charged per generator step: 1 (sound: one Gaussian on
        the whole B×d batch); B in ``paper`` mode (GS-WGAN composes every row separately)."""
        return self.hparams.batch_size if self.hparams.privacy_mode == "paper" else 1

    def hook_noise_multiplier(self, accounted_sigma: float) -> float:
        """Per-coordinate noise std of the hook in units of C: 2√B · σ (sound, module
        docstring); 2σ in ``paper`` mode (GS-WGAN's hook: C · σ · SENSITIVITY, SENSITIVITY = 2)."""
        if self.hparams.privacy_mode == "paper":
            return 2.0 * accounted_sigma
        return 2.0 * math.sqrt(self.hparams.batch_size) * accounted_sigma

    def noise_to_signal(self, part: PrivacyPart) -> float:
        """σ_hook·√d: the noise on each fake image's gradient (d pixels) against its clip
        bound C, whatever the batch: G's update averages B such rows, so the noise that
        reaches G shrinks only as √B (module docstring)."""
        return self.hook_noise_multiplier(part.noise_multiplier) * math.sqrt(math.prod(self.info.image_shape))

    def accounting_caveat(self) -> str | None:
        if self.hparams.privacy_mode == "paper":
            return (f"{self.name} privacy_mode=paper: ε is GS-WGAN's accounting (privacy_analysis.py with autodp: "
                    "T·B Gaussians at rate 1/K, each amplified separately though a step's B rows share one draw "
                    "of the discriminator; methods/gswgan docstring); not a DP guarantee")
        return None

    def _check_partition(self) -> None:
        if self.hparams.num_discriminators > self.info.n_train:
            raise UserError(f"num_discriminators={self.hparams.num_discriminators} exceeds the {self.info.n_train} "
                            "training records: every subset needs at least one")

    def plan(self, budget: Budget) -> list[PrivacyPart]:
        h, q = self.hparams, self.sample_rate
        self._check_partition()
        per = self.compositions_per_step  # the part's steps are T · per
        mechanism = self.mechanism
        sigma, steps = steps_and_noise(method=self.name, epsilon=budget.epsilon, delta=budget.delta, sample_rate=q,
                                       steps=h.steps, noise_multiplier=h.noise_multiplier,
                                       compositions_per_step=per, mechanism=mechanism)
        return [PrivacyPart(PART, noise_multiplier=float(sigma), sample_rate=q, steps=int(steps) * per,
                            mechanism=mechanism)]

    @property
    def mechanism(self) -> str:
        """The accounting of the part: Theorem 27 of Wang et al. (Gaussian-specific) for the
        sound whole-batch mechanism; Theorem 9 (generic, what autodp computes) in paper
        mode, GS-WGAN's own accounting."""
        return WOR if self.hparams.privacy_mode == "paper" else WOR_GAUSSIAN

    # ----------------------------------------------------------------- training

    def _new_discriminator(self) -> nn.Module:
        h = self.hparams
        return ProjectionDiscriminator(self.info.image_shape, self.info.num_classes, h.d_width, h.d_spectral_norm)

    def _adam(self, params, lr: float) -> torch.optim.Optimizer:
        return torch.optim.Adam(params, lr=lr, betas=(self.hparams.beta1, self.hparams.beta2))

    def _partition(self, n: int, seed: int) -> list[np.ndarray]:
        """Indices of d_1..d_K: each record's subset drawn independently and uniformly."""
        assign = np.random.default_rng(seed).integers(0, self.hparams.num_discriminators, size=n)
        return [np.flatnonzero(assign == k) for k in range(self.hparams.num_discriminators)]

    @staticmethod
    def _real_batch(subset: Split, size: int, gen: torch.Generator) -> Split:
        """A batch drawn uniformly without replacement from one subset (all of it if smaller)."""
        idx = torch.randperm(len(subset), generator=gen, device=subset.labels.device)[:size]
        return Split(subset.images[idx], subset.labels[idx])

    def _latent(self, n: int, dev, gen: torch.Generator | None = None) -> torch.Tensor:
        return torch.randn(n, self.hparams.latent_dim, device=dev, generator=gen)

    def _critic_steps(self, D, opt_d, G, subset: Split, gen: torch.Generator) -> tuple[float, float]:
        """``n_d`` WGAN-GP steps of D on real batches of ``subset`` (drift penalty on real
        scores); the fakes share the real labels and are drawn in one forward of G (G does
        not change between critic steps)."""
        h = self.hparams
        if len(subset) == 0:  # an empty subset: nothing to learn from
            return float("nan"), float("nan")
        reals = [self._real_batch(subset, h.batch_size, gen) for _ in range(h.n_d)]
        labels = torch.cat([r.labels for r in reals])
        with torch.no_grad():
            fakes = G(self._latent(len(labels), labels.device, gen), labels).split([len(r) for r in reals])
        for real, fake in zip(reals, fakes):
            n = len(real)
            alpha = torch.rand(n, 1, 1, 1, device=fake.device, generator=gen)
            inter = (alpha * real.images + (1 - alpha) * fake).requires_grad_(True)
            # one forward for real, fake and interpolates (D has no batch coupling)
            out = D(torch.cat([real.images, fake, inter]), real.labels.repeat(3))
            d_real, d_fake, d_inter = out[:n], out[n:2 * n], out[2 * n:]
            (grad,) = torch.autograd.grad(d_inter.sum(), inter, create_graph=True)
            gp = ((grad.flatten(1).norm(dim=1) - 1) ** 2).mean()
            loss = d_fake.mean() - d_real.mean() + h.gp_weight * gp + h.drift_weight * (d_real ** 2).mean()
            opt_d.zero_grad(set_to_none=True)
            loss.backward(inputs=list(D.parameters()))
            opt_d.step()
        return loss.item(), (d_real.mean() - d_fake.mean()).item()

    def _pretrain(self, subsets: list[Split], ctx: RunContext, gen: torch.Generator, opt_g,
                  resumed: dict | None = None) -> None:
        """GS-WGAN's warm start (pretrain.py): each D_k against its own fresh non-private
        generator, on d_k only; the generator is thrown away. No privacy cost of its own.

        Checkpointed like the generator steps (the paper preset's 1,000 pretrainings take
        about a day on a GPU): whenever one is due, after any pretraining iteration, the state
        says which D_k and iteration come next, with that D_k's throw-away generator and its
        optimiser; ``resumed`` (such a checkpoint) continues from there. ``opt_g`` is the
        released G's optimiser, saved untouched so that one checkpoint format serves both."""
        h = self.hparams
        if h.pretrain_steps == 0:
            return
        first_k, first_i, G_state = 0, 0, None
        if resumed is not None:
            self._restore(resumed, opt_g)
            first_k, first_i, G_state = int(resumed["k"]), int(resumed["i"]), resumed["pretrain_G"]
        bar = ctx.progress(total=h.num_discriminators * h.pretrain_steps, desc=f"{self.name} pretraining D_k")
        bar.update(first_k * h.pretrain_steps + first_i)
        for k in range(first_k, h.num_discriminators):
            D, opt_d = self.discriminators[k], self._opt_d[k]
            if len(subsets[k]) == 0:
                bar.update(h.pretrain_steps)
                continue
            # resumed within D_k's pretraining: its generator comes from the checkpoint, and
            # building one must leave the global RNG where the checkpoint restored it
            with torch.random.fork_rng(devices=[], enabled=G_state is not None):
                G = self._pretraining_generator(ctx.device)
            opt_gk = self._adam(G.parameters(), h.lr_g)
            d_loss = w = float("nan")
            start = 0
            if G_state is not None:
                G.load_state_dict(G_state["G"])
                opt_gk.load_state_dict(G_state["opt"])
                d_loss, w, start, G_state = G_state["d_loss"], G_state["wasserstein"], first_i, None
            for i in range(start, h.pretrain_steps):
                d_loss, w = self._critic_steps(D, opt_d, G, subsets[k], gen)
                y = torch.randint(0, self.info.num_classes, (h.batch_size,), device=ctx.device, generator=gen)
                g_loss = -D(G(self._latent(h.batch_size, ctx.device, gen), y), y).mean()
                opt_gk.zero_grad(set_to_none=True)
                g_loss.backward(inputs=list(G.parameters()))
                opt_gk.step()
                bar.update(1)
                if i + 1 < h.pretrain_steps and ctx.checkpoint_due():
                    ctx.checkpoint(self._pretraining_state(k, i + 1, opt_g, G, opt_gk, d_loss, w))
            ctx.record(phase="pretrain", discriminator=k, d_loss=d_loss, wasserstein=w)
            if k + 1 < h.num_discriminators and ctx.checkpoint_due():
                ctx.checkpoint(self._pretraining_state(k + 1, 0, opt_g))
        bar.close()

    def _pretraining_generator(self, device) -> nn.Module:
        h = self.hparams
        return ConditionalResNetGenerator(self.info.image_shape, self.info.num_classes, h.g_width, h.latent_dim,
                                          h.embed_dim, h.g_spectral_norm).to(device)

    def _pretraining_state(self, k: int, i: int, opt_g, G=None, opt_gk=None, d_loss: float = float("nan"),
                           w: float = float("nan")) -> dict:
        """A checkpoint within pretraining: D_k's iteration ``i`` comes next (with D_k's
        throw-away generator when ``i`` > 0), and the generator steps have not begun."""
        state = self._training_state(0, opt_g)
        state.update(phase="pretrain", k=k, i=i, pretrain_G=None if G is None else {
            "G": G.state_dict(), "opt": opt_gk.state_dict(), "d_loss": d_loss, "wasserstein": w})
        return state

    def _generator_loss(self, x: torch.Tensor, y: torch.Tensor, D: nn.Module, subset: Split, t: int,
                        gen: torch.Generator, logs: dict) -> torch.Tensor:
        """Sum over examples (the sanitiser's contract): −Σᵢ D_k(xᵢ, yᵢ)."""
        return -D(x, y).sum()

    def fit(self, train: Split, budget: Budget, ctx: RunContext) -> None:
        h, dev = self.hparams, ctx.device
        self._check_partition()
        part = ctx.part(PART)
        if part.sample_rate != self.sample_rate:
            raise AssertionError("planned sampling rate differs from 1/K")
        train = train.to(dev)
        subsets = [train.subset(idx) for idx in self._partition(len(train), ctx.seed)]
        data_gen = ctx.generator("data")  # batches, z, y
        noise_gen = ctx.generator("noise", offset=1)  # the sanitiser's noise
        choice_gen = ctx.generator("choice", offset=2)  # k at each step

        self.discriminators = [self._new_discriminator().to(dev) for _ in range(h.num_discriminators)]
        self._opt_d = [self._adam(D.parameters(), h.lr_d) for D in self.discriminators]

        self.G.to(dev).train()
        if self.G_ema is not None:
            self.G_ema.load_state_dict(self.G.state_dict())
            self.G_ema.to(dev).eval()
        opt_g = torch.optim.Adam(self.G.parameters(), lr=h.lr_g,
                                 betas=(h.beta1 if h.beta1_g is None else h.beta1_g, h.beta2))
        per = self.compositions_per_step
        sanitizer = GradientSanitizer(h.max_grad_norm, self.hook_noise_multiplier(part.noise_multiplier),
                                      generator=noise_gen, scale=1.0 / h.batch_size,
                                      on_release=lambda: ctx.spend(PART, per),
                                      observe=getattr(ctx, "observe", None), part=PART)
        # a record moves the release only at the steps its D_k is drawn (rate 1/K), then every
        # row: a white-box audit scores its canaries by that mixture's likelihood ratio
        sanitizer.canaries_score = "mixture"
        ctx.watch(PART, sanitizer)
        r = ctx.restore()  # a checkpoint within pretraining, or after it and generator step t
        if r is None or r.get("phase") == "pretrain":
            self._pretrain(subsets, ctx, data_gen, opt_g, resumed=r)
            start = 1
        else:
            start = self._restore(r, opt_g) + 1

        if part.steps % per:
            raise AssertionError("planned steps are not a whole number of generator steps")
        steps = part.steps // per  # generator steps T
        bar = ctx.progress(total=steps, desc=f"{self.name} generator steps")
        bar.update(start - 1)
        for t in range(start, steps + 1):
            k = int(torch.randint(0, h.num_discriminators, (1,), generator=choice_gen, device=dev).item())
            D, opt_d = self.discriminators[k], self._opt_d[k]
            d_loss, w = self._critic_steps(D, opt_d, self.G, subsets[k], data_gen)
            logs: dict = {}
            # --- the private step: the only path from data to G is through the sanitiser
            y = torch.randint(0, self.info.num_classes, (h.batch_size,), device=dev, generator=data_gen)
            x = self.G(self._latent(h.batch_size, dev, data_gen), y)
            handle = sanitizer.attach(x)
            calls = sanitizer.calls
            loss = self._generator_loss(x, y, D, subsets[k], t, data_gen, logs)
            opt_g.zero_grad(set_to_none=True)
            loss.backward(inputs=list(self.G.parameters()))
            handle.remove()
            if sanitizer.calls != calls + 1:  # the sanitiser counted its release on the ledger (on_release)
                raise AssertionError("the generator's gradient was not sanitised exactly once")
            opt_g.step()
            if self.G_ema is not None:  # netGS of GS-WGAN (ops.exp_mov_avg), bias-corrected by default
                update_average(self.G_ema, self.G, h.ema_decay, t, h.ema_warmup)
            bar.update(1)

            ctx.accumulate(d_loss=d_loss, wasserstein=w, g_loss=loss.item() / h.batch_size,
                           clip_fraction=sanitizer.last_clip_fraction, grad_norm=sanitizer.last_mean_norm)
            if t % h.log_every == 0 or t == steps:
                ctx.record(step=t, discriminator=k, **logs)
            if t < steps and ctx.checkpoint_due():
                ctx.checkpoint(self._training_state(t, opt_g))
        bar.close()
        self.discriminators, self._opt_d = [], []  # never released
        self.G.cpu().eval()
        if self.G_ema is not None:
            self.G_ema.cpu().eval()

    def _training_state(self, t: int, opt_g) -> dict:
        """Everything a resumed run needs to continue after generator step ``t`` (the
        context adds the generators of randomness): G (and its EMA), every D_k and
        optimiser, counters."""
        return {
            "t": t, "G": self.G.state_dict(), "G_ema": self.G_ema.state_dict() if self.G_ema is not None else None,
            "opt_g": opt_g.state_dict(), "D": [D.state_dict() for D in self.discriminators],
            "opt_d": [o.state_dict() for o in self._opt_d], "extra": self._extra_state(),
        }

    def _restore(self, r: dict, opt_g) -> int:
        self.G.load_state_dict(r["G"])
        if self.G_ema is not None:
            self.G_ema.load_state_dict(r["G_ema"])
        opt_g.load_state_dict(r["opt_g"])
        for D, o, sd, so in zip(self.discriminators, self._opt_d, r["D"], r["opt_d"], strict=True):
            D.load_state_dict(sd)
            o.load_state_dict(so)
        self._load_extra_state(r["extra"])
        return int(r["t"])

    def _extra_state(self) -> dict:  # subclasses' counters
        return {}

    def _load_extra_state(self, state: dict) -> None:
        return None

    # ----------------------------------------------------------------- sampling

    @property
    def generator(self) -> nn.Module:
        """The released generator: the EMA one when ``ema_decay > 0``."""
        return self.G_ema if self.G_ema is not None else self.G

    def sampling_generator(self) -> nn.Module:
        return self.generator

    def state_dict(self) -> dict:
        return {"G": self.generator.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.generator.load_state_dict(state["G"])
