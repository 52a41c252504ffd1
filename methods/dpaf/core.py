"""The DPAF method plugin: hyperparameters, presets, privacy plan, the two training phases
of Algorithm 1, sampling. See the package docstring (``methods/dpaf/__init__.py``) for
the paper sections implemented and every departure from the paper."""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from typing import Annotated, Literal

import torch
import torch.nn.functional as F

from dpgen_bench.api import Budget, DataInfo, Method, PrivacyPart, RunContext, Split
from dpgen_bench.errors import UserError
from dpgen_bench.nets.averaging import EmaWarmup, settle_warmup, update_average
from dpgen_bench.nets.sampling import sample_conditional
from dpgen_bench.privacy import dpsgd_noise_to_signal, parameter_count, release_noise_to_signal
from dpgen_bench.privacy.dpsgd import empty_batch, make_private, poisson_batch, private_backward
from dpgen_bench.privacy.release import GaussianRelease
from dpgen_bench.settings import (Decay, Ge, Interval, NonNegativeInt, PositiveFloat, PositiveInt,
                                  check_declared)

from .budget import parse_split, plan_parts, schedule
from .compression import GradientCompression
from .dpagg import aggregate, dpagg, sin
from .nets import (
    Classifier,
    Conv1,
    Conv2Star,
    Generator,
    Head,
    canonical_config,
    check_layout,
    dcgan_init,
    make_layout,
    sensitivity_of,
)

LayerConfig = Literal["C2-C2-C1", "C2-C1-×", "C3-C1-×", "C2-C1-x", "C3-C1-x"]


