"""DPGAN of "Private GANs, Revisited" (Bie, Kamath, Zhang; TMLR 2023).

Algorithm 1: the discriminator D is trained with DPSGD (Opacus per-example gradients,
Poisson sampling with rate q = B/N, clipping to C, Gaussian noise σC); the generator G
is updated every n_D discriminator steps with the non-saturating loss and needs no
privacy (post-processing, §3). The real and the B fake examples form one batch and every
per-example gradient, real or fake, is clipped (App. B.1, "Clipping fake sample
gradients"); the noisy sum is divided by 2B as in line 7. Optimisers: Adam(2e-4,
β=(0.5, 0.999)) for both (App. B.1). Architecture: ``dpgen_bench.nets.dcgan``.

n_D is fixed (``n_d=INT``) or adaptive (``n_d=adaptive``, §6.2): an EMA (β = 0.99) of D's
accuracy on a fresh fake batch is taken before each G step; when it is ≤ d (default
0.6) and at least 2/(1−β) G steps have passed since the last change, n_D moves to the
next value of 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000. Fake-only accuracy
costs no privacy (§6.2).

Per-example clipping (``grad_sample_mode``, default ``bk``): book-keeping with mixed ghost
norms (``dpgen_bench/privacy/fastclip.py``): one backward pass, no per-example gradient
materialised for the wide layers, the same update as Opacus' per-example hooks
(``tests/unit/test_fastclip.py``). Measured D step against the same non-private step, one
CPU thread (``make bench-dp``, benchmarks/README.md): 1.18–1.35× at the paper width (MNIST,
d = 128, B = 128) and 1.8× at the quick width, against 4.3–5.7× and 3.6× for Opacus'
``hooks`` (the default before) and 6.3× / 3.4× for Opacus' ``ghost`` (it has no
ghost norm for convolutions, so it still builds every conv's per-example gradient).

Budget: either the preset fixes the number of D steps T and σ is calibrated from the
target (``steps=...``), or it fixes σ and T is the largest number of steps the target
allows (``noise_multiplier=...`` or the paper's per-ε table ``noise_by_epsilon``): in
both cases training stops exactly when the calibrated budget is spent. The ε compared
with the target is RDP (Opacus), as in the paper's tables; PRV is reported beside it.

Departures from the paper:
- The scheduler's fake accuracy is measured on a fresh batch of B fakes; the authors'
  code concatenates a batch of real validation images for logging, but only the fake
  half feeds the scheduler, so this is the same quantity.
- The generator outputs [-1, 1] (the authors map to [0, 1]); labels for fake batches are
  uniform over classes, as in their code.
- ``ema_decay`` (off unless set; of the presets the ``long`` ones of mnist-5k and mnist set it): the samples
  come from an exponential moving average of G's weights (β per G step, BatchNorm statistics of the last iterate),
  as DPDM and EDM do for their networks, bias-corrected so that none of G's initial weights survive
  (``ema_warmup``, ``dpgen_bench/nets/averaging.py``); not in the paper. No privacy cost: the average
  is a function of G's iterates, themselves post-processing of D's noised gradients.
- ``quick`` presets (digits, CPU) shrink widths, steps and the EMA horizon (β = 0.95,
  grace 40), and raise both learning rates to 1e-3 (tuned on digits); training takes
  about a minute on one core (dpgen_bench/preset_seconds.json); ``paper`` presets use the paper's. The
  ``long`` preset (digits: T = 6,000 and the paper's β = 0.99) is where adaptive n_D works
  at N = 1,437 (benchmarks/n_d.md): the quick preset's short EMA escalates n_D during D's
  untrained first steps.
- ``weight_decay_d`` (0 unless set, the paper's plain Adam): D's optimiser becomes AdamW with
  that decoupled decay, a shrink of D's weights after each noised step; not in the paper. No
  privacy cost: a function of D's weights, applied to the DP optimiser's noised update. Why
  it is there: under the noise at Adam 1e-3 D's weights grow several-fold and its loss
  climbs past chance where the noise-free twin's does not (benchmarks/presets.md, dpgan mnist).
"""

