"""Why DPAF's generator draws one image per class without noise: DPAF's own
networks (``methods/dpaf/nets.py``) trained as a plain, non-private conditional GAN, with
one element of DPAF's design switched at a time, and the samples' within-class spread
(``dpaf_gap.within_class_std``; a generator that ignores z scores ≈ 0, the real images
0.31 on mnist-5k, 0.25 on digits).

Every step: D's loss on B real and B fake images, then G's non-saturating loss on D̂ (D's
head on each fake's features, as Algorithm 1 line 16). ``--agg`` trains D's head on the
*mean* of the batch's SIN features (one real and one fake input per step, DPAF's AGG
without noise) instead of on each example; ``--B`` is both sides' batch. conv1 is DPAF's
(random, ``--freeze-conv1`` keeps it frozen as in phase 2, else trained with D), SIN
before the head as in DPAF (``--no-sin`` drops it). ``--g-*`` choose G's hidden
layers (``nets.Generator``): the defaults are the cDCGAN G, ``--g-activation relu
--g-batchnorm --g-label embedding`` DPAF's G before 2026-11-26.

    .venv/bin/python benchmarks/dpaf_collapse.py --dataset mnist-5k --agg --seeds 1,2,3

One JSON line per seed on stdout (the settings, ``within_class_std`` of 100 samples per
class drawn in eval mode, the last step's losses). It trains on the training split minus
the validation part (``load_dataset(..., "val")``) and reads no test split.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np
import torch
import torch.nn.functional as F

from dpaf_gap import within_class_std  # this directory: the script's own, on sys.path
from dpgen_bench.data import load_dataset
from methods.dpaf.dpagg import sin
from methods.dpaf.nets import Conv1, Conv2Star, Generator, Head, dcgan_init, make_layout


def run(a: argparse.Namespace, data, seed: int) -> dict:
    torch.manual_seed(seed)
    x_all, y_all = data.train.images, data.train.labels
    k = data.num_classes
    layout = make_layout(tuple(x_all.shape[1:]), "C2-C1-×", a.width)
    conv1, conv2, head = Conv1(layout), Conv2Star(layout, k, a.label_dim), Head(layout, a.fc_width, 1)
    G = Generator(layout, k, a.g_width, a.latent_dim, a.label_dim, a.g_batchnorm, a.g_activation, a.g_label)
    for m in (conv1, conv2, head, G):
        dcgan_init(m)
    d_params = list(conv2.parameters()) + list(head.parameters())
    if not a.freeze_conv1:
        d_params += list(conv1.parameters())
    opt_d = torch.optim.Adam(d_params, a.lr, betas=(0.5, 0.999))
    opt_g = torch.optim.Adam(G.parameters(), a.lr, betas=(0.5, 0.999))

    def features(x, y):
        f = conv2(conv1(x), y)
        return (sin(f) if a.sin else f).flatten(1)

    def d_logits(x, y):
        f = features(x, y)
        return head(f.mean(0, keepdim=True) if a.agg else f).flatten()

    for _ in range(a.steps):
        i = torch.randint(0, len(x_all), (a.B,))
        yf = torch.randint(0, k, (a.B,))
        xf = G(torch.randn(a.B, a.latent_dim), yf)
        d_loss = F.softplus(-d_logits(x_all[i], y_all[i])).mean() + F.softplus(d_logits(xf.detach(), yf)).mean()
        opt_d.zero_grad(set_to_none=True)
        d_loss.backward()
        opt_d.step()
        g_loss = F.softplus(-head(features(xf, yf)).flatten()).mean()  # D̂: per example
        opt_g.zero_grad(set_to_none=True)
        g_loss.backward(inputs=list(G.parameters()))
        opt_g.step()
    G.eval()
    with torch.no_grad():
        y = torch.arange(k).repeat_interleave(100)
        x = G(torch.randn(len(y), a.latent_dim), y)
    settings = {key: v for key, v in vars(a).items() if key != "seeds"}
    return {**settings, "seed": seed, "within_class_std": round(within_class_std(x.numpy(), y.numpy()), 3),
            "within_class_std_real": round(within_class_std(x_all.numpy(), y_all.numpy()), 3),
            "d_loss": round(d_loss.item(), 3), "g_loss": round(g_loss.item(), 3)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", default="mnist-5k")
    p.add_argument("--seeds", default="1", help="comma-separated")
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--B", type=int, default=24)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--width", type=int, default=8)
    p.add_argument("--g-width", type=int, default=32)
    p.add_argument("--latent-dim", type=int, default=100)
    p.add_argument("--label-dim", type=int, default=10)
    p.add_argument("--fc-width", type=int, default=64)
    p.add_argument("--agg", action="store_true", help="D's head on the batch mean of the features (DPAF's AGG)")
    p.add_argument("--freeze-conv1", action="store_true")
    p.add_argument("--no-sin", dest="sin", action="store_false")
    p.add_argument("--g-activation", default="leaky_relu", choices=("leaky_relu", "relu"))
    p.add_argument("--g-batchnorm", action="store_true")
    p.add_argument("--g-label", default="onehot", choices=("onehot", "embedding"))
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    data = load_dataset(a.dataset, "val")  # once for every seed
    for s in a.seeds.split(","):
        print(json.dumps(run(a, data, int(s))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
