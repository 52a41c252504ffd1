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
  run yet (a GPU job: issue 28).
- ``quick`` (digits 16×16, CPU): nf = 16, levels (1, 2), one block per level, no attention,
  K = 2, B = 32, 400 steps, 12 Heun steps: minutes on 2 cores (not tuned yet); the paper's
  network, K = 32 and B = 4,096 are far beyond a CPU budget. The DP step costs ~2.7× the
  same non-private step here (one thread, B·K = 256 rows). Measured (seed 0, test split,
  ε = 10): gen2real CNN 0.24 after 2 min 8 s of training on one core; the samples are
  digit-like strokes, mostly not yet readable.
- DP-FETA's warm start is not written yet.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass

import torch
from torch import nn

from dpgen_bench.api import Budget, DataInfo, Method, PrivacyPart, RunContext, Split
from dpgen_bench.nets.unet import ConditionalUNet
from dpgen_bench.privacy import steps_and_noise
from dpgen_bench.privacy.dpsgd import empty_batch, make_private, poisson_batch, private_chunk

PART = "denoiser"
SIGMA_DATA = 0.5
SAMPLERS = ("heun", "euler")


@dataclass(frozen=True)
class DPDMHparams:
    batch_size: int = 4096  # expected examples per step B (Poisson); each gives K rows
    noise_multiplicity: int = 32  # K
    steps: int | None = None  # T; σ_DP calibrated from it
    noise_multiplier: float | None = None  # σ_DP fixed; T from the budget
    max_grad_norm: float = 1.0  # C
    lr: float = 3e-4
    ema_decay: float = 0.999
    nf: int = 32
    ch_mult: tuple[int, ...] = (1, 2, 2)
    num_res_blocks: int = 2
    attn_resolutions: tuple[int, ...] = (7,)
    dropout: float = 0.0
    p_mean: float = -1.2
    p_std: float = 1.2
    sampler: str = "heun"  # "heun": EDM's Heun (2N − 1 evaluations); "euler": the authors' "ddim" (N)
    sampler_steps: int = 18  # N: points of the ρ schedule from σ_max to σ_min
    sigma_min: float = 0.002
    sigma_max: float = 80.0
    rho: float = 7.0
    s_churn: float = 0.0  # 0: deterministic Heun
    s_tmin: float = 0.05
    s_tmax: float = 50.0
    s_noise: float = 1.003
    log_every: int = 50
    max_physical_batch: int | None = None  # examples (K rows each) per chunk of a step; None: one pass

    def __post_init__(self):
        if self.batch_size < 1:
            raise ValueError("batch_size must be ≥ 1")
        if self.noise_multiplicity < 1:
            raise ValueError("noise_multiplicity must be ≥ 1")
        if self.max_grad_norm <= 0:
            raise ValueError("max_grad_norm must be > 0")
        if not 0 <= self.ema_decay < 1:
            raise ValueError("ema_decay must be in [0, 1)")
        if self.sampler_steps < 1:
            raise ValueError("sampler_steps must be ≥ 1")
        if self.sampler not in SAMPLERS:
            raise ValueError(f"sampler must be one of {', '.join(SAMPLERS)}")
        if self.max_physical_batch is not None and self.max_physical_batch < 1:
            raise ValueError("max_physical_batch must be ≥ 1 (or None: the whole batch)")
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
    """EDM's Heun sampler (Algorithm 2 of Karras et al.; deterministic when S_churn = 0)."""
    t = sigma_schedule(h)
    x = torch.randn(len(labels), *shape, generator=rng, dtype=torch.float64) * t[0]
    n = h.sampler_steps
    for i in range(n):
        t_cur, t_next = t[i], t[i + 1]
        gamma = min(h.s_churn / n, math.sqrt(2) - 1) if h.s_tmin <= t_cur <= h.s_tmax else 0.0
        t_hat = t_cur * (1 + gamma)
        if gamma > 0:
            x = x + (t_hat ** 2 - t_cur ** 2).sqrt() * h.s_noise * torch.randn(x.shape, generator=rng,
                                                                                dtype=torch.float64)
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
    D(x; σ_min) (one more): N network evaluations in all."""
    t = sigma_schedule(h)[:-1]  # t_0 … t_{N−1}; no t_N = 0 here
    x = torch.randn(len(labels), *shape, generator=rng, dtype=torch.float64) * t[0]
    for i in range(len(t) - 1):
        x = x + (t[i + 1] - t[i]) * (x - _d(net, x, t[i], labels)) / t[i]
    return _d(net, x, t[-1], labels).float()


def _d(net, x, t, labels):
    sigma = torch.full((len(x),), float(t))
    return denoise(net, x.float(), sigma, labels).double()


_PAPER_28 = dict(batch_size=4096, noise_multiplicity=32, steps=4500, max_grad_norm=1.0, lr=3e-4, ema_decay=0.999,
                 nf=32, ch_mult=(1, 2, 2), num_res_blocks=2, attn_resolutions=(7,), dropout=0.0, p_mean=-1.2,
                 p_std=1.2, sampler="euler", sampler_steps=50, max_physical_batch=256)


class DPDM(Method):
    """DPDM: a class-conditional diffusion model (EDM) trained with DP-SGD and noise multiplicity."""

    name = "dpdm"
    private = True
    conditional = True
    Hparams = DPDMHparams
    bookkeeping_hparams = Method.bookkeeping_hparams | {"max_physical_batch"}
    presets = {
        "quick": {
            # digits 16×16, CPU: a narrow U-Net without attention, K = 4 (benchmarks/presets.md)
            "digits": dict(batch_size=32, noise_multiplicity=2, steps=400, nf=16, ch_mult=(1, 2),
                           num_res_blocks=1, attn_resolutions=(), lr=1e-3, ema_decay=0.99, sampler_steps=12,
                           samples_per_class=100),
            # mnist-5k 28×28, CPU: the demo's budget (the demo runs nine methods in ≈ 5 minutes):
            # nf = 8, K = 1, 150 steps, 6 sampler steps; about a minute a run with its evaluation
            # (gen2real / real2gen CNN 0.120 / 0.097 at ε = 10, seed 0). Not tuned: it draws
            # blobs, not digits, at this compute.
            "mnist-5k": dict(batch_size=32, noise_multiplicity=1, steps=150, nf=8, ch_mult=(1, 2),
                             num_res_blocks=1, attn_resolutions=(), lr=1e-3, ema_decay=0.98, sampler_steps=6,
                             samples_per_class=100),
        },
        # The paper's settings (Dockhorn et al., TMLR 2023, App. / the authors' configs
        # configs/{mnist_28,fmnist_28,celeba_32}/train_eps_*.yaml; docs/provenance.md value by
        # value): EDM loss, B = 4,096 (2,048 CelebA), K = 32, Adam 3e-4, EMA 0.999, C = 1, 300
        # epochs, the authors' "ddim" (Euler) sampler with 50 steps; NCSN++ nf = 32, (1, 2, 2),
        # 2 blocks, attention at 7 (MNIST) or 16 and 8 (CelebA-32). T = 300 epochs × ⌈N/B⌉
        # batches (their Opacus loader runs ⌈N/B⌉ batches an epoch): 4,500 at N = 60,000,
        # 27,000 for our CelebA-Gender-32 (N = 182,637); σ is calibrated here at q = B/N for
        # that T (theirs: q = 1/⌈N/B⌉, slightly smaller). Chunks of 256 (128) examples, i.e.
        # 8,192 (4,096) rows: the authors' physical batch is 8,192; the update is the same.
        # 60,000 generated images for evaluation.
        "paper": {
            "mnist": dict(_PAPER_28, samples_per_class=6000),
            "fashion-mnist": dict(_PAPER_28, samples_per_class=6000),
            "celeba-gender-32": dict(_PAPER_28, batch_size=2048, steps=27_000, attn_resolutions=(16, 8),
                                     max_physical_batch=128, delta=1e-6, samples_per_class=30_000),
        },
        "tiny": {  # tests only: seconds
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

    @property
    def sample_rate(self) -> float:
        return min(1.0, self.hparams.batch_size / self.info.n_train)

    def plan(self, budget: Budget) -> list[PrivacyPart]:
        h = self.hparams
        sigma, steps = steps_and_noise(method=self.name, epsilon=budget.epsilon, delta=budget.delta,
                                       sample_rate=self.sample_rate, steps=h.steps,
                                       noise_multiplier=h.noise_multiplier)
        return [PrivacyPart(PART, noise_multiplier=float(sigma), sample_rate=self.sample_rate, steps=int(steps))]

    # ----------------------------------------------------------------- training

    def _rows(self, x: torch.Tensor, y: torch.Tensor, gen: torch.Generator):
        """K noised copies of each example, side by side (rows iK … iK+K−1 are example i)."""
        k = self.hparams.noise_multiplicity
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
        train = train.to(dev)
        self.net.to(dev).train()
        self.ema.to(dev)
        opt = torch.optim.Adam(self.net.parameters(), lr=h.lr)
        data_gen = ctx.generator("data")
        diff_gen = ctx.generator("diffusion", offset=1)  # σ and n of every row
        noise_gen = ctx.generator("noise", offset=2)  # DP-SGD's noise
        if self.private:
            total = ctx.part(PART).steps
            net, opt = make_private(self.net, opt, ctx=ctx, part=PART, max_grad_norm=h.max_grad_norm,
                                    expected_batch_size=h.batch_size, grad_sample_mode="bk",
                                    noise_generator=noise_gen)
        else:
            total, net = h.steps, self.net
        q = self.sample_rate
        start, loss_sum, seen = 1, 0.0, 0
        inner = opt.original_optimizer if self.private else opt
        r = ctx.restore()
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
                loss_sum += self._step(net, opt, train, idx, diff_gen)
                seen += 1
            self._update_ema()
            bar.update(1)
            if t % h.log_every == 0 or t == total:
                ctx.record(step=t, loss=loss_sum / max(seen, 1))
                loss_sum, seen = 0.0, 0
            if t < total and ctx.checkpoint_due():
                ctx.checkpoint({"net": self.net.state_dict(), "ema": self.ema.state_dict(),
                                "opt": inner.state_dict(), "t": t})
        bar.close()
        if self.private:
            net._close()
        self.net.cpu().eval()
        self.ema.cpu().eval()

    @torch.no_grad()
    def _update_ema(self) -> None:
        d = self.hparams.ema_decay
        for pe, p in zip(self.ema.parameters(), self.net.parameters()):
            pe.mul_(d).add_(p.detach(), alpha=1 - d)

    # ----------------------------------------------------------------- sampling

    def sample(self, n: int, labels: torch.Tensor | None, rng: torch.Generator):
        if labels is None:
            labels = torch.randint(0, self.info.num_classes, (n,), generator=rng)
        labels = labels.long().cpu()
        net = self.ema.cpu().eval()
        sampler = edm_sample if self.hparams.sampler == "heun" else euler_sample
        out = [sampler(net, labels[i:i + 512], self.info.image_shape, self.hparams, rng)
               for i in range(0, n, 512)]
        images = torch.cat(out) if out else torch.zeros(0, *self.info.image_shape)
        return images.clamp(-1, 1), labels

    def state_dict(self) -> dict:
        return {"net": self.net.state_dict(), "ema": self.ema.state_dict(),
                "hparams": dataclasses.asdict(self.hparams)}

    def load_state_dict(self, state: dict) -> None:
        self.net.load_state_dict(state["net"])
        self.ema.load_state_dict(state["ema"])