@dataclass(frozen=True)
class DPAFHparams:
    # Architecture (§6.1 canonical implementation; App. A.10). Defaults: CelebA's.
    layer_config: LayerConfig = "C2-C2-C1"
    d_width: PositiveInt = 64  # d: channels of D's (and C's) first convolution; doubled per layer
    g_width: PositiveInt = 64  # G's channels mirror D's with this base width
    latent_dim: PositiveInt = 100  # z, §6.1
    label_dim: PositiveInt = 16  # size of the label embeddings of D and G (ours)
    # D's label embedding starts at N(0, s²) (ours; 1: torch's default). At 1 it is ~57× the image's
    # spatial variation in conv2*'s input (benchmarks/presets.md, "dpaf")
    d_label_std: PositiveFloat = 1.0
    fc_width: PositiveInt = 128  # hidden units of the first of the two FC* layers (ours)
    # G's hidden layers (nets.Generator): LeakyReLU, no BatchNorm, one-hot labels, as the cDCGAN of
    # Private GANs' code; relu + batchnorm (+ embedding) is DCGAN's textbook G, which collapses to one
    # image per class here (the package docstring)
    g_batchnorm: bool = False
    g_activation: Literal["leaky_relu", "relu"] = "leaky_relu"
    g_label: Literal["onehot", "embedding"] = "onehot"
    image_size: Annotated[int, Ge(4)] | None = None  # train at this size (resize inside fit), sample back; None: native
    # Training schedule (Algorithm 1).
    batch_size: PositiveInt = 64  # expected Poisson batch B (§6.1: 24 MNIST/FMNIST, 64 CelebA/FFHQ)
    batches: PositiveInt = 20_000  # 𝔹: phase-2 batches = DPAGG steps T3; conv2* takes ⌊𝔹/μ⌋ steps
    classifier_batches: NonNegativeInt | None = None  # T1 of phase 1; None: 𝔹 (Algorithm 1 loops 𝔹 times twice)
    mu: PositiveInt = 8  # asymmetry multiplier μ (§6.1, Table 10)
    n_critic: PositiveInt = 1  # G step every n_critic batches (Table 16: best at ε=10 with μ=8)
    # G's loss (Algorithm 1 line 16): "per_example" = the paper's D̂ (D without DPAGG) on each
    # fake; "aggregate" = D on the fake batch's clean aggregate, the input D's head is trained
    # on (ours, a diagnostic of the no-noise gap; uses no real data, so no privacy cost)
    g_loss: Literal["per_example", "aggregate"] = "per_example"
    # Privacy (§6.1 budget notations; §5.4 Theorem 5).
    budget_split: str = "0.1,x,0.1"  # (ε1, ×, ε3) absolute or (x1%, x2%, x3%)
    fill_budget: bool = True  # scale the shares up until the RDP composition reaches ε (false: the paper's additive reading)
    max_grad_norm: PositiveFloat = 1.0  # u1 = u2, DPSGD clipping norm of conv1 and conv2*
    # one part's own bound (None: max_grad_norm): conv2*'s per-example gradients in sound mode sit
    # far below 1 (benchmarks/presets.md, "Measured gradient norms of every private part on mnist")
    max_grad_norm_conv1: PositiveFloat | None = None
    max_grad_norm_conv2: PositiveFloat | None = None
    gc: bool = True  # gradient compression of per-sample gradients (§6.2.8, Table 12)
    gc_keep: Annotated[float, Interval(0, 1, "(]")] = 0.9  # share of each per-sample gradient kept (top by magnitude)
    sin_eps: PositiveFloat = 1e-8  # inside SIN's square root; keeps constant maps at 0 (norm ≤ p)
    privacy_mode: Literal["sound", "paper"] = "sound"  # see the package docstring
    # Optimisers: Adam everywhere (DCGAN's), DP-Adam for the private parts.
    lr_c: PositiveFloat = 1e-3
    lr_conv2: PositiveFloat = 2e-4
    lr_head: PositiveFloat = 2e-4
    lr_g: PositiveFloat = 2e-4
    beta1: Decay = 0.5
    beta2: Decay = 0.999
    log_every: PositiveInt = 50
    # exponential moving average of G's weights (β per G step; 0: off, the paper's G): the samples
    # come from the average, a function of G's iterates, so of no privacy cost (not in the paper)
    ema_decay: Decay = 0.0
    ema_warmup: EmaWarmup = "bias-corrected"  # dpgen_bench/nets/averaging.py; without an average: "none"
    torch_threads: PositiveInt | None = None  # intra-op threads during fit (restored after); None: unchanged
    # how conv1's and conv2*'s per-example gradients are clipped (dpgen_bench/privacy/dpsgd.py).
    # auto: "bk" (dpgen_bench/privacy/fastclip.py), the fastest exact one: with gradient
    # compression it builds each example's gradient a chunk of examples at a time (memory
    # bounded, ~half the time of Opacus' hooks + GC), without it none; the same update as
    # "hooks" either way (tests/unit/test_dpaf.py, tests/unit/test_fastclip.py)
    grad_sample_mode: Literal["auto", "hooks", "functorch", "bk"] = "auto"

    def __post_init__(self):
        check_declared(self)
        settle_warmup(self, "none")
        canonical_config(self.layer_config)
        parse_split(self.budget_split)

    def clip(self, part: str) -> float:
        """The DPSGD clipping bound of ``part`` (conv1 or conv2)."""
        own = getattr(self, f"max_grad_norm_{part}")
        return self.max_grad_norm if own is None else own

    @property
    def dpsgd_mode(self) -> str:
        return "bk" if self.grad_sample_mode == "auto" else self.grad_sample_mode


# the quick preset on digits (see DPAF.presets for how it was chosen); mnist-5k and mnist tune four of its settings
_QUICK_DIGITS = dict(layer_config="C2-C1-×", batch_size=24, batches=1000, classifier_batches=100, mu=8, n_critic=1,
                     d_width=8, g_width=32, label_dim=10, fc_width=64, latent_dim=100, budget_split="10%,40%,50%",
                     torch_threads=1, samples_per_class=100)
_QUICK_MNIST = dict(_QUICK_DIGITS, mu=1, n_critic=3, lr_g=1e-3, lr_head=1e-3, lr_conv2=1e-3)


