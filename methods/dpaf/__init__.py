"""DPAF: "Image Synthesis via Differentially Private Aggregation in Forward Phase" (Lin,
Hsu, Yu, Cao, Huang; arXiv full version = main source, OpenReview version and its
appendix for Algorithm 1 / App. A.x numbering). There is no public code: everything
below comes from the papers; where they are silent or ambiguous the choice is ours and
is listed here with the place in the paper.

Implemented (arXiv section numbers; OpenReview numbers in brackets):

- §5.2.1 [3.1], Algorithm 1 lines 2–6 [App. A.2]: phase 1, the classifier C = conv1 –
  conv2 – SIN – AGG – conv3 – FC – FC trained with MSE to predict class proportions;
  conv1 by DPSGD(ε1) (per-sample gradients, Poisson sampling; ``grad_sample_mode=auto``:
  book-keeping ``bk``, which with gradient compression builds each example's gradient a
  few examples at a time to compress and clip it, and without it never builds them; the
  same update as Opacus' hooks in both cases, at 2× the non-private step with GC at the
  paper width (hooks: 4.3–4.7×) and memory bounded by the chunk, benchmarks/README.md);
  then C is thrown away except conv1, which D uses frozen (conv1* ← conv1).
- §5.2.2 [3.2], Algorithm 1 lines 7–17, Figure 5 [Fig. 2]: phase 2. Every batch: L_BCE on
  D with DPAGG(ε3) on the real batch and a fake batch of the same size; conv3*/FC* take a
  (non-private) gradient step; every μ-th batch conv2* takes one DPSGD(ε2) step on L'_BCE
  (D̃: AGG instead of DPAGG); every n_critic-th batch G takes a step on L''_BCE through
  D̂ (no aggregation, per sample), non-saturating −log D̂(G(z)), the batch's own fakes.
- §5.2 "The Design of DPAGG", Eq. (3) [Eq. (1)–(2)]: SIN (per-example, per-map
  standardisation, no learnable parameters, only right before DPAGG) and DPAGG = Σ SIN
  features + N(0, (σ3·√m·p)²) — ``dpagg.py``.
- §5.4 Theorem 5 [App. A.6 Thm 6]: the privacy record has three Poisson-subsampled
  Gaussian parts "conv1" (T1, γ1 = B/N, u), "conv2" (T2 = ⌊𝔹/μ⌋, γ2, u) and "dpagg"
  (T3 = 𝔹, γ3 = B/N, sensitivity √m·p); each noise multiplier (std / sensitivity) is
  calibrated for its share of ε, and the ledger composes them by RDP (PRV beside it) —
  ``budget.py``.
- §6.1 "Canonical Implementation": batch 24 (MNIST/FMNIST) / 64 (CelebA/FFHQ), z = 100,
  μ = 8, GC top 90% of each per-sample gradient (``compression.py``, §6.2.8 / Table 12),
  layer configurations C2-C1-× / C2-C2-C1 / C3-C1-× (Tables 8, 9, 14; App. A.10), two FC*
  layers, budget split notations (x1, ×, x3) and (x1%, x2%, x3%), canonical (0.1, ×, 0.1).
- App. A.5 "Choice of cGAN" / §5.3: conditional DCGAN; G is the reverse of D with the
  label (one-hot, through its own transposed convolution) joining at its second layer —
  ``nets.py``.

Privacy modes (``privacy_mode``). The paper's privacy argument has three gaps that make
a literal implementation's ε (as the paper accounts it, Theorem 5) not a valid (ε, δ)-DP
guarantee:

1. Phase 1 (App. A.6, Theorem 1 / Corollary 1): conv2, conv3 and FC of C are trained
   with plain SGD on the private data, and conv1's per-example gradients at later steps
   go through them. They are hidden state that depends on every example without noise,
   so one example can move every other example's conv1 gradient: per-example clipping no
   longer bounds the sensitivity of conv1's noisy sum.
2. C's MSE loss is on the *aggregated* batch (and its target is the batch's class
   proportions), and L'_BCE goes through AGG too: the "per-sample" gradient of one
   example depends on all the others in its batch (like BatchNorm), so clipping each one
   to u does not bound one example's influence by u.
3. conv2*'s step reuses the last μ DPAGG batches, so the two parts do not sample
   independently (Theorem 5 composes them as if they did); an example in two of the μ
   batches also contributes two clipped gradients.

``privacy_mode="sound"`` (default) keeps the design but closes the gaps, so the three
parts really are independent Poisson-subsampled Gaussian mechanisms and the recorded ε
holds:

- Phase 1: all of C is trained by DPSGD(ε1) (one clipped gradient per example over
  conv1, conv2, conv3 and FC; the extra layers are discarded, so ε1 still only pays for
  conv1's transfer), on the MSE between the predicted and true class proportions of a
  batch of one (AGG of a single example; the proportion is its one-hot label). This is
  the paper's objective at aggregation size 1.
- conv2*: the gradient of L'_BCE through AGG is ∂L/∂a · ∂a/∂fᵢ; the batch-dependent
  factor v = ∂BCE(head(a))/∂a is evaluated at the aggregate a that DPAGG *released* in
  this window (already private), so example i's gradient is ∇⟨SIN(conv2*(conv1(xᵢ), yᵢ)),
  v⟩ and depends on xᵢ alone. The real examples are a fresh Poisson sample with
  γ2 = μB/N (expected size μB, the batch conv2* "virtually" sees, §5.2.2), split at random
  into μ chunks paired with the window's μ released aggregates; the fakes are the
  window's μ fake batches at their own (equally noised) aggregates.

``privacy_mode="paper"`` runs Algorithm 1 literally (conv2/conv3/FC of C by plain Adam
on the batch-aggregate MSE; L'_BCE on D̃ with clean AGG over the last μ batches, Opacus'
per-sample gradients of that coupled loss; γ2 = 1 − (1 − B/N)^μ) for reproducing the
paper. Its recorded ε is the paper's accounting, NOT a DP guarantee; the runner warns
before training and records the caveat (``accounting_caveat``).

Departures from the paper, and ambiguities resolved (ours unless stated):

- Privacy: the "sound" mode above (default). Both modes calibrate the three parts
  with Opacus' RDP accountant for Poisson sampling (the paper cites Wang et al.'s bound for
  sampling without replacement, Theorem 3 / Eq. (5)); the ledger reports RDP and PRV.
- Budget: the split is read as shares of ε. Under one shared budget every method must
  spend it, so by default (``fill_budget=true``) all εk are scaled by one common factor
  until the RDP composition of the three parts reaches ε (≥ 99% of it). The paper's
  reading (§6.1) is additive: each part calibrated at (εk, δ) with Σεk = ε, whose
  composition is ≤ ε but well below it (0.816 at ε = 1 on digits); ``fill_budget=false``
  runs that reading (``budget.py`` proves it stays ≤ ε).
- ε1 = 0 is accepted (no phase 1, conv1 random N(0, 0.02) as in §6.2.4 / Table 4).
- DPAGG is also applied to the fake batch's aggregate (same noise), since it is a layer
  of D (§5.2.2): otherwise D could tell real from fake by the noise alone. The real one
  is the only privacy mechanism.
- AGG/DPAGG output is divided by the expected batch size B (a public constant): the paper
  does not say sum or mean; the mean keeps the aggregate on the scale of one example's
  features, which D̂ sees in G's step (§5.2 says D̂ is "D without DPAGG").
- SIN adds eps = 1e-8 inside its square root (the paper divides by σ, undefined for a
  constant map); each map's norm is then ≤ p, so Δ = √m·p still bounds the sensitivity.
- L_BCE on the aggregates: one logit for the real aggregate (target 1) and one for the
  fake aggregate (target 0) per batch; L'_BCE the same over the μ batches; the paper does
  not spell out the targets of an aggregate.
- C has no label input and predicts the batch's class proportions with a softmax; D's
  label embedding (``nn.Embedding``, ``label_dim`` = 16 by default, broadcast over the
  maps) joins at the input of conv2*, not at D's second layer as in cDCGAN (App. A.5),
  because with C2/C3 configurations D's second layer is inside the frozen, label-free
  conv1 (giving C the label would make the proportions trivially predictable from it,
  App. A.5's own remark).
- G's step (line 16, "each sample from the i-th batch") uses the i-th batch's own fakes,
  the ones whose aggregate D just saw; fake labels are uniform over the classes.
- Architecture details the paper leaves open: kernel 4 / stride 2 / padding 1 (kernel 3
  on odd sizes), channels d·2^l with d = 64 in ``paper`` presets, LeakyReLU(0.2) in D/C,
  LeakyReLU(0.2) and no BatchNorm in G (the cDCGAN G of Private GANs' code; DCGAN's
  BatchNorm + ReLU G collapses here, see below), N(0, 0.02) initialisation, FC* hidden width 128, native
  image sizes (MNIST 28, CelebA 64, FFHQ 128; ``image_size`` resizes if asked).
- Optimisers: the paper writes "SGD"/"DPSGD" without rates; we use Adam(β = (0.5, 0.999))
  — DP-Adam for the private parts — lr 2e-4 (GAN parts) and 1e-3 (C); clipping norm
  u1 = u2 = 1.0 (not given), each part's own on request (``max_grad_norm_conv1/2``). In sound
  mode conv2*'s per-example gradient carries the head's 1/B (v is the BCE's gradient at a mean
  of B rows), so its norms sit near 0.01–0.1 on mnist at B = 500: at u2 = 1 the noise is ~100×
  the mean update and G collapses to one image per class; mnist's ``long`` clips conv2* at
  0.02, its measured scale (benchmarks/presets.md, "dpaf", mnist). Scaling v by B instead
  would be the same Adam update with the clip at u2/B; a per-part bound leaves the
  sensitivity argument as it is.
- 𝔹 (number of batches) and n_critic are not given: ``paper`` presets use 𝔹 = 20,000 for
  both loops and n_critic = 1 (Table 16: the best n_critic at ε = 10 with μ = 8);
  Figure 5's μ = 8, n_critic = 3 is only an illustration.
- GC: top 90% over the whole per-sample gradient vector of the DP-trained module; for
  large n·d the per-example threshold is estimated from 4,096 sampled positions, as Deep
  Gradient Compression does (kept fraction 90% ± ~0.5%).
- Empty Poisson batches still take their (pure-noise) step.
- ``ema_decay`` (off unless set): the samples come from a bias-corrected exponential average
  of G's weights (``dpgen_bench/nets/averaging.py``), as dpgan's, gswgan's and dpdm's presets
  do; not in the paper. A function of G's iterates, so no privacy cost; D̂ stays the last iterate.
- ``quick`` preset (digits, CPU, not in the paper) and ``tiny`` preset (tests) shrink
  widths and steps and run fit with one intra-op thread (``torch_threads``); see
  ``core.py``.

Two departures were found by experiment (``benchmarks/dpaf_collapse.py`` trains DPAF's own
networks as a plain non-private GAN and switches one element of DPAF at a time; the runs:
benchmarks/presets.md, "DPAF's collapse, located" and "DPAF's discriminator settings"):

1. **The generator.** The paper leaves G open ("cDCGAN", the reverse of D). DCGAN's textbook
   G (BatchNorm + ReLU, a learned label embedding: ``g_activation=relu g_batchnorm=true
   g_label=embedding``) ignores z even against a per-example D that learns, and draws one
   image per class; the cDCGAN G of ``dpgen_bench.nets.dcgan`` (LeakyReLU, no BatchNorm,
   one-hot labels through their own transposed convolution) keeps z and is
   ``nets.Generator``'s default.
2. **Phase 2's discriminator.** It trains only conv2* and the head, on top of the frozen,
   transferred conv1, and the head sees one aggregate per side and step. With μ = 8, one
   head step per G step and learning rates 2e-4 its loss stays at ln 4 (chance), and a
   discriminator at chance hands every sample of a class nearly the same image gradient, so
   G's samples collapse to one per class even without noise. The mnist-5k ``quick`` preset
   gives D more per G step: conv2* every batch (μ = 1), three batches per G step
   (n_critic = 3, the value of the paper's Figure 5; Table 16 ablates it) and learning rates
   1e-3; without noise that closes the gap to a non-private GAN of its size. On digits the
   same settings collapse instead (at 16×16 with N = 1,437 the balance lies elsewhere), and
   the digits preset keeps its own. With the noise on, the pipeline stays at chance on
   mnist-5k far beyond ε = 10.

On digits the ``quick`` preset departs from the canonical split (see its comment and
benchmarks/presets.md): at N = 1,437 the split (0.1, ×, 0.1), made for N = 60,000, leaves
DPAGG's aggregates mostly noise.

The runs behind the presets, on digits, mnist-5k and full MNIST: benchmarks/presets.md, "dpaf".
"""

from .core import DPAF, DPAFHparams

__all__ = ["DPAF", "DPAFHparams"]
