"""White-box gradient canaries inside a private part's own release (one-run auditing of the
released noisy sums): ``DiracCanaries`` for a DPSGD part's optimizer, ``SanitizerCanaries``
for a gradient sanitiser (GS-WGAN, DP-GAN-DPAC, DP-Sinkhorn), ``GradientAudit`` to attach
them to every part a run announces (``RunContext.watch``) and score them afterwards.

Steinke, Nasr, Jagielski, *Privacy Auditing with One (1) Training Run* (NeurIPS 2023), the
white-box setting, with the Dirac canaries of Nasr et al. (*Tight Auditing of Differentially
Private Machine Learning*, USENIX Security 2023): ``m`` canaries, canary j a gradient
``C·e_{i_j}`` on its own coordinate ``i_j`` of the part's flattened parameters (distinct
coordinates, chosen at random), each included in the run with probability 1/2 and, when
included, Poisson-sampled at the part's planned rate at every step, like any record. A
sampled canary's gradient (norm exactly C, so clipping leaves it alone) is added to the
part's clipped sum *inside its own DP optimizer*, right before the optimizer adds the noise,
so the noise, its multiplier and its generator are the part's own. Canary j's gradient at
step t is ``ξ_{j,t}·C·e_{i_j}`` with a fresh fair sign ξ_{j,t} = ±1 known to the auditor (a
record's gradient may change from step to step; its norm is still C), and its score is
``Σ_t ξ_{j,t}·s_t[i_j]``, the signed sum over steps of the released noisy clipped sums
``s_t`` at its coordinate. The signs matter: the real records' gradients at a coordinate
drift in one direction for hundreds of steps (a GAN discriminator's), and an unsigned sum
adds that drift to every canary's score (σ/4 went unnoticed on dpgan's D without them,
AUC 0.53); signed, it averages out. The parameters are a post-processing of the ``s_t``,
so an adversary of the DP guarantee may see every one of them. Scores go to
``privacy.audit_bounds.best_one_run_bound``.

The real examples' gradients on the canaries' coordinates act as extra noise on the scores
(they make the bound smaller, never unsound): with the signs, their variance Σ_t r_t[i]²
instead of the drift (Σ_t r_t[i])². What this audit observes: the part's noise
(multiplier, clipping norm, generator) and its number of releases; what it cannot see: the
clipping of the real records (canaries enter after it: ``tests/unit/test_fastclip.py``
checks every rule against per-example autograd) and the method's own sampling of real records
(``tests/integration/test_loops_follow_plan.py`` spies on it).

A gradient sanitiser releases ``clip(g) + N(0, (σ_hook·C)²)`` for the whole generated batch
``g`` (B rows). A record's worst-case effect is what its clip geometry allows, never what its
noise code says (so a wrong noise multiplier cannot hide itself by shrinking the canaries):
row-wise clipping (``GradientSanitizer``, ``clip_geometry = "rows"``) lets one record move
every row by ≤ 2C (norm 2C·√B), one clip of the whole tensor (DP-Sinkhorn's
``BatchGradientSanitizer``, ``"whole"``) by ≤ 2C. Canary j is such a worst-case change on
its own coordinate(s) (``SanitizerCanaries``: mutually orthogonal, so canaries add no noise
to each other's scores); it is added to the clipped batch before the sanitiser's own noise
whenever it is sampled (included with probability 1/2, then Poisson at the part's planned
rate at every release), and its score is the inner product of its direction with the sum of
the released (noisy, unscaled) batches.

GS-WGAN and DP-GAN-DPAC (rate 1/K: a record's subset d_k is drawn at ~T/K of the T steps,
and then all B rows of the release may move, 2C each) score by the likelihood ratio instead
(``canaries_score = "mixture"`` on the sanitiser, ``mixture_log_ratio``): Σ_t log(1 − q +
q·exp(μz_t − μ²/2)), z_t the release's projection on the canary's direction in noise units,
μ = 2C√B / (noise std), the most powerful test of one canary that does not see which steps
drew it; the plain sum adds the noise of the T − T/K steps without a draw to the ~T/K with
one. Each canary's draw is its own coin (a subset of its own), not the loop's k: given the
other canaries, a canary's view is then exactly the extremal pair of docs/privacy.md (every
D_k sends U, the record's sends −U: the Poisson-subsampled Gaussian of multiplier
σ_hook/(2√B)) plus the others' shifts, drawn independently of it; canaries sharing the loop's
draw would fire together, and one would tell the auditor when another was drawn
(docs/auditing.md, "GS-WGAN's per-row accounting, rejected").
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..errors import UserError


def _sampled(included: np.ndarray, rate: float, gen: torch.Generator) -> torch.Tensor:
    """This step's sampled canaries: included in the run, then Poisson at the part's rate."""
    return torch.as_tensor(included) & (torch.rand(len(included), generator=gen) < rate)


def _signs(m: int, gen: torch.Generator) -> torch.Tensor:
    """This step's sign of each canary (±1, fair, fresh every step; float64)."""
    return torch.randint(0, 2, (m,), generator=gen).to(torch.float64) * 2 - 1


