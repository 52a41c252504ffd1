"""``grid.png``: a run's samples as a labelled grid."""

from __future__ import annotations

from pathlib import Path

import torch

from . import store


def save_grid(images: torch.Tensor, labels: torch.Tensor, class_names, path: Path, per_class: int = 10) -> None:
    """A labelled grid: one row per class, ``per_class`` samples each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from torchvision.utils import make_grid

    rows, names = [], []
    for c, name in enumerate(class_names):
        sel = images[labels == c][:per_class]
        if len(sel):
            pad = per_class - len(sel)
            if pad:
                sel = torch.cat([sel, -torch.ones(pad, *sel.shape[1:])])
            rows.append(sel)
            names.append(name)
    grid = make_grid(torch.cat(rows), nrow=per_class, normalize=True, value_range=(-1, 1), padding=2)
    fig, ax = plt.subplots(figsize=(per_class * 0.6 + 1, len(rows) * 0.6 + 0.3))
    ax.imshow(grid.permute(1, 2, 0).numpy(), interpolation="nearest")
    step = grid.shape[1] / len(rows)
    ax.set_yticks([step * (i + 0.5) for i in range(len(rows))], names)
    ax.set_xticks([])
    fig.tight_layout()
    with store.atomic_open(path) as f:
        fig.savefig(f, format="png", dpi=100)
    plt.close(fig)