class DPAF(Method):
    """DPAF: DP feature aggregation in the forward phase + asymmetric D training (Lin et al.)."""

    name = "dpaf"
    private = True
    conditional = True
    Hparams = DPAFHparams
    # the same update in every mode (tests/unit/test_dpaf.py, tests/unit/test_fastclip.py)
    bookkeeping_hparams = Method.bookkeeping_hparams | {"grad_sample_mode"}
    renamed_hparams = {"width": "d_width"}  # one name per concept across methods
    # as before: max_grad_norm for both parts, D's label embedding at N(0, 1)
    late_hparams = {"max_grad_norm_conv1": None, "max_grad_norm_conv2": None, "d_label_std": 1.0,
                    "ema_decay": 0.0, "ema_warmup": "none"}
    presets = {
        "quick": {
            # MNIST's canonical choices, narrow nets, split 10/40/50 % (canonical: chance on val; benchmarks/presets.md)
            "digits": _QUICK_DIGITS,
            # a D that keeps up with G (benchmarks/presets.md, "DPAF's discriminator settings")
            "mnist-5k": _QUICK_MNIST,
            "mnist": dict(_QUICK_MNIST, max_grad_norm_conv2=0.1),
        },
        # B = 500; conv2*'s clip (and quick's) at its measured scale; G's average: benchmarks/presets.md, "dpaf"
        "long": {"mnist": dict(_QUICK_MNIST, batch_size=500, batches=3000, classifier_batches=300,
                               max_grad_norm_conv2=0.02, ema_decay=0.99)},
        "tiny": {  # tests only: seconds
            "*": dict(layer_config="C2-C1-×", batch_size=16, batches=40, classifier_batches=10, mu=4, n_critic=2,
                      d_width=4, g_width=4, label_dim=4, fc_width=8, latent_dim=8, log_every=10, torch_threads=1,
                      samples_per_class=10),
        },
        "paper": {
            # §6.1 "Canonical Implementation"; 𝔹, d and n_critic are ours (docs/provenance.md, "dpaf")
            "mnist": dict(layer_config="C2-C1-×", batch_size=24, latent_dim=100, mu=8, gc=True, gc_keep=0.9,
                          budget_split="0.1,x,0.1", batches=20_000, d_width=64, g_width=64, n_critic=1,
                          samples_per_class=6_000),
            "fashion-mnist": dict(layer_config="C2-C1-×", batch_size=24, latent_dim=100, mu=8, gc=True,
                                  gc_keep=0.9, budget_split="0.1,x,0.1", batches=20_000, d_width=64, g_width=64,
                                  n_critic=1, samples_per_class=6_000),
            "celeba-gender": dict(layer_config="C2-C2-C1", batch_size=64, latent_dim=100, mu=8, gc=True,
                                  gc_keep=0.9, budget_split="0.1,x,0.1", batches=20_000, d_width=64, g_width=64,
                                  n_critic=1, samples_per_class=30_000),
            "celeba-hair": dict(layer_config="C2-C2-C1", batch_size=64, latent_dim=100, mu=8, gc=True,
                                gc_keep=0.9, budget_split="0.1,x,0.1", batches=20_000, d_width=64, g_width=64,
                                n_critic=1, samples_per_class=20_000),
            "ffhq-gender": dict(layer_config="C3-C1-×", batch_size=64, latent_dim=100, mu=8, gc=True, gc_keep=0.9,
                                budget_split="0.1,x,0.1", batches=20_000, d_width=64, g_width=64, n_critic=1,
                                samples_per_class=30_000),
        },
    }

    def __init__(self, hparams: DPAFHparams, info: DataInfo):
        super().__init__(hparams, info)
        c, h, w = info.image_shape
        if h != w:
            raise UserError(f"dpaf needs square images, got {h}×{w}")
        size = hparams.image_size or h
        self.train_shape = (c, size, size)
        try:
            self.layout = make_layout(self.train_shape, hparams.layer_config, hparams.d_width)
            check_layout(self.layout)
        except ValueError as e:
            raise UserError(f"dpaf: {e}; use layer_config=C2-C1-× or a larger --set image_size=N") from None
        self.sensitivity = sensitivity_of(self.layout)  # √m·p of DPAGG
        self._build()

    # ------------------------------------------------------------------ networks

    def _build(self) -> None:
        h, L, k = self.hparams, self.layout, self.info.num_classes
        self.conv1 = Conv1(L)
        self.conv2 = Conv2Star(L, k, h.label_dim)
        self.head = Head(L, h.fc_width, 1)
        self.G = Generator(L, k, h.g_width, h.latent_dim, h.label_dim, h.g_batchnorm, h.g_activation,
                           h.g_label)
        for m in (self.conv1, self.conv2, self.head, self.G):
            dcgan_init(m)
        if h.d_label_std != 1.0:  # the same draw, scaled: the streams of other settings stay as they were
            with torch.no_grad():
                self.conv2.embed.weight.mul_(h.d_label_std)
        self.G_ema = copy.deepcopy(self.G).requires_grad_(False) if h.ema_decay > 0 else None  # draws nothing

    def _features(self, x, y, conv2=None):
        """SIN(conv2*(conv1(x), y)): the per-example maps that (DP)AGG aggregates."""
        conv2 = conv2 if conv2 is not None else self.conv2
        return sin(conv2(self.conv1(x), y), self.hparams.sin_eps)

    def _head_agg(self, sums: torch.Tensor) -> torch.Tensor:
        """conv3*/FC* on (noisy) aggregated sums (k, m·p·p), divided by the expected batch
        size B (a public constant: post-processing)."""
        return self.head(sums / self.hparams.batch_size)

    def _fake(self, n: int, device, generator=None):
        z = torch.randn(n, self.hparams.latent_dim, device=device, generator=generator)
        y = torch.randint(0, self.info.num_classes, (n,), device=device, generator=generator)
        return self.G(z, y), y

    # ------------------------------------------------------------------- privacy

    def accounting_caveat(self) -> str | None:
        if self.hparams.privacy_mode == "paper":
            return ("dpaf privacy_mode=paper: ε is the paper's accounting of Algorithm 1 (Theorem 5), which "
                    "misses C's non-private layers, the batch-coupled losses and the reused μ batches "
                    "(methods/dpaf docstring); not a DP guarantee")
        return None

    def _schedule(self):
        h = self.hparams
        t1 = h.batches if h.classifier_batches is None else h.classifier_batches
        return schedule(n_train=self.info.n_train, batch_size=h.batch_size, batches=h.batches, classifier_batches=t1,
                        mu=h.mu, conv2_rate="fresh" if h.privacy_mode == "sound" else "union")

    def noise_to_signal(self, part: PrivacyPart) -> float:
        """conv1: σ·√d / B on C (all of it in sound mode, conv1 alone in paper mode); conv2*:
        σ·√d / 2μB (its step averages μ real and μ fake batches); DPAGG: a class's aggregate
        of m·p² SIN features (each record's of norm √m·p) read as the mean of its B/k
        records."""
        h, k = self.hparams, self.info.num_classes
        if part.name == "dpagg":
            return release_noise_to_signal(part.noise_multiplier, round(self.sensitivity ** 2), h.batch_size / k)
        if part.name == "conv2":
            return dpsgd_noise_to_signal(part.noise_multiplier, parameter_count(self.conv2), 2 * h.mu * h.batch_size)
        C = Classifier(self.layout, k, h.fc_width, h.sin_eps)  # built in fit; here only counted
        dp_module = C if h.privacy_mode == "sound" else C.conv1
        return dpsgd_noise_to_signal(part.noise_multiplier, parameter_count(dp_module), h.batch_size)

    def plan(self, budget: Budget) -> list[PrivacyPart]:
        h = self.hparams
        return plan_parts(split=h.budget_split, epsilon=budget.epsilon, delta=budget.delta, sched=self._schedule(),
                          fill_budget=h.fill_budget)

    # ------------------------------------------------------------------ training

    def _resize(self, x: torch.Tensor, size: int) -> torch.Tensor:
        if x.shape[-1] == size:
            return x
        antialias = size < x.shape[-1]
        return F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False,
                             antialias=antialias).clamp(-1, 1)

    def fit(self, train: Split, budget: Budget, ctx: RunContext) -> None:
        h, dev = self.hparams, ctx.device
        torch.manual_seed(ctx.seed)
        self._build()  # seeded initialisation
        for m in (self.conv1, self.conv2, self.head, self.G):
            m.to(dev).train()
        if self.G_ema is not None:
            self.G_ema.to(dev)
        images = self._resize(train.images.to(dev), self.train_shape[1])
        labels = train.labels.to(dev)
        parts = {name: ctx.part(name) for name in ("conv1", "conv2", "dpagg")}
        gens = {"data": ctx.generator("data"), "noise": ctx.generator("noise", offset=1),
                "gc": ctx.generator("gc", offset=2)}  # gc: GC's threshold sampling
        bar = ctx.progress(total=parts["conv1"].steps + parts["dpagg"].steps, desc="dpaf")
        threads = torch.get_num_threads()
        if h.torch_threads is not None:  # tiny convolutions: extra threads cost more than they give
            torch.set_num_threads(h.torch_threads)
        r = ctx.restore()
        try:
            if r is None or r["phase"] == 1:
                self._phase1(images, labels, parts["conv1"], ctx, gens, bar, resume=r)
                r = None
            else:  # phase 1 finished before the checkpoint: conv1 comes from it
                self.conv1.load_state_dict(r["conv1"])
                bar.update(parts["conv1"].steps)
            self._phase2(images, labels, parts["conv2"], parts["dpagg"], ctx, gens, bar, resume=r)
        finally:
            bar.close()
            torch.set_num_threads(threads)
        if self.G_ema is not None:  # the released generator is the average
            self.G.load_state_dict(self.G_ema.state_dict())
            self.G_ema.cpu()
        for m in (self.conv1, self.conv2, self.head, self.G):
            m.cpu().eval()

    # phase 1: the classifier C (Algorithm 1 lines 2–6, §5.2.1)

    def _phase1(self, images, labels, part: PrivacyPart, ctx, gens: dict, bar, resume: dict | None) -> None:
        h, dev = self.hparams, images.device
        data_gen, noise_gen, gc_gen = gens["data"], gens["noise"], gens["gc"]
        self.conv1.requires_grad_(False)
        if part.steps == 0:  # ε1 = 0: conv1 stays random (Table 4's "random conv1")
            return
        n_train, k = len(labels), self.info.num_classes
        # C's initialisation has its own seed and leaves torch's global generator alone, so a
        # run resumed in phase 1 (global generator restored before this point) draws phase 2's
        # fakes exactly as the uninterrupted run does
        with torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else []):
            torch.manual_seed(ctx.seed + 3)
            C = Classifier(self.layout, k, h.fc_width, h.sin_eps).to(dev)
            dcgan_init(C)
        betas = (h.beta1, h.beta2)
        sound = h.privacy_mode == "sound"
        if sound:  # all of C is DP-trained, one clipped gradient per example
            dp_module, other_opt = C, None
        else:  # paper: only conv1 by DPSGD, conv2/conv3/FC by plain (non-private) gradient steps
            dp_module = C.conv1
            other_opt = torch.optim.Adam(list(C.conv2.parameters()) + list(C.head.parameters()), lr=h.lr_c,
                                         betas=betas)
        opt = torch.optim.Adam(dp_module.parameters(), lr=h.lr_c, betas=betas)
        gsm, dp_opt = make_private(dp_module, opt, ctx=ctx, part=part.name, max_grad_norm=h.clip("conv1"),
                                   expected_batch_size=h.batch_size, noise_generator=noise_gen,
                                   grad_sample_mode=h.dpsgd_mode, per_example_transform=self._gc(gc_gen))
        start = 1
        if resume is not None:
            C.load_state_dict(resume["C"])
            opt.load_state_dict(resume["opt"])
            if other_opt is not None:
                other_opt.load_state_dict(resume["other_opt"])
            start = resume["t"] + 1
            bar.update(start - 1)
        for t in range(start, part.steps + 1):
            idx = poisson_batch(n_train, part.sample_rate, data_gen, dev)
            x, y = images[idx], labels[idx]
            dp_opt.zero_grad(set_to_none=True)
            if other_opt is not None:
                other_opt.zero_grad(set_to_none=True)
            if len(idx) == 0:  # an empty Poisson batch still takes its (pure-noise) step
                empty_batch(gsm)
                loss = None
            elif sound:
                # Per-example MSE between the predicted proportions of a batch of one and
                # its proportions (the one-hot label): decomposes over examples.
                probs = F.softmax(gsm(x), dim=1)
                loss = ((probs - F.one_hot(y, k).to(probs.dtype)) ** 2).mean(1)
                private_backward(gsm, dp_opt, loss)
                loss = loss.mean()
            else:
                feats = sin(C.conv2(gsm(x)), h.sin_eps)
                agg = feats.flatten(1).sum(0, keepdim=True) / len(idx)
                probs = F.softmax(C.head(agg), dim=1)
                target = F.one_hot(y, k).to(probs.dtype).mean(0, keepdim=True)  # class proportions
                loss = F.mse_loss(probs, target)
                private_backward(gsm, dp_opt, loss, also=list(C.conv2.parameters()) + list(C.head.parameters()))
            dp_opt.step()  # counted on conv1 (GC: make_private's per-example transform)
            if other_opt is not None and loss is not None:
                other_opt.step()
            bar.update(1)
            if loss is not None:
                ctx.accumulate(mse=loss.item())
            if t % h.log_every == 0 or t == part.steps:
                ctx.record(phase="classifier", step=t)
            if ctx.checkpoint_due():  # after the last step too: phase 2 has not begun
                ctx.checkpoint({"phase": 1, "t": t, "C": C.state_dict(), "opt": opt.state_dict(),
                                "other_opt": other_opt.state_dict() if other_opt is not None else None})
        gsm._close()
        self.conv1.load_state_dict(C.conv1.state_dict())  # conv1* ← conv1; C is discarded
        self.conv1.requires_grad_(False)

    # phase 2: the DPGAN (Algorithm 1 lines 7–17, §5.2.2)

    def _phase2(self, images, labels, part2: PrivacyPart, part3: PrivacyPart, ctx, gens: dict, bar,
                resume: dict | None):
        h, dev = self.hparams, images.device
        data_gen, noise_gen, gc_gen = gens["data"], gens["noise"], gens["gc"]
        n_train, B, mu = len(labels), h.batch_size, h.mu
        betas = (h.beta1, h.beta2)
        opt_head = torch.optim.Adam(self.head.parameters(), lr=h.lr_head, betas=betas)
        opt_g = torch.optim.Adam(self.G.parameters(), lr=h.lr_g, betas=betas)
        opt_c2 = torch.optim.Adam(self.conv2.parameters(), lr=h.lr_conv2, betas=betas)
        gsm2, dp_opt2 = make_private(self.conv2, opt_c2, ctx=ctx, part=part2.name, max_grad_norm=h.clip("conv2"),
                                     expected_batch_size=2 * mu * B, noise_generator=noise_gen,
                                     grad_sample_mode=h.dpsgd_mode, per_example_transform=self._gc(gc_gen))
        sigma3, sens = part3.noise_multiplier, self.sensitivity
        # DPAGG's release of the real aggregate: counts the step before its noise is drawn and
        # holds a white-box audit's canaries (privacy.release); the fakes' aggregate gets the
        # same noise (line 8) from the same generator, right after, but is not a private release
        real_dpagg = GaussianRelease(ctx, part3.name, sens, noise_gen)
        window: list = []
        conv2_steps, g_steps = 0, 0
        targets = torch.tensor([1.0, 0.0], device=dev)
        start = 1
        nets = {"conv1": self.conv1, "conv2": self.conv2, "head": self.head, "G": self.G}
        if self.G_ema is not None:
            nets["G_ema"] = self.G_ema
        opts = {"opt_head": opt_head, "opt_g": opt_g, "opt_c2": opt_c2}
        if resume is not None:  # checkpoints fall on window boundaries (i ≡ 0 mod μ): no window to restore
            for k, m in {**nets, **opts}.items():
                m.load_state_dict(resume[k])
            conv2_steps, g_steps = resume["conv2_steps"], resume["g_steps"]
            start = resume["t"] + 1
            bar.update(start - 1)
        for i in range(start, part3.steps + 1):
            # L_BCE on D with DPAGG(ε3): real and fake aggregates, noise on both (line 8)
            idx = poisson_batch(n_train, part3.sample_rate, data_gen, dev)
            g_due = i % h.n_critic == 0
            with torch.set_grad_enabled(g_due):  # the i-th batch's fakes also serve G's step (line 16)
                xf_g, yf = self._fake(B, dev)
            xf = xf_g.detach()
            with torch.no_grad():
                feats = self._features(images[idx], labels[idx])
                s_real = real_dpagg(aggregate(feats), record_norms=feats.flatten(1).norm(dim=1))  # counted by it
                s_fake = dpagg(self._features(xf, yf), sigma3, sens, noise_gen)
            d_loss = F.binary_cross_entropy_with_logits(self._head_agg(torch.stack([s_real, s_fake])).flatten(),
                                                        targets)
            opt_head.zero_grad(set_to_none=True)
            d_loss.backward()  # inputs are detached: only conv3*/FC* move (lines 11/14)
            opt_head.step()
            window.append((s_real, s_fake, idx, xf, yf))
            ctx.accumulate(d_loss=d_loss.item())

            # conv2* by DPSGD(ε2) once every μ batches (lines 9–12)
            if i % mu == 0 and conv2_steps < part2.steps:
                if h.privacy_mode == "sound":
                    c2_loss = self._conv2_step_sound(images, labels, window, part2, gsm2, dp_opt2, data_gen)
                else:
                    c2_loss = self._conv2_step_paper(images, labels, window, gsm2, dp_opt2)
                conv2_steps += 1  # dp_opt2's step is counted on conv2
                ctx.accumulate(conv2_loss=c2_loss)
            if i % mu == 0:
                window = []

            # G every n_critic batches on L''_BCE through D̂ (no aggregation) (lines 15–17)
            if g_due:
                ctx.accumulate(g_loss=self._g_step(gsm2, opt_g, xf_g, yf))
                if self.G_ema is not None:
                    update_average(self.G_ema, self.G, h.ema_decay, g_steps + 1, h.ema_warmup)
                g_steps += 1
            bar.update(1)
            if i % h.log_every == 0 or i == part3.steps:
                # a window without a G or conv2* step logs no g_loss / conv2_loss
                ctx.record(phase="gan", step=i, conv2_steps=conv2_steps, g_steps=g_steps)
            if i % mu == 0 and i < part3.steps and ctx.checkpoint_due():
                ctx.checkpoint({"phase": 2, "t": i, "conv2_steps": conv2_steps, "g_steps": g_steps,
                                **{k: m.state_dict() for k, m in {**nets, **opts}.items()}})
        gsm2._close()

    def _conv2_step_sound(self, images, labels, window, part2, gsm2, dp_opt2, data_gen) -> float:
        """conv2*'s DPSGD step on L'_BCE (D̃: AGG instead of DPAGG) with per-example
        gradients. Reals: a fresh Poisson sample (rate γ2 = μB/N) split at random into μ
        chunks; example i of chunk k gets the gradient of ⟨SIN(conv2*(conv1(xᵢ), yᵢ)), v_k⟩
        with v_k = ∂BCE(head(a), 1)/∂a at a = the k-th real aggregate DPAGG released in
        this window. Fakes: the window's own fake batches, v at their (equally noised)
        aggregates, target 0. This is the chain rule of L'_BCE through AGG with the
        batch-dependent factor ∂L/∂a fixed at a DP-released point, so each example's
        gradient depends on that example alone (and clipping bounds its contribution)."""
        h, dev = self.hparams, images.device
        mu = len(window)
        idx = poisson_batch(len(labels), part2.sample_rate, data_gen, dev)
        k_real = torch.randint(0, mu, (len(idx),), generator=data_gen, device=dev)
        xf = torch.cat([w[3] for w in window])
        yf = torch.cat([w[4] for w in window])
        k_fake = torch.cat([torch.full((len(w[3]),), k, device=dev) for k, w in enumerate(window)])
        with torch.no_grad():
            h1 = self.conv1(torch.cat([images[idx], xf]))
        feats = sin(gsm2(h1, torch.cat([labels[idx], yf])), h.sin_eps).flatten(1)  # per-example graph
        points = torch.cat([torch.stack([w[0] for w in window]), torch.stack([w[1] for w in window])])
        points.requires_grad_(True)
        tgt = torch.cat([torch.ones(mu, device=dev), torch.zeros(mu, device=dev)])
        lv = F.binary_cross_entropy_with_logits(self._head_agg(points).flatten(), tgt, reduction="sum")
        (v,) = torch.autograd.grad(lv, points)  # head parameters untouched
        rows = torch.cat([v[:mu][k_real], v[mu:][k_fake]])
        surrogate = (feats * rows).sum(1).mean()  # Opacus' per-sample gradients: ∇⟨f_i, v⟩
        dp_opt2.zero_grad(set_to_none=True)
        private_backward(gsm2, dp_opt2, surrogate)  # GC (make_private's transform) included
        dp_opt2.step()
        return float(lv.item()) / (2 * mu)

    def _conv2_step_paper(self, images, labels, window, gsm2, dp_opt2) -> float:
        """Algorithm 1 line 10 literally: L'_BCE over the last μ batches on D̃ (clean AGG
        per batch, real and fake), Opacus' per-sample gradients of that coupled loss."""
        h, dev = self.hparams, images.device
        B, mu = h.batch_size, len(window)
        xs, ys, segs = [], [], []
        for k, (_, _, idx, xf, yf) in enumerate(window):
            xs += [images[idx], xf]
            ys += [labels[idx], yf]
            segs += [torch.full((len(idx),), k, device=dev), torch.full((len(xf),), mu + k, device=dev)]
        with torch.no_grad():
            h1 = self.conv1(torch.cat(xs))
        feats = sin(gsm2(h1, torch.cat(ys)), h.sin_eps).flatten(1)
        sums = torch.zeros(2 * mu, feats.shape[1], device=dev).index_add(0, torch.cat(segs).long(), feats)
        tgt = torch.cat([torch.ones(mu, device=dev), torch.zeros(mu, device=dev)])
        loss = F.binary_cross_entropy_with_logits(self._head_agg(sums).flatten(), tgt)
        dp_opt2.zero_grad(set_to_none=True)
        private_backward(gsm2, dp_opt2, loss)  # conv2*'s parameters only; GC included
        dp_opt2.step()
        return float(loss.item())

    def _gc(self, generator: torch.Generator) -> GradientCompression | None:
        """Gradient compression as the DPSGD parts' per-example transform (None: gc off)."""
        h = self.hparams
        return GradientCompression(h.gc_keep, generator) if h.gc else None

    def _g_step(self, gsm2, opt_g, x, y) -> float:
        """L''_BCE on D̂ (D without DPAGG: per example) for the batch's fakes; only G moves.
        With ``g_loss=aggregate``: on D's head at the fakes' clean aggregate (the mean of
        their features, as D's head sees the noisy one)."""
        gsm2.disable_hooks()
        try:
            feats = self._features(x, y)
            if self.hparams.g_loss == "aggregate":
                logits = self._head_agg(feats.flatten(1).sum(0, keepdim=True)).flatten()
            else:
                logits = self.head(feats).flatten()  # D̂: every fake on its own
            loss = F.softplus(-logits).mean()  # −log D̂(G(z)): non-saturating
            opt_g.zero_grad(set_to_none=True)
            loss.backward(inputs=list(self.G.parameters()))
            opt_g.step()
        finally:
            gsm2.enable_hooks()
        return float(loss.item())

    # conv1 (DPSGD, phase 1), conv2* (DPSGD) and conv3*/FC* (trained only on DPAGG's noisy
    # aggregates: post-processing) are all outputs of the mechanism: the audit may read D̂.
    released_parts = ("D",)

    @torch.no_grad()
    def released_scores(self, images: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        """D̂'s logit per record (D without aggregation, as G's step reads it)."""
        for m in (self.conv1, self.conv2, self.head):
            m.cpu().eval()
        x = self._resize(images.cpu(), self.train_shape[1])
        out = [self.head(self._features(a, b)).flatten() for a, b in zip(x.split(512), labels.cpu().split(512))]
        return {"D": torch.cat(out)}

    # ------------------------------------------------------------------ sampling

    def sample(self, n: int, labels: torch.Tensor | None, rng: torch.Generator):
        images, labels = sample_conditional(self.G, n, labels, self.info.num_classes, self.hparams.latent_dim, rng)
        if not n:
            images = torch.zeros(0, *self.train_shape)
        return self._resize(images, self.info.image_shape[1]).clamp(-1, 1), labels

    def state_dict(self) -> dict:
        return {
            "conv1": self.conv1.state_dict(),
            "conv2": self.conv2.state_dict(),
            "head": self.head.state_dict(),
            "G": self.G.state_dict(),
            "hparams": dataclasses.asdict(self.hparams),
        }

    def load_state_dict(self, state: dict) -> None:
        self.conv1.load_state_dict(state["conv1"])
        self.conv2.load_state_dict(state["conv2"])
        self.head.load_state_dict(state["head"])
        self.G.load_state_dict(state["G"])


__all__ = ["DPAF", "DPAFHparams"]