from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass
from typing import Annotated, Literal

import torch
import torch.nn.functional as F

from dpgen_bench.api import Budget, DataInfo, Method, PrivacyPart, RunContext, Split
from dpgen_bench.nets.averaging import EmaWarmup, settle_warmup, update_average
from dpgen_bench.nets.dcgan import ConditionalDiscriminator, ConditionalGenerator
from dpgen_bench.nets.sampling import ConditionalSampling
from dpgen_bench.privacy import dpsgd_noise_to_signal, parameter_count, steps_and_noise
from dpgen_bench.privacy.dpsgd import make_private, poisson_batch, private_chunk
from dpgen_bench.settings import Decay, Ge, Interval, NonNegativeFloat, PositiveFloat, PositiveInt, check_declared

N_D_SCHEDULE = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)
PART = "discriminator"


class AdaptiveNd:
    """Adaptive discriminator step frequency (§6.2). ``observe`` is called once per G
    step with D's accuracy on a fake batch; ``n_d`` is the current frequency."""

    def __init__(self, beta: float = 0.99, threshold: float = 0.6, grace: int | None = None, start: int = 1):
        if start not in N_D_SCHEDULE:
            raise ValueError(f"start must be one of {N_D_SCHEDULE}")
        self.beta = beta
        self.threshold = threshold
        self.grace = grace if grace is not None else max(1, round(2 / (1 - beta)))
        self.index = N_D_SCHEDULE.index(start)
        self.ema: float | None = None
        self.since_change = 0

    @property
    def n_d(self) -> int:
        return N_D_SCHEDULE[self.index]

    def observe(self, fake_accuracy: float) -> bool:
        """Update the EMA; return True when n_D moved to the next value."""
        self.ema = fake_accuracy if self.ema is None else self.beta * self.ema + (1 - self.beta) * fake_accuracy
        self.since_change += 1
        if self.since_change >= self.grace and self.ema <= self.threshold and self.index < len(N_D_SCHEDULE) - 1:
            self.index += 1
            self.since_change = 0
            return True
        return False

    def state_dict(self) -> dict:
        return {"index": self.index, "ema": self.ema, "since_change": self.since_change}

    def load_state_dict(self, s: dict) -> None:
        self.index, self.ema, self.since_change = s["index"], s["ema"], s["since_change"]


@dataclass(frozen=True)
class DPGANHparams:
    batch_size: PositiveInt = 128  # expected real batch size B (Poisson); B fakes are added
    n_d: PositiveInt | Literal["adaptive"] = 1
    adaptive_threshold: Annotated[float, Interval(0, 1)] = 0.6  # d
    threshold_by_epsilon: str | None = None  # "ε:d,ε:d" (authors' configs; nearest ε in log scale)
    adaptive_beta: Annotated[float, Interval(0, 1, "()")] = 0.99
    adaptive_grace: PositiveInt | None = None  # G steps; default 2/(1-β)
    d_width: PositiveInt = 128  # d_D of the paper
    g_width: PositiveInt = 128
    latent_dim: PositiveInt = 128
    lr_d: PositiveFloat = 2e-4
    lr_g: PositiveFloat = 2e-4
    beta1: Decay = 0.5
    beta2: Decay = 0.999
    weight_decay_d: NonNegativeFloat = 0.0  # AdamW's decoupled decay on D; 0: Adam (module docstring)
    max_grad_norm: PositiveFloat = 1.0  # C
    steps: PositiveInt | None = None  # T, number of D steps; σ calibrated from it
    noise_multiplier: PositiveFloat | None = None  # σ fixed; T derived from the budget
    noise_by_epsilon: str | None = None  # "ε:σ,ε:σ" (paper's table; nearest ε in log scale)
    # how D's per-example gradients are clipped: every mode gives the same update
    # (tests/unit/test_fastclip.py); bk (one backward pass, mixed ghost norms) is the fastest
    # here: 1.x× the non-private step against 3.6–4.2× for Opacus' hooks (benchmarks/README.md)
    grad_sample_mode: Literal["hooks", "functorch", "ew", "ghost", "bk"] = "bk"
    # rows (real + fake) per forward/backward; None: the whole batch in one. Changes the
    # memory a D step needs, never the update (see DPGAN._d_step); the authors' code has
    # the same knob (``max_physical_bsz``)
    max_physical_batch: Annotated[int, Ge(2)] | None = None
    log_every: PositiveInt = 25  # G steps between train.jsonl lines
    # exponential moving average of G's weights (β per G step; 0: off, the paper's G). The
    # samples come from the average: a function of G's iterates, so of no privacy cost
    ema_decay: Decay = 0.0
    # how the average starts (dpgen_bench/nets/averaging.py): bias-corrected keeps none of G's
    # initial weights; "none" (records before it) keeps β^T of them. Without an average: "none"
    ema_warmup: EmaWarmup = "bias-corrected"

    def __post_init__(self):
        check_declared(self)
        settle_warmup(self, "none")


