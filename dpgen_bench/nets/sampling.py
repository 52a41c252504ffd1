"""Drawing samples from a conditional generator ``G(z, y)`` in memory-bounded chunks, and
the generator as a differentiable function of its latent input (membership attacks, audit)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

CHUNK = 1024


@torch.no_grad()
def sample_conditional(G: nn.Module, n: int, labels: Tensor | None, num_classes: int, latent_dim: int,
                       rng: torch.Generator, chunk: int = CHUNK) -> tuple[Tensor, Tensor]:
    """``n`` images of ``G`` on the CPU in eval mode, clamped to [-1, 1], and their labels
    (``labels``, or uniform ones drawn from ``rng``); z ~ N(0, I) from ``rng``, drawn
    before the chunks so that the result does not depend on ``chunk``."""
    if labels is None:
        labels = torch.randint(0, num_classes, (n,), generator=rng)
    labels = labels.long().cpu()
    z = torch.randn(n, latent_dim, generator=rng)
    G = G.cpu().eval()
    out = [G(z[i:i + chunk], labels[i:i + chunk]) for i in range(0, n, chunk)]
    images = torch.cat(out) if out else torch.zeros(0)
    return images.clamp(-1, 1).float(), labels


def generate_conditional(G: nn.Module, z: Tensor, labels: Tensor | None, name: str) -> Tensor:
    """``G(z, labels)`` on the CPU in eval mode, differentiable in ``z`` (``Method.generate``
    of a conditional method)."""
    if labels is None:
        raise ValueError(f"'{name}' is conditional: labels are required")
    return G.cpu().eval()(z, labels.long())