_PHI_INV_3_4 = 0.6744897501960817  # Φ⁻¹(3/4): the median of |N(0, 1)|


def mixture_log_ratio(proj: np.ndarray, shift: np.ndarray, rate: float) -> np.ndarray:
    """One release's log likelihood ratio per canary of "in the run: its shift, drawn with
    probability ``rate``" against "not in the run", for Gaussian noise:
    log(1 − q + q·exp(μz − μ²/2)), z = ``proj`` / s (``proj``: the release's signed projection on
    the canary's unit direction; s: the noise std, estimated from the release itself as the
    median |proj| over all canaries / Φ⁻¹(3/4), never read from the noise code), μ = ``shift`` / s
    (``shift``: the norm of the canary's change). Summed over releases it is the score of the
    most powerful test of one canary that does not see when it was drawn."""
    s = max(float(np.median(np.abs(proj))) / _PHI_INV_3_4, 1e-12 * float(np.max(shift)))
    mu, z = shift / s, proj / s
    stay = math.log1p(-rate) if rate < 1 else -math.inf
    return np.logaddexp(stay, math.log(rate) + mu * z - mu ** 2 / 2)


class DiracCanaries:
    """Attach ``m`` Dirac canaries to the DP optimizer ``dp_opt`` (an Opacus ``DPOptimizer``
    or ``DPOptimizerFastGradientClipping``) of a part sampled at ``sample_rate``."""

    too_small = False  # a DPSGD part always has room (too many canaries is an error instead)

    def __init__(self, dp_opt, m: int, sample_rate: float, seed: int):
        params = list(dp_opt.params)
        sizes = [p.numel() for p in params]
        total = sum(sizes)
        if not 2 <= m <= total:
            raise UserError(f"--canaries {m}: Dirac canaries need as many distinct coordinates, and this part has "
                            f"{total} parameters; use --canaries ≤ {total}")
        rng = np.random.default_rng([seed, 0xD1AC])
        coords = np.sort(rng.choice(total, size=m, replace=False))
        self.included = rng.random(m) < 0.5
        self.sample_rate = float(sample_rate)
        self.clip = float(dp_opt.max_grad_norm)
        self.scores = np.zeros(m)
        self.steps = 0
        self._gen = torch.Generator().manual_seed(int(rng.integers(2**62)))
        offsets = np.cumsum([0] + sizes)
        # per parameter: (parameter, positions in its flat view, canary indices)
        self._blocks = []
        for k, p in enumerate(params):
            sel = np.flatnonzero((coords >= offsets[k]) & (coords < offsets[k + 1]))
            if len(sel):
                pos = torch.as_tensor(coords[sel] - offsets[k], device=p.device)
                self._blocks.append((p, pos, torch.as_tensor(sel)))
        self._opt = dp_opt
        self._add_noise = dp_opt.add_noise
        dp_opt.add_noise = self._add_noise_with_canaries

    def _add_noise_with_canaries(self) -> None:
        sampled = _sampled(self.included, self.sample_rate, self._gen)
        sign = _signs(len(self.included), self._gen)
        for p, pos, idx in self._blocks:
            add = (sampled[idx].to(torch.float64) * sign[idx] * self.clip).to(p.summed_grad.dtype).to(p.device)
            p.summed_grad.view(-1).index_add_(0, pos, add)
        self._add_noise()  # the part's own noise on the sum, canaries included
        for p, pos, idx in self._blocks:
            self.scores[idx.numpy()] += (sign[idx] * p.grad.detach().reshape(-1)[pos].double().cpu()).numpy()
        self.steps += 1

    def detach(self) -> None:
        self._opt.add_noise = self._add_noise


