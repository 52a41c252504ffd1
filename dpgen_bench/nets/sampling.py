"""Drawing samples from a conditional generator ``G(z, y)`` in memory-bounded chunks, the
generator as a differentiable function of its latent input (membership attacks, audit), and
:class:`ConditionalSampling`, the three methods every such method would otherwise repeat."""

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


class ConditionalSampling:
    """``sample``, ``latent_dim`` and ``generate`` of a method whose generator is a
    conditional ``G(z, y)`` (``self.G``, or what :meth:`sampling_generator` returns) with
    latent size ``hparams.latent_dim``. Put it before ``Method`` among the bases."""

    def sampling_generator(self) -> nn.Module:
        return self.G

    def sample(self, n: int, labels: Tensor | None, rng: torch.Generator):
        return sample_conditional(self.sampling_generator(), n, labels, self.info.num_classes,
                                  self.hparams.latent_dim, rng)

    @property
    def latent_dim(self) -> int:
        return self.hparams.latent_dim

    def generate(self, z: Tensor, labels: Tensor | None) -> Tensor:
        return generate_conditional(self.sampling_generator(), z, labels, self.name)