def _value_from_table(table: str, epsilon: float) -> float:
    """The value of an "ε:v,ε:v" table at the listed ε nearest to ``epsilon`` in log scale."""
    pairs = []
    for item in table.split(","):
        e, _, s = item.partition(":")
        pairs.append((float(e), float(s)))
    return min(pairs, key=lambda p: abs(math.log(p[0]) - math.log(epsilon)))[1]


class DPGAN(ConditionalSampling, Method):
    """DPGAN of Private GANs, Revisited: DPSGD on D, fixed or adaptive n_D (Bie et al. 2023)."""

    name = "dpgan"
    private = True
    conditional = True
    Hparams = DPGANHparams
    # same update either way (tests/unit/test_dpgan_step.py checks both)
    bookkeeping_hparams = Method.bookkeeping_hparams | {"max_physical_batch", "grad_sample_mode"}
    # settings added after runs were recorded, at their "as before" value (config.stable_hparams)
    late_hparams = {"ema_decay": 0.0, "ema_warmup": "none", "weight_decay_d": 0.0}
    renamed_hparams = {"width": "d_width", "g_ema": "ema_decay"}  # one name per concept across methods
    presets = {
        "quick": {
            # first tuned on the test split, then confirmed on val (benchmarks/presets.md, "dpgan", digits)
            "digits": dict(batch_size=64, steps=1500, n_d=1, d_width=32, g_width=32, latent_dim=32,
                           lr_d=1e-3, lr_g=1e-3, adaptive_beta=0.95, samples_per_class=100),
            # narrow nets for the demo's CPU budget, n_D = 2: best of 18 on val (benchmarks/presets.md, "dpgan")
            "mnist-5k": dict(batch_size=64, steps=1500, n_d=2, d_width=16, g_width=16, latent_dim=32,
                             lr_d=1e-3, lr_g=1e-3, adaptive_beta=0.95, samples_per_class=100),
            # mnist-5k's nets, T = 750: near chance at 1,500 too (presets.md, "The demo on full MNIST")
            "mnist": dict(batch_size=64, steps=750, n_d=2, d_width=16, g_width=16, latent_dim=32,
                          lr_d=1e-3, lr_g=1e-3, adaptive_beta=0.95, samples_per_class=100),
        },
        "long": {
            # 4× quick's T and the paper's EMA: where adaptive n_D works on digits (benchmarks/n_d.md)
            "digits": dict(batch_size=64, steps=6000, n_d=1, d_width=32, g_width=32, latent_dim=32,
                           lr_d=1e-3, lr_g=1e-3, adaptive_beta=0.99, samples_per_class=100),
            # the quick search's levers: many G steps, width 32, G's weight average (benchmarks/presets.md, "dpgan")
            "mnist-5k": dict(batch_size=64, steps=6000, n_d=1, d_width=32, g_width=32, latent_dim=32,
                             lr_d=1e-3, lr_g=1e-3, ema_decay=0.999, samples_per_class=100),
            # the GPU ladder's schedule at width 64, an hour of a core (benchmarks/presets.md, "dpgan", mnist)
            "mnist": dict(batch_size=64, steps=12000, n_d=10, d_width=64, g_width=64, latent_dim=128,
                          lr_d=1e-3, lr_g=1e-3, ema_decay=0.995, samples_per_class=100),
        },
        "tiny": {
            "*": dict(batch_size=32, steps=60, n_d=2, d_width=8, g_width=8, latent_dim=8, adaptive_beta=0.8,
                      samples_per_class=10),
        },
        # the paper's MNIST preset cut to T = 4,000 D steps (benchmarks/README.md, "MNIST on a GPU")
        "gpu-short": {
            "mnist": dict(batch_size=512, steps=4000, n_d="adaptive", threshold_by_epsilon="1:0.7,10:0.6",
                          samples_per_class=6000),
        },
        "paper": {
            # Table 2 "+ adaptive n_D" and App. C (CelebA), the authors' exp_configs: docs/provenance.md, "dpgan"
            "mnist": dict(batch_size=512, noise_by_epsilon="1:14,10:2", n_d="adaptive",
                          threshold_by_epsilon="1:0.7,10:0.6", samples_per_class=6000),
            "fashion-mnist": dict(batch_size=512, noise_by_epsilon="1:14,10:2", n_d="adaptive",
                                  threshold_by_epsilon="1:0.7,10:0.6", samples_per_class=6000),
            "celeba-gender-32": dict(batch_size=2048, noise_multiplier=4.0, n_d="adaptive", adaptive_threshold=0.6,
                                     max_physical_batch=1600, delta=1e-6, samples_per_class=30_000),
        },
    }

    def __init__(self, hparams: DPGANHparams, info: DataInfo):
        super().__init__(hparams, info)
        h = hparams
        self.D = ConditionalDiscriminator(info.image_shape, info.num_classes, h.d_width)
        self.G = ConditionalGenerator(info.image_shape, info.num_classes, h.g_width, h.latent_dim)
        self.scheduler = (
            AdaptiveNd(h.adaptive_beta, h.adaptive_threshold, h.adaptive_grace) if h.n_d == "adaptive" else None
        )
        self.G_ema = copy.deepcopy(self.G).requires_grad_(False) if h.ema_decay > 0 else None

    # ------------------------------------------------------------------ privacy

    def noise_to_signal(self, part: PrivacyPart) -> float:
        """σ·√d_D / 2B: D's step averages B real and B fake rows (``_d_step``)."""
        return dpsgd_noise_to_signal(part.noise_multiplier, parameter_count(self.D), 2 * self.hparams.batch_size)

    def plan(self, budget: Budget) -> list[PrivacyPart]:
        h, q = self.hparams, self.sample_rate
        sigma = h.noise_multiplier
        if sigma is None and h.noise_by_epsilon:
            sigma = _value_from_table(h.noise_by_epsilon, budget.epsilon)
        sigma, steps = steps_and_noise(method=self.name, epsilon=budget.epsilon, delta=budget.delta, sample_rate=q,
                                       steps=h.steps, noise_multiplier=sigma)
        return [PrivacyPart(PART, noise_multiplier=float(sigma), sample_rate=q, steps=int(steps))]

    # ----------------------------------------------------------------- training

    def _d_step(self, D, opt_d, real: Split, fake_x, fake_y) -> float:
        """One D update on the real and fake rows; returns the mean loss.

        With ``max_physical_batch`` the rows go through D in chunks. Private: each chunk's
        per-example gradients are clipped and summed by Opacus with the step skipped
        (``signal_skip_step``), and the last chunk adds the noise once and steps: the same
        Σ clip(g_i, C) + N(0, σ²C²) over the whole batch, divided by 2B (in every
        grad-sample mode: ``private_backward`` takes the per-example losses). Non-private:
        chunk losses are weighted by their share of the rows, so the gradient is the
        whole batch's mean. Per-example gradients do not depend on the chunking (D has no
        batch statistics; Opacus refuses BatchNorm)."""
        x = torch.cat([real.images, fake_x])
        y = torch.cat([real.labels, fake_y])
        target = torch.cat([torch.ones(len(real), device=x.device), torch.zeros(len(fake_x), device=x.device)])
        rows, cap = len(x), self.hparams.max_physical_batch
        k = 1 if cap is None or rows <= cap else math.ceil(rows / cap)
        opt_d.zero_grad(set_to_none=True)
        total = torch.zeros((), device=x.device)
        for i, (xc, yc, tc) in enumerate(zip(x.tensor_split(k), y.tensor_split(k), target.tensor_split(k))):
            losses = F.binary_cross_entropy_with_logits(D(xc, yc), tc, reduction="none")
            total += losses.detach().sum()
            if not self.private:
                (losses.mean() * (len(xc) / rows)).backward()
                continue
            private_chunk(D, opt_d, losses, last=i == k - 1)
        if not self.private:
            opt_d.step()
        return (total / rows).item()

    def _fake(self, n: int, device, generator: torch.Generator | None = None):
        z = torch.randn(n, self.hparams.latent_dim, device=device, generator=generator)
        y = torch.randint(0, self.info.num_classes, (n,), device=device, generator=generator)
        return self.G(z, y), y

    def fit(self, train: Split, budget: Budget, ctx: RunContext) -> None:
        h, dev = self.hparams, ctx.device
        if self.scheduler is not None and h.threshold_by_epsilon:
            self.scheduler.threshold = _value_from_table(h.threshold_by_epsilon, budget.epsilon)
        train = train.to(dev)
        self.D.to(dev)
        self.G.to(dev)
        if self.G_ema is not None:
            self.G_ema.to(dev)
        opt_d = (torch.optim.AdamW(self.D.parameters(), lr=h.lr_d, betas=(h.beta1, h.beta2),
                                   weight_decay=h.weight_decay_d) if h.weight_decay_d
                 else torch.optim.Adam(self.D.parameters(), lr=h.lr_d, betas=(h.beta1, h.beta2)))
        opt_g = torch.optim.Adam(self.G.parameters(), lr=h.lr_g, betas=(h.beta1, h.beta2))
        data_gen = ctx.generator("data")
        noise_gen = ctx.generator("noise", offset=1)

        if self.private:  # every step of opt_d is counted on PART
            total = ctx.part(PART).steps
            D, opt_d = make_private(self.D, opt_d, ctx=ctx, part=PART, max_grad_norm=h.max_grad_norm,
                                    expected_batch_size=2 * h.batch_size, grad_sample_mode=h.grad_sample_mode,
                                    noise_generator=noise_gen)
        else:
            total, D = h.steps, self.D
        # the planned rate B / N (N of the plan: under bench audit's canaries the split's size
        # depends on which canaries were drawn in, the plan's does not)
        q = self.sample_rate
        if self.private and q != ctx.part(PART).sample_rate:
            raise AssertionError("the sampling rate differs from the planned part's")

        g_steps, since_g, start = 0, 0, 1
        inner_d = opt_d.original_optimizer if self.private else opt_d
        r = ctx.restore()
        if r is not None:  # continue exactly where the checkpoint left off
            self.G.load_state_dict(r["G"])
            self.D.load_state_dict(r["D"])
            inner_d.load_state_dict(r["opt_d"])
            opt_g.load_state_dict(r["opt_g"])
            if self.G_ema is not None:
                self.G_ema.load_state_dict(r["G_ema"])
            if self.scheduler and r["scheduler"]:
                self.scheduler.load_state_dict(r["scheduler"])
            g_steps, since_g, start = r["g_steps"], r["since_g"], r["t"] + 1
        bar = ctx.progress(total=total, desc=f"{self.name} D steps")
        bar.update(start - 1)
        for t in range(start, total + 1):
            idx = poisson_batch(len(train), q, data_gen, dev)
            with torch.no_grad():
                fake_x, fake_y = self._fake(h.batch_size, dev)
            loss = self._d_step(D, opt_d, train.subset(idx), fake_x, fake_y)
            ctx.accumulate(d_loss=loss)
            since_g += 1
            bar.update(1)

            n_d = self.scheduler.n_d if self.scheduler else h.n_d
            if since_g < n_d:
                self._maybe_checkpoint(ctx, t, total, g_steps, since_g, inner_d, opt_g)
                continue
            since_g = 0
            logged = (g_steps + 1) % h.log_every == 0 or t + n_d > total
            fake_acc = self._fake_accuracy(dev) if (self.scheduler or logged) else None
            g_loss = self._g_step(D, opt_g, dev)
            if self.G_ema is not None:
                update_average(self.G_ema, self.G, h.ema_decay, g_steps + 1, h.ema_warmup)
            g_steps += 1
            changed = self.scheduler.observe(fake_acc) if self.scheduler else False
            if changed or logged:
                ctx.record(d_step=t, g_step=g_steps, n_d=n_d, g_loss=g_loss,
                           d_fake_acc=fake_acc,
                           d_fake_acc_ema=self.scheduler.ema if self.scheduler else None,
                           n_d_next=self.scheduler.n_d if self.scheduler else n_d)
            self._maybe_checkpoint(ctx, t, total, g_steps, since_g, inner_d, opt_g)
        bar.close()
        if self.private:
            D._close()  # remove Opacus hooks; self.D stays a plain module
        if self.G_ema is not None:  # the released generator is the average
            self.G.load_state_dict(self.G_ema.state_dict())
            self.G_ema.cpu()
        self.G.cpu().eval()
        self.D.cpu().eval()

    def _maybe_checkpoint(self, ctx, t, total, g_steps, since_g, opt_d, opt_g) -> None:
        if t == total or not ctx.checkpoint_due():
            return
        ctx.checkpoint({
            "G": self.G.state_dict(), "D": self.D.state_dict(), "opt_d": opt_d.state_dict(),
            "opt_g": opt_g.state_dict(), "scheduler": self.scheduler.state_dict() if self.scheduler else None,
            "t": t, "g_steps": g_steps, "since_g": since_g,
            **({"G_ema": self.G_ema.state_dict()} if self.G_ema is not None else {}),
        })

    @torch.no_grad()
    def _fake_accuracy(self, dev) -> float:
        """D's accuracy on a fresh fake batch (post-processing: no private data)."""
        x, y = self._fake(self.hparams.batch_size, dev)
        return (self.D(x, y) < 0).float().mean().item()

    def _g_step(self, D, opt_g, dev) -> float:
        if self.private:
            D.disable_hooks()  # no per-example gradients for D on the generator's pass
        x, y = self._fake(self.hparams.batch_size, dev)
        loss = F.softplus(-self.D(x, y)).mean()  # -log σ(D(G(z))): non-saturating
        opt_g.zero_grad(set_to_none=True)
        loss.backward(inputs=list(self.G.parameters()))  # D's .grad is never touched
        opt_g.step()
        if self.private:
            D.enable_hooks()
        return loss.item()

    # ----------------------------------------------------------------- sampling


    released_parts = ("D",)  # D is trained by DPSGD: an output of the mechanism (gan: no guarantee at all)

    @torch.no_grad()
    def released_scores(self, images: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        self.D.cpu().eval()
        return {"D": torch.cat([self.D(x, y) for x, y in zip(images.split(1024), labels.split(1024))]).flatten()}

    def state_dict(self) -> dict:
        return {
            "G": self.G.state_dict(),
            "D": self.D.state_dict(),
            "hparams": dataclasses.asdict(self.hparams),
            "scheduler": self.scheduler.state_dict() if self.scheduler else None,
        }

    def load_state_dict(self, state: dict) -> None:
        self.G.load_state_dict(state["G"])
        self.D.load_state_dict(state["D"])
        if self.scheduler and state.get("scheduler"):
            self.scheduler.load_state_dict(state["scheduler"])
