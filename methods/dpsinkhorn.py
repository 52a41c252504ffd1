"""DP-Sinkhorn: "Don't Generate Me: Training Differentially Private Generative Models with
Sinkhorn Divergence" (Cao, Bie, Vahdat, Fidler, Kreis; NeurIPS 2021), released code
``nv-tlabs/DP-Sinkhorn_code`` (``sinkhorn_poisson.py``, ``src/rdp/privacy.py``,
``src/cost_function.py``; geomloss's tensorized Sinkhorn there, written anew here).

Training. A class-conditional generator G is trained, without a discriminator, to
minimise an entropic optimal-transport loss between a generated batch and a Poisson
sampled real batch, in pixel space with the label appended: a record (x, y) is the point
[flatten(x), w·onehot(y)] (x in [-1, 1], w = ``label_weight``, theirs 15), so that
transport between classes costs 2w² (+ 2w·m under ``l1+l2``) and the plan stays within a
class. Cost c(u, v) = ‖u − v‖² (``cost=l2``) or ‖u − v‖² + m·‖u − v‖₁ (``l1+l2``, m =
``l1_weight``). Each step:

- draw the real batch S (each record with probability q = B/N) and B generated samples
  X = G(z, y) with uniform labels; regenerate the first r = ⌊``debias_ratio``·B⌋ of them
  with fresh z and the same labels (X_alt) and form X' = [X[r:], X_alt];
- loss L = OT_ε(X, S) − ½·OT_ε(X, X'), the authors' *semi-debiased* Sinkhorn loss (their
  MNIST / Fashion-MNIST runs compute 2·OT_ε(X, S) − OT_ε(X, X'), the same up to the factor
  2, which only rescales C: ``max_grad_norm`` is half theirs there). The full Sinkhorn divergence
  S_ε(X, S) = OT_ε(X, S) − ½OT_ε(X, X) − ½OT_ε(S, S) differs from L at r = 0 by the
  term ½OT_ε(S, S) that does not depend on G, so it has the same gradient; r > 0 trades the
  bias of the same-batch self term against variance (the paper's bias-variance control).
- OT_ε(α, β) = min_π ⟨π, C⟩ + ε·KL(π | α⊗β) with uniform weights, computed by log-domain
  Sinkhorn (``entropic_ot``): ε-annealing from max C down to ε by ``scaling`` per
  iteration, ``sinkhorn_iters`` more at ε, then one differentiable update of both
  potentials, each against the other side's detached potential and detached points, so
  that autograd gives the envelope-theorem gradient Σⱼ πᵢⱼ ∇ₓc(xᵢ, yⱼ) at every point
  (what geomloss's last extrapolation gives).
- the gradient ∂L/∂X (a B×d matrix) is *sanitised* (below), the gradient at X_alt (which
  depends on generated samples only) is clipped to C without noise as in the authors'
  code, and both flow on into G by backpropagation (Adam).

Privacy (the ledger's part ``image_gradient``; add/remove adjacency of one real record).
Fix a step; everything but S is data-independent given the earlier releases (z, y, G's
weights, X, X'). The released quantity is M(S) = clip_C(∂L/∂X) + N(0, (2σC)² I), with
clip_C the scaling of the *whole* B×d matrix to Frobenius norm ≤ C
(``BatchGradientSanitizer``) and, for an empty batch, ∂L/∂X := 0. One real record enters
L only through the transport plan of OT_ε(X, S), and it can move the gradient at *every*
generated sample (the plan is a global function of S), so no per-row bound exists; but
‖clip_C(·)‖ ≤ C for any S, hence ‖M̄(S ∪ {x}) − M̄(S)‖ ≤ 2C (M̄ the noiseless part) for
every S: sensitivity 2C, noise multiplier σ = noise std / (2C). With Poisson sampling
at rate q this is the sampled Gaussian mechanism of Mironov, Talwar, Zhang (2019), whose
RDP bound holds for any function of the sample with this sensitivity, not only for sums
(``PrivacyPart`` mechanism ``subsampled_gaussian``, the accountant every DPSGD method here
uses). G's update, X_alt's clipped gradient and Adam's state are post-processing of the
released M's. This is the authors' mechanism (``sanitize_img_grads_hook``: one clip of the
whole tensor, noise std C·σ·``sensitivity_to_l2_norm_clip`` with the latter 2; their
accountant: the same Poisson-sampled Gaussian RDP at q = B/N), so the sensitivity is not a
departure. Clipping each generated sample's row to C instead (as DPSGD does per example,
and as ``dpgen_bench.privacy.sanitizer.GradientSanitizer`` does for GS-WGAN) would bound
the matrix only by C√B, so its sensitivity would be 2C√B, not 2C: the rows are not
per-record contributions. The authors' unused ``per_row_sanitize_img_grads_hook`` keeps 2C
for a row-clipped matrix on the grounds that "each real sample at most flips one row",
which does not hold for this loss; it is not offered here.

Departures from the authors' code:
- Steps: their loop trains until their accountant's ε reaches the target (checked every 20
  steps, so it can overshoot by up to 19 steps), for at most 3,001 epochs; here T is
  planned before training (``steps_for_budget`` for a fixed σ, capped by ``max_steps``,
  or σ calibrated for a fixed T) and ε ≤ target. The cap binds for their MNIST run
  (3,601,200 steps, ε ≈ 9.41 by RDP), which ``paper`` reproduces.
- Empty Poisson batches: their sampler skips them (no step, not counted); here the step
  releases noise alone (∂L/∂X := 0) and is counted, so the number of releases does not
  depend on the data.
- Sinkhorn solver: ours (ε-annealing from max C with ``sinkhorn_iters`` extra iterations at
  the final ε); geomloss anneals from the point clouds' diameter^p with one iteration per
  level and no extra ones. ``sinkhorn_eps`` is ε on the cost's own scale, i.e. geomloss's
  blur^p: 0.05 for MNIST (blur 0.05, p = 1), 25 for CelebA (blur 5, p = 2).
- Generator: the conditional DCGAN of ``dpgan`` (``dpgen_bench.nets.dcgan``, no
  BatchNorm, tanh) with z ~ N(0, I) so that the membership attacks apply; theirs is
  ``ConvCondGenerator`` (label embedding of 8 concatenated to z ~ U[0, 1]^16, 7→14→28 with
  BatchNorm) for MNIST / Fashion-MNIST and a BigGAN generator for CelebA.
- Adam(``lr``, β = (0.9, 0.999), weight decay 1e-5) as theirs; the loss is half theirs
  where they use 2·OT_ε(X, S) − OT_ε(X, X') (MNIST, Fashion-MNIST), so ``max_grad_norm`` is
  half their ``l2_norm_clip`` there (the released update is then exactly half theirs, and
  Adam is invariant to that scale up to its weight decay and its ε).
- Data: the harness's datasets (CelebA: centre crop, then 32×32, train + valid partitions;
  theirs: torchvision's train partition resized to 32×32 without a crop).
- ``quick`` (digits, CPU) uses B = 10, 6,000 steps and Adam 5e-4; chosen on the validation
  part (benchmarks/presets.md).

The runs behind the presets, on digits, mnist-5k and full MNIST: benchmarks/presets.md,
"dpsinkhorn".
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Callable, Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from dpgen_bench.api import Budget, DataInfo, Method, PrivacyPart, RunContext, Split
from dpgen_bench.nets.dcgan import conditional_generator
from dpgen_bench.nets.sampling import ConditionalSampling
from dpgen_bench.privacy import steps_and_noise
from dpgen_bench.privacy.dpsgd import poisson_batch
from dpgen_bench.privacy.sanitizer import GradientSanitizer
from dpgen_bench.settings import (Decay, Interval, NonNegativeFloat, PositiveFloat, PositiveInt,
                                  check_declared)

PART = "image_gradient"
COSTS = ("l2", "l1+l2")


# ------------------------------------------------------------------ the Sinkhorn loss


def make_cost(cost: str = "l2", l1_weight: float = 1.0) -> Callable[[Tensor, Tensor], Tensor]:
    """c(u, v) for rows of two point clouds, as an (n, m) matrix: ‖u − v‖² (``l2``) or
    ‖u − v‖² + l1_weight·‖u − v‖₁ (``l1+l2``)."""
    if cost not in COSTS:
        raise ValueError(f"cost must be one of {COSTS}, got {cost!r}")

    def squared(u: Tensor, v: Tensor) -> Tensor:
        # ‖u‖² + ‖v‖² − 2u·v: no square root, so the gradient is smooth where u = v
        return ((u * u).sum(1)[:, None] + (v * v).sum(1)[None, :] - 2 * u @ v.T).clamp_min(0)

    if cost == "l2":
        return squared
    return lambda u, v: squared(u, v) + l1_weight * torch.cdist(u, v, p=1)


def _softmin(eps: float, C: Tensor, h: Tensor) -> Tensor:
    """−ε·log Σⱼ exp(hⱼ − Cᵢⱼ/ε), row-wise: the c-transform of a potential (h = log
    weights + potential / ε)."""
    return -eps * torch.logsumexp(h[None, :] - C / eps, dim=1)


def eps_schedule(start: float, eps: float, scaling: float, iters: int) -> list[float]:
    """ε-annealing: start, start·scaling, ... while above ε, then ε for ``iters`` more."""
    out = []
    e = max(start, eps)
    while e > eps:
        out.append(e)
        e *= scaling
    return out + [eps] * max(1, iters)


def entropic_ot(x: Tensor, y: Tensor, eps: float, cost: Callable[[Tensor, Tensor], Tensor],
                scaling: float = 0.5, iters: int = 10) -> Tensor:
    """OT_ε(α, β) = min_π ⟨π, C⟩ + ε·KL(π | α⊗β) between the uniform measures on the rows
    of ``x`` (n, d) and ``y`` (m, d), by log-domain Sinkhorn; returns the dual value
    ⟨α, f⟩ + ⟨β, g⟩ (equal to the primal value at the fixed point).

    Iterations run without autograd; a last update of f (against the detached g, with
    y detached) and of g (against the detached f, with x detached) carries the gradient:
    ∂/∂xᵢ = Σⱼ πᵢⱼ ∇ᵤc(xᵢ, yⱼ) and ∂/∂yⱼ = Σᵢ πᵢⱼ ∇ᵥc(xᵢ, yⱼ), the gradient of OT_ε by the
    envelope theorem (x and y may be the same tensor: both contributions add up)."""
    n, m = len(x), len(y)
    log_a = torch.full((n,), -math.log(n), dtype=x.dtype, device=x.device)
    log_b = torch.full((m,), -math.log(m), dtype=x.dtype, device=x.device)
    with torch.no_grad():
        C = cost(x.detach(), y.detach())
        f = torch.zeros(n, dtype=x.dtype, device=x.device)
        g = torch.zeros(m, dtype=x.dtype, device=x.device)
        for e in eps_schedule(C.max().item(), eps, scaling, iters):
            f = _softmin(e, C, log_b + g / e)
            g = _softmin(e, C.T, log_a + f / e)
    f_new = _softmin(eps, cost(x, y.detach()), log_b + g / eps)
    g_new = _softmin(eps, cost(x.detach(), y).T, log_a + f / eps)
    return f_new.mean() + g_new.mean()


def semi_debiased_loss(x: Tensor, real: Tensor, x_prime: Tensor, eps: float,
                       cost: Callable[[Tensor, Tensor], Tensor], scaling: float = 0.5, iters: int = 10) -> Tensor:
    """OT_ε(X, S) − ½·OT_ε(X, X'): the generated batch against the real one, debiased by
    the generated side only (X' = X, or X with some rows regenerated)."""
    return (entropic_ot(x, real, eps, cost, scaling, iters)
            - 0.5 * entropic_ot(x, x_prime, eps, cost, scaling, iters))


def sinkhorn_divergence(x: Tensor, y: Tensor, eps: float, cost: Callable[[Tensor, Tensor], Tensor],
                        scaling: float = 0.5, iters: int = 10) -> Tensor:
    """S_ε(α, β) = OT_ε(α, β) − ½OT_ε(α, α) − ½OT_ε(β, β) (Feydy et al. 2019): 0 at α = β."""
    return (entropic_ot(x, y, eps, cost, scaling, iters) - 0.5 * entropic_ot(x, x, eps, cost, scaling, iters)
            - 0.5 * entropic_ot(y, y, eps, cost, scaling, iters))


# ------------------------------------------------------------------ the sanitiser


class BatchGradientSanitizer(GradientSanitizer):
    """``GradientSanitizer`` with one clip of the *whole* gradient tensor to Frobenius
    norm ≤ C (``sanitize_img_grads_hook`` of the authors), then N(0, (σ_hook·C)²) per
    coordinate: any two clipped tensors are ≤ 2C apart, so σ_hook = 2σ for a noise
    multiplier σ (module docstring)."""

    clip_geometry = "whole"  # one record moves the clipped tensor by ≤ 2C in all

    def clip(self, grad: Tensor) -> Tensor:
        norm = grad.norm()
        self.last_clip_fraction = float(norm.item() > self.max_norm)
        self.last_mean_norm = norm.item()
        self.last_norms = norm.reshape(1)  # one contribution: the whole matrix, clipped as one
        return grad * (self.max_norm / norm.clamp_min(1e-12)).clamp(max=1.0)


# ------------------------------------------------------------------ the method


@dataclass(frozen=True)
class DPSinkhornHparams:
    batch_size: PositiveInt = 50  # B: expected real batch (Poisson, q = B/N) and generated batch
    steps: PositiveInt | None = None  # T; σ calibrated from it
    noise_multiplier: PositiveFloat | None = None  # σ (noise std / 2C); T derived from the budget
    max_steps: PositiveInt | None = None  # with noise_multiplier: T = min(max_steps, what the budget allows)
    max_grad_norm: PositiveFloat = 0.25  # C, on the whole B×d gradient matrix (theirs 0.5 on twice our loss)
    sinkhorn_eps: PositiveFloat = 0.05  # ε of OT_ε on the cost's scale (geomloss blur^p)
    cost: Literal["l2", "l1+l2"] = "l1+l2"
    l1_weight: NonNegativeFloat = 1.0  # m of ‖·‖² + m‖·‖₁ (their mixture_fraction; paper's m = 1 or 3)
    label_weight: NonNegativeFloat = 15.0  # w: one-hot label × w appended to the pixels (their embed_multiplier)
    debias_ratio: Annotated[float, Interval(0, 1)] = 0.2  # share of X regenerated for the self term X' (0: X' = X)
    scaling: Annotated[float, Interval(0, 1, "()")] = 0.5  # ε-annealing factor per Sinkhorn iteration
    sinkhorn_iters: PositiveInt = 10  # iterations at the final ε after annealing
    lr: PositiveFloat = 1e-5
    beta1: Decay = 0.9
    beta2: Decay = 0.999
    weight_decay: NonNegativeFloat = 1e-5
    latent_dim: PositiveInt = 16
    g_width: PositiveInt = 64
    log_every: PositiveInt = 50
    torch_threads: PositiveInt | None = None  # intra-op threads during fit (restored after); None: unchanged

    def __post_init__(self):
        check_declared(self)
        if self.cost not in COSTS:
            raise ValueError(f"cost must be one of {COSTS}, got {self.cost!r}")


# the quick preset on digits (see DPSinkhorn.presets for how it was chosen); mnist-5k shortens it
_QUICK_DIGITS = dict(batch_size=10, steps=6000, lr=5e-4, g_width=32, latent_dim=16, torch_threads=1,
                     samples_per_class=100)


class DPSinkhorn(ConditionalSampling, Method):
    """DP-Sinkhorn: a generator trained on a privatised gradient of a semi-debiased Sinkhorn loss."""

    name = "dpsinkhorn"
    private = True
    conditional = True
    Hparams = DPSinkhornHparams
    presets = {
        # digits: a small B and many steps (the signal per step is C whatever B), chosen on val (benchmarks/presets.md)
        "quick": {"digits": _QUICK_DIGITS,
                  # T = 2,000, the demo's budget: more bought nothing (benchmarks/presets.md, "The demo's budget")
                  "mnist-5k": dict(_QUICK_DIGITS, steps=2000),
                  # at chance at T = 2,000 and 1,000 alike on val (presets.md, "The demo on full MNIST")
                  "mnist": dict(_QUICK_DIGITS, steps=1000)},
        "tiny": {"*": dict(batch_size=16, steps=30, g_width=8, latent_dim=8, sinkhorn_iters=2, lr=1e-3,
                           log_every=10, torch_threads=1, samples_per_class=10)},
        # the authors' README commands, m = 1 (docs/provenance.md); fixed T: --set noise_multiplier=none --set steps=T
        "paper": {
            "mnist": dict(noise_multiplier=1.1, max_steps=3_601_200, samples_per_class=6000),
            "fashion-mnist": dict(noise_multiplier=0.9, max_steps=3_601_200, samples_per_class=6000),
            "celeba-gender-32": dict(batch_size=200, noise_multiplier=0.8, max_steps=2_439_813, max_grad_norm=0.1,
                                     sinkhorn_eps=25.0, cost="l2", debias_ratio=0.0, latent_dim=32, delta=1e-6,
                                     samples_per_class=30_000),
        },
    }

    def __init__(self, hparams: DPSinkhornHparams, info: DataInfo):
        super().__init__(hparams, info)
        h = hparams
        self.G = conditional_generator(self.name, info.image_shape, info.num_classes, h.g_width, h.latent_dim)
        self.cost = make_cost(h.cost, h.l1_weight)

    # ------------------------------------------------------------------ privacy

    def plan(self, budget: Budget) -> list[PrivacyPart]:
        h, q = self.hparams, self.sample_rate
        sigma, steps = steps_and_noise(method=self.name, epsilon=budget.epsilon, delta=budget.delta, sample_rate=q,
                                       steps=h.steps, noise_multiplier=h.noise_multiplier, cap=h.max_steps)
        return [PrivacyPart(PART, noise_multiplier=float(sigma), sample_rate=q, steps=int(steps))]

    def noise_to_signal(self, part: PrivacyPart) -> float:
        """σ_hook·√(B·d): one clip bound C for the whole B×d gradient matrix, noise on every
        coordinate (the batch size raises the noise, not the signal)."""
        d = math.prod(self.info.image_shape)
        return self.hook_noise_multiplier(part.noise_multiplier) * math.sqrt(self.hparams.batch_size * d)

    @staticmethod
    def hook_noise_multiplier(accounted_sigma: float) -> float:
        """Per-coordinate noise std of the hook in units of C: 2σ (sensitivity 2C)."""
        return 2.0 * accounted_sigma

    # ----------------------------------------------------------------- training

    def features(self, images: Tensor, labels: Tensor) -> Tensor:
        """[flatten(x), w·onehot(y)]: the points the transport moves."""
        onehot = F.one_hot(labels, self.info.num_classes).to(images.dtype) * self.hparams.label_weight
        return torch.cat([images.flatten(1), onehot], 1)

    def loss(self, x: Tensor, y: Tensor, x_alt: Tensor, real: Split) -> Tensor:
        """The semi-debiased loss of one step: OT_ε(X, S) − ½·OT_ε(X, X'), X' = [X[r:], X_alt]
        with X_alt of labels y[:r]; 0 (times X, so that the hook still fires) when S is empty."""
        h = self.hparams
        r = len(x_alt)
        fx = self.features(x, y)
        if len(real) == 0:
            return (fx * 0).sum()
        fx_prime = torch.cat([fx[r:], self.features(x_alt, y[:r])]) if r else fx
        return semi_debiased_loss(fx, self.features(real.images, real.labels), fx_prime, h.sinkhorn_eps, self.cost,
                                  h.scaling, h.sinkhorn_iters)

    def fit(self, train: Split, budget: Budget, ctx: RunContext) -> None:
        threads = torch.get_num_threads()
        if self.hparams.torch_threads is not None:  # small matrices: extra threads cost more than they give
            torch.set_num_threads(self.hparams.torch_threads)
        try:
            self._fit(train, ctx)
        finally:
            torch.set_num_threads(threads)
        self.G.cpu().eval()

    def _fit(self, train: Split, ctx: RunContext) -> None:
        h, dev, k = self.hparams, ctx.device, self.info.num_classes
        part = ctx.part(PART)
        q = self.sample_rate
        if part.sample_rate != q:
            raise AssertionError("planned sampling rate differs from B/N")
        train = train.to(dev)
        data_gen = ctx.generator("data")  # Poisson batches, z, y
        noise_gen = ctx.generator("noise", offset=1)  # the sanitiser's noise
        self.G.to(dev).train()
        opt = torch.optim.Adam(self.G.parameters(), lr=h.lr, betas=(h.beta1, h.beta2), weight_decay=h.weight_decay)
        sanitizer = BatchGradientSanitizer(h.max_grad_norm, self.hook_noise_multiplier(part.noise_multiplier),
                                           generator=noise_gen, on_release=lambda: ctx.spend(PART),
                                           observe=getattr(ctx, "observe", None), part=PART)
        ctx.watch(PART, sanitizer)
        alt_clip = BatchGradientSanitizer(h.max_grad_norm, 0.0)  # data-independent: clipped, no noise
        r = ctx.restore()
        start = 1
        if r is not None:
            self.G.load_state_dict(r["G"])
            opt.load_state_dict(r["opt"])
            start = int(r["t"]) + 1
        steps = part.steps
        n_regen = int(h.debias_ratio * h.batch_size)
        bar = ctx.progress(total=steps, desc=f"{self.name} generator steps")
        bar.update(start - 1)
        for t in range(start, steps + 1):
            idx = poisson_batch(len(train), q, data_gen, dev)
            real = train.subset(idx)
            y = torch.randint(0, k, (h.batch_size,), generator=data_gen, device=dev)
            z = torch.randn(h.batch_size + n_regen, h.latent_dim, generator=data_gen, device=dev)
            out = self.G(z, torch.cat([y, y[:n_regen]]))  # one forward: G has no batch coupling
            x, x_alt = out[:h.batch_size], out[h.batch_size:]
            handles = [sanitizer.attach(x)] + ([alt_clip.attach(x_alt)] if n_regen else [])
            calls = sanitizer.calls
            loss = self.loss(x, y, x_alt, real)
            opt.zero_grad(set_to_none=True)
            loss.backward(inputs=list(self.G.parameters()))
            for handle in handles:
                handle.remove()
            if sanitizer.calls != calls + 1:  # the sanitiser counted its release on the ledger (on_release)
                raise AssertionError("the gradient at the generated batch was not sanitised exactly once")
            opt.step()
            bar.update(1)

            ctx.accumulate(loss=loss.item(), real_batch=float(len(real)),
                           clip_fraction=sanitizer.last_clip_fraction, grad_norm=sanitizer.last_mean_norm)
            if t % h.log_every == 0 or t == steps:
                ctx.record(step=t)
            if t < steps and ctx.checkpoint_due():
                ctx.checkpoint({"t": t, "G": self.G.state_dict(), "opt": opt.state_dict()})
        bar.close()

    def state_dict(self) -> dict:
        return {"G": self.G.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.G.load_state_dict(state["G"])
