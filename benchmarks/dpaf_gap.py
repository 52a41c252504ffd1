"""What DPAF's discriminator can still tell apart at the end of a run (why dpaf without noise
stays below a GAN of its size): from finished run directories (``bench run --method dpaf ... [--noise-off]``), the
AUC with which

- D (conv1*, conv2*, SIN, then the head on the *mean of B examples' features*, the input
  the head is trained on) separates 200 real batch means from 200 generated ones, and
- D̂ (the same head on *one example's features*, what G's step reads in the paper)
  separates 1,000 real training images from 1,000 generated ones,

how alike the image gradients of G's loss are at different real images of one class
(``gradient_alignment``: the discriminator's direction field; runs of ``gan`` / ``dpgan``
get this and the spread only, for comparison), plus the mean logits, the feature norms of
one example and of a batch mean, and the within-class spread of the samples against the
real images' (``within_class_std``: per class, the pixel-wise standard deviation over that
class's images, averaged over pixels and classes; a generator that draws one image per
class whatever z scores ≈ 0).

    .venv/bin/python benchmarks/dpaf_gap.py RUN_DIR [RUN_DIR ...]   # one JSON line per run
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch
from sklearn.metrics import roc_auc_score

from dpgen_bench import registry, runner
from dpgen_bench.api import DataInfo
from dpgen_bench.data import load_dataset


def within_class_std(images: np.ndarray, labels: np.ndarray) -> float:
    """Mean over classes of the pixel-wise std of the class's images (pixels in [-1, 1])."""
    x = images.reshape(len(images), -1).astype(np.float64)
    return float(np.mean([x[labels == c].std(axis=0).mean() for c in np.unique(labels)]))


def gradient_alignment(score, images: torch.Tensor, labels: torch.Tensor, n: int = 64, seed: int = 0) -> float:
    """Mean over classes of the mean pairwise cosine between the image gradients of G's loss
    −log σ(score(x, y)) at n images x of that class. At *real* images it measures the
    discriminator's direction field itself: near 1, it pushes every image of a class the
    same way, so a generator it trains has no reason to keep z apart (it collapses to one
    image per class); a working D gives different images different directions."""
    g = torch.Generator().manual_seed(seed)
    cos = []
    for c in labels.unique():
        idx = (labels == c).nonzero().flatten()
        idx = idx[torch.randperm(len(idx), generator=g)[:n]]
        x, y = images[idx].clone(), labels[idx]
        with torch.enable_grad():
            x.requires_grad_(True)
            (gx,) = torch.autograd.grad(torch.nn.functional.softplus(-score(x, y).flatten()).sum(), x)
        u = torch.nn.functional.normalize(gx.flatten(1), dim=1)
        sim = u @ u.T
        k = len(idx)
        cos.append(((sim.sum() - sim.diagonal().sum()) / (k * (k - 1))).item())
    return float(np.mean(cos))


def _spreads(data, samples) -> list[float]:
    """Within-class spread of the whole real training split and of every sample."""
    return [round(within_class_std(data.train.images.numpy(), data.train.labels.numpy()), 3),
            round(within_class_std(samples["images"], samples["labels"]), 3)]


def _auc(pos: torch.Tensor, neg: torch.Tensor) -> float:
    y = np.r_[np.ones(len(pos)), np.zeros(len(neg))]
    return float(roc_auc_score(y, np.r_[pos.numpy(), neg.numpy()]))


@torch.no_grad()
def inspect(run_dir: Path, n: int = 1000, batches: int = 200) -> dict:
    cfg = runner.recorded_config(run_dir)
    data = load_dataset(cfg.dataset, cfg.eval_split)
    cls = registry.methods.get(cfg.method)
    m = runner.build_method(cfg, cls, DataInfo(data.name, data.image_shape, data.num_classes, len(data.train)))
    m.load_state_dict(torch.load(run_dir / "checkpoint.pt", weights_only=True, map_location="cpu"))
    s = np.load(run_dir / "samples.npz")
    if cfg.method != "dpaf":  # a GAN of dpgen_bench.nets.dcgan (gan, dpgan): its D and G only
        m.D.eval()
        return {"run": run_dir.name, "method": cfg.method, "noise_off": bool(cfg.noise_off), "seed": cfg.seed,
                "D_gradient_alignment_real": round(gradient_alignment(m.D, data.train.images, data.train.labels), 3),
                "within_class_std_real_fake": _spreads(data, s)}
    # a seeded random n of each: mnist-5k's splits are sorted by class, so a prefix of its
    # training split would be three classes only (fixed 2026-11-26; digits is shuffled)
    rng = np.random.default_rng(0)
    ir = torch.from_numpy(rng.choice(len(data.train), size=min(n, len(data.train)), replace=False))
    jf = rng.choice(len(s["labels"]), size=min(n, len(s["labels"])), replace=False)
    xr, yr = data.train.images[ir], data.train.labels[ir]
    xf, yf = torch.from_numpy(s["images"][jf]), torch.from_numpy(s["labels"][jf])
    fr, ff = m._features(m._resize(xr, m.train_shape[1]), yr).flatten(1), m._features(
        m._resize(xf, m.train_shape[1]), yf).flatten(1)
    single_r, single_f = m.head(fr).flatten(), m.head(ff).flatten()
    b = m.hparams.batch_size
    g = torch.Generator().manual_seed(0)

    def means(f: torch.Tensor) -> torch.Tensor:
        idx = torch.stack([torch.randperm(len(f), generator=g)[:b] for _ in range(batches)])
        return m._head_agg(f[idx].sum(1)).flatten()

    agg_r, agg_f = means(fr), means(ff)
    return {"run": run_dir.name, "noise_off": bool(cfg.noise_off), "seed": cfg.seed,
            "mu": cfg.hparams["mu"], "g_loss": cfg.hparams.get("g_loss", "per_example"),
            "D_batch_mean_auc": round(_auc(agg_r, agg_f), 3), "Dhat_single_auc": round(_auc(single_r, single_f), 3),
            "D_logit_mean_real_fake": [round(agg_r.mean().item(), 3), round(agg_f.mean().item(), 3)],
            "Dhat_logit_mean_real_fake": [round(single_r.mean().item(), 3), round(single_f.mean().item(), 3)],
            "Dhat_logit_std": round(torch.cat([single_r, single_f]).std().item(), 3),
            "feature_norm_one_example": round(fr.norm(dim=1).mean().item(), 2),
            "feature_norm_batch_mean": round(fr[:b].mean(0).norm().item(), 2),
            # the direction field G's step reads (D̂ per example), at real images of each class
            "D_gradient_alignment_real": round(gradient_alignment(
                lambda x, y: m.head(m._features(x, y)), m._resize(data.train.images, m.train_shape[1]),
                data.train.labels), 3),
            "within_class_std_real_fake": _spreads(data, s)}


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="finished run directories (one JSON line each)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    for d in args.run_dirs:
        if not (Path(d) / "config.json").is_file():
            parser.error(f"{d}: not a run directory (no config.json)")
        print(json.dumps(inspect(Path(d))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