class SanitizerCanaries:
    """Attach ``m`` canaries to a ``GradientSanitizer`` of a part sampled at ``sample_rate``
    (the sanitiser calls ``before_noise`` and ``after_noise``). The canaries' directions are
    mutually orthogonal (no cross-talk between canaries) and each is a worst-case change of
    the clipped batch for the sanitiser's ``clip_geometry``:

    - ``"whole"`` (one clip of the whole tensor, any two clipped tensors ≤ 2C apart): canary j
      is 2C on its own coordinate of the flattened batch;
    - ``"rows"`` (each row clipped, every row of one record's batch may move by 2C): canary j
      is ±2C on its own coordinate c_j *in every row*, norm 2C·√B. With more canaries than
      coordinates, canaries sharing a coordinate take different rows of a Hadamard matrix as
      their signs (on the first P = 2^⌊log₂ B⌋ rows, norm 2C·√P), which keeps them orthogonal.

    Scores (the sanitiser's ``canaries_score``): "sum", Σ over releases of the signed
    projection; "mixture", Σ of each release's log likelihood ratio (``mixture_log_ratio``),
    the signed sum kept beside it in ``signed_sums``.
    """

    def __init__(self, sanitizer, m: int, sample_rate: float, seed: int):
        if m < 2:
            raise ValueError("need at least 2 canaries")
        self.geometry = sanitizer.clip_geometry
        if self.geometry not in ("rows", "whole"):
            raise ValueError(f"unknown clip geometry {self.geometry!r}")
        rng = np.random.default_rng([seed, 0x5A17])
        self.included = rng.random(m) < 0.5
        self.sample_rate = float(sample_rate)
        # the per-row (rows) or total (whole) change: 2C for a clipped gradient, the sensitivity
        # Δ for a release of a sum (privacy.release.GaussianRelease)
        self.shift = float(sanitizer.canary_shift)
        self.fit_to_size = bool(sanitizer.canaries_fit_to_size)
        # a release of a sum over the dataset: the adversary of the DP definition knows every
        # other record, hence the sum without the canaries, and scores the released value
        # minus it (else the data's own sums, ≫ Δ, drown a single observation)
        self.subtract_clean = bool(sanitizer.canaries_subtract_clean)
        # "sum": Σ_t ⟨direction / 2C, release_t⟩ (signed); "mixture": Σ_t of the per-release log
        # likelihood ratio (``mixture_log_ratio``), for a part whose records are drawn rarely
        # (GS-WGAN's 1/K: the sum lets the T − T/K releases without a draw drown the draws)
        self.score_kind = getattr(sanitizer, "canaries_score", "sum")
        if self.score_kind not in ("sum", "mixture"):
            raise ValueError(f"unknown canary score {self.score_kind!r}")
        self.signed_sums = np.zeros(m)  # the "sum" score, kept beside a "mixture" one (a diagnostic)
        self._clean = None
        self.too_small = False  # a release of one coordinate: no audit of it (GradientAudit drops it)
        self.scores = np.zeros(m)
        self.steps = 0
        self._rng = rng
        self._gen = torch.Generator().manual_seed(int(rng.integers(2**62)))
        self._shape: tuple[int, ...] | None = None
        self._sanitizer = sanitizer
        sanitizer.canaries = self

    def _layout(self, like: torch.Tensor) -> None:
        m = len(self.included)
        if self._shape is not None:
            if tuple(like.shape) != self._shape:
                raise ValueError(f"the sanitised batch changed shape ({self._shape} → {tuple(like.shape)}): "
                                 "the canaries need a fixed batch")
            return
        self._shape = tuple(like.shape)
        if self.geometry == "whole":
            if m > like.numel() and self.fit_to_size:  # one canary per coordinate, the first draws kept
                self.included, self.scores = self.included[:like.numel()], self.scores[:like.numel()]
                self.signed_sums = self.signed_sums[:like.numel()]
                m = like.numel()
            if m > like.numel():
                raise UserError(f"--canaries {m}: the sanitised batch has {like.numel()} coordinates; use "
                                f"--canaries ≤ {like.numel()}")
            self._coords = torch.as_tensor(self._rng.choice(like.numel(), size=m, replace=False))
            return
        rows, dim = like.shape[0], like[0].numel()
        if m <= dim:  # one canary per coordinate, every row +2C: the full worst case
            self._coords = torch.as_tensor(self._rng.choice(dim, size=m, replace=False))
            self._row_signs = torch.ones(m, rows)
            return
        from scipy.linalg import hadamard

        p = 1 << (rows.bit_length() - 1)  # rows of a Hadamard matrix on the first P rows
        if m > dim * p:
            raise UserError(f"--canaries {m}: at most {dim * p} orthogonal canaries fit this sanitised batch "
                            f"({dim} coordinates × {p} sign patterns); use --canaries ≤ {dim * p}")
        slots = self._rng.choice(dim * p, size=m, replace=False)
        self._coords = torch.as_tensor(slots // p)
        signs = torch.zeros(m, rows)
        signs[:, :p] = torch.as_tensor(hadamard(p), dtype=torch.float32)[torch.as_tensor(slots % p)]
        self._row_signs = signs

    def before_noise(self, clipped: torch.Tensor) -> torch.Tensor:
        if self.fit_to_size and clipped.numel() < 2:
            self.too_small = True
        if self.too_small:
            return clipped
        self._layout(clipped)
        if self.subtract_clean:
            self._clean = clipped.detach().clone()
        sampled = _sampled(self.included, self.sample_rate, self._gen)
        self._sign = _signs(len(self.included), self._gen)
        w = (sampled.to(torch.float64) * self._sign * self.shift).to(clipped.dtype).to(clipped.device)
        out = clipped.clone()
        if self.geometry == "whole":
            out.view(-1).index_add_(0, self._coords.to(out.device), w)
        else:
            flat = out.view(len(out), -1)  # (B, d): add Σ_j w_j · sign_j(row) at column c_j
            flat.index_add_(1, self._coords.to(out.device), (self._row_signs.to(out.device) * w[:, None]).T.to(out.dtype))
        return out

    def after_noise(self, released: torch.Tensor) -> None:
        """``released``: the clipped batch with the canaries and the noise, before any scale.
        Score of canary j: ⟨its direction / 2C, released⟩ ("sum"), or the log likelihood ratio
        of that projection ("mixture")."""
        if self.too_small:
            return
        r = released.detach().double().cpu()
        if self._clean is not None:
            r = r - self._clean.double().cpu()
        if self.geometry == "whole":
            step = (self._sign * r.reshape(-1)[self._coords]).numpy()
        else:
            if getattr(self, "_signs64", None) is None:  # the row signs in float64, and their norms
                self._signs64 = self._row_signs.double()
                self._sign_norms = self._signs64.norm(dim=1).numpy()
            cols = r.reshape(len(r), -1)[:, self._coords]  # (B, m)
            step = (self._sign * (self._signs64 * cols.T).sum(1)).numpy()
        self.signed_sums += step
        if self.score_kind == "sum":
            self.scores += step
        else:  # ‖direction‖ = shift · ‖row signs‖ (rows) or shift (whole)
            rows = np.ones(len(step)) if self.geometry == "whole" else self._sign_norms
            self.scores += mixture_log_ratio(step / rows, self.shift * rows, self.sample_rate)
        self.steps += 1

    def directions(self) -> torch.Tensor:
        """Every canary's change of the clipped batch, (m, *batch shape) (for tests)."""
        out = torch.zeros(len(self.included), *self._shape, dtype=torch.float64)
        flat = out.view(len(out), -1) if self.geometry == "whole" else out.view(len(out), self._shape[0], -1)
        for j in range(len(out)):
            if self.geometry == "whole":
                flat[j, self._coords[j]] = self.shift
            else:
                flat[j, :, self._coords[j]] = self._row_signs[j].double() * self.shift
        return out

    def detach(self) -> None:
        self._sanitizer.canaries = None


class GradientAudit:
    """``m`` gradient canaries in every private part a run announces with
    ``RunContext.watch(part, mechanism)``: a DP optimizer (``make_private`` announces each)
    gets ``DiracCanaries``, a gradient sanitiser ``SanitizerCanaries``; each part its own
    canaries (own coordinates or directions, own inclusion draw), so each part's bound is a
    bound on that part alone."""

    def __init__(self, m: int, seed: int):
        self.m, self.seed = int(m), int(seed)
        self.parts: dict[str, DiracCanaries | SanitizerCanaries] = {}

    def watch(self, name: str, part, mechanism) -> None:
        from .release import GaussianRelease
        from .sanitizer import GradientSanitizer

        if name in self.parts:
            raise ValueError(f"part '{name}' was announced twice")
        seed = self.seed * 7919 + len(self.parts)
        if isinstance(mechanism, GradientSanitizer | GaussianRelease):
            self.parts[name] = SanitizerCanaries(mechanism, self.m, part.sample_rate, seed)
        elif hasattr(mechanism, "add_noise") and hasattr(mechanism, "max_grad_norm"):
            self.parts[name] = DiracCanaries(mechanism, self.m, part.sample_rate, seed)
        else:
            raise TypeError(f"cannot place gradient canaries in {type(mechanism).__name__} (part '{name}')")
