"""gen2real: train a classifier on the labelled synthetic set, test it on the real test
split (Private GANs §4.1 "Evaluation"; DP-GAN-DPAC §5).

Classifier (CNN): the Private GANs authors' ``eval/acc.py`` network — conv 3×3 (32) →
ReLU → conv 3×3 (64) → ReLU → max-pool 2 → dropout 0.25 → FC 128 → ReLU → dropout 0.5
→ FC; Adam(1e-3), batch 64, 10 epochs. As in their code, the epoch is chosen on a
held-out slice of the *synthetic* data (10% here; 5,000 images there), never on the real
test split.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from dpgen_bench.api import EvalInput, Evaluator


class CNN(nn.Module):
    def __init__(self, image_shape: tuple[int, int, int], num_classes: int):
        super().__init__()
        c, h, w = image_shape
        self.features = nn.Sequential(
            nn.Conv2d(c, 32, 3), nn.ReLU(), nn.Conv2d(32, 64, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Dropout(0.25),
            nn.Flatten(),
        )
        flat = 64 * ((h - 4) // 2) * ((w - 4) // 2)
        self.head = nn.Sequential(nn.Linear(flat, 128), nn.ReLU(), nn.Dropout(0.5), nn.Linear(128, num_classes))

    def forward(self, x):
        return self.head(self.features(x))


@torch.no_grad()
def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int = 512) -> float:
    model.eval()
    correct = sum((model(x[i:i + batch]).argmax(1) == y[i:i + batch]).sum().item() for i in range(0, len(x), batch))
    return correct / max(1, len(x))


def train_classifier(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, seed: int, epochs: int = 10,
                     batch_size: int = 64, lr: float = 1e-3, holdout: float = 0.1) -> tuple[nn.Module, dict]:
    """Train with Adam; keep the epoch with the best accuracy on a held-out slice of the
    training data itself."""
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(len(x), generator=g)
    n_hold = max(1, int(len(x) * holdout))
    hold, fit = perm[:n_hold], perm[n_hold:]
    torch.manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    best, best_acc, best_epoch = copy.deepcopy(model.state_dict()), -1.0, 0
    for epoch in range(1, epochs + 1):
        model.train()
        order = fit[torch.randperm(len(fit), generator=g)]
        for i in range(0, len(order), batch_size):
            idx = order[i:i + batch_size]
            loss = F.cross_entropy(model(x[idx]), y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        acc = accuracy(model, x[hold], y[hold])
        if acc > best_acc:
            best, best_acc, best_epoch = copy.deepcopy(model.state_dict()), acc, epoch
    model.load_state_dict(best)
    return model, {"epochs": epochs, "selected_epoch": best_epoch, "holdout_accuracy": best_acc,
                   "batch_size": batch_size, "lr": lr, "n_train": len(fit), "n_holdout": n_hold}


class Gen2RealCNN(Evaluator):
    """Accuracy on the real test split of a CNN trained on the synthetic set."""

    name = "gen2real_cnn"
    higher_is_better = True

    def evaluate(self, run: EvalInput) -> dict[str, Any]:
        if run.labels is None:  # not applicable, never 0
            return {"metrics": {}, "protocol": {"skipped": "unconditional generator"}}
        data = run.data
        model = CNN(data.image_shape, data.num_classes)
        model, proto = train_classifier(model, run.images, run.labels, seed=run.seed)
        acc = accuracy(model, data.test.images.cpu(), data.test.labels.cpu())
        proto.update({"classifier": "cnn (Private GANs acc.py)", "train_on": "synthetic", "test_on": "real test",
                      "n_test": len(data.test)})
        return {"metrics": {self.name: acc}, "protocol": proto}
