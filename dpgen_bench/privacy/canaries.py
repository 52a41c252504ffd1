"""White-box gradient canaries for a DPSGD part (one-run auditing of the released sums).

Steinke, Nasr, Jagielski, *Privacy Auditing with One (1) Training Run* (NeurIPS 2023), the
white-box setting, with the Dirac canaries of Nasr et al. (*Tight Auditing of Differentially
Private Machine Learning*, USENIX Security 2023): ``m`` canaries, canary j a gradient
``C·e_{i_j}`` on its own coordinate ``i_j`` of the part's flattened parameters (distinct
coordinates, chosen at random), each included in the run with probability 1/2 and, when
included, Poisson-sampled at the part's planned rate at every step, like any record. A
sampled canary's gradient (norm exactly C, so clipping leaves it alone) is added to the
part's clipped sum *inside its own DP optimizer*, right before the optimizer adds the noise,
so the noise, its multiplier and its generator are the part's own. The score of canary j is
``Σ_t s_t[i_j]``, the sum over steps of the released noisy clipped sums ``s_t`` at its
coordinate: the parameters are a post-processing of the ``s_t``, so an adversary of the DP
guarantee may see every one of them. Scores go to ``privacy.audit.best_one_run_bound``.

The real examples' gradients on the canaries' coordinates act as extra noise on the scores
(they make the bound smaller, never unsound). What this audit observes: the part's noise
(multiplier, clipping norm, generator) and its step count; what it cannot see: a bug in the
method's own sampling of real records, which ``tests/integration/test_loops_follow_plan.py``
checks instead.
"""

from __future__ import annotations

import numpy as np
import torch


class DiracCanaries:
    """Attach ``m`` Dirac canaries to the DP optimizer ``dp_opt`` (an Opacus ``DPOptimizer``
    or ``DPOptimizerFastGradientClipping``) of a part sampled at ``sample_rate``."""

    def __init__(self, dp_opt, m: int, sample_rate: float, seed: int):
        params = list(dp_opt.params)
        sizes = [p.numel() for p in params]
        total = sum(sizes)
        if not 2 <= m <= total:
            raise ValueError(f"{m} Dirac canaries need as many distinct coordinates; the part has {total}")
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
        sampled = torch.as_tensor(self.included) & (torch.rand(len(self.included), generator=self._gen)
                                                    < self.sample_rate)
        for p, pos, idx in self._blocks:
            add = sampled[idx].to(p.summed_grad.dtype).to(p.device) * self.clip
            p.summed_grad.view(-1).index_add_(0, pos, add)
        self._add_noise()  # the part's own noise on the sum, canaries included
        for p, pos, idx in self._blocks:
            self.scores[idx.numpy()] += p.grad.detach().reshape(-1)[pos].double().cpu().numpy()
        self.steps += 1

    def detach(self) -> None:
        self._opt.add_noise = self._add_noise
