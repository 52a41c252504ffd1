"""gen2real / real2gen transfer accuracy (DP-GAN-DPAC §5, "Evaluation metrics").

- gen2real: train a classifier on the labelled synthetic set, test it on the real test
  split (Private GANs §4.1 "Evaluation").
- real2gen: train on the real training split, test on the synthetic set (DPAC's
  "reversed utility"; GS-WGAN's ``eval_sklearn.py`` tests on at most 10,000 synthetic
  images, as here). The 10,000 are a seeded stratified subsample (each class keeps its
  share), never the first 10,000 of a class-sorted set, which would be classes 0 and 1
  alone at 6,000 per class; ``protocol.per_class`` lists how many of each class were
  tested.

MLP: scikit-learn's ``MLPClassifier`` with its defaults (one hidden layer of 100 ReLU
units, Adam, ≤ 200 epochs) on pixels scaled to [0, 1], as GS-WGAN's evaluation code does
(``evaluation/eval_sklearn.py``), on which DP-GAN-DPAC builds; seeded.

Classifier (CNN): the Private GANs authors' ``eval/acc.py`` network — conv 3×3 (32) →
ReLU → conv 3×3 (64) → ReLU → max-pool 2 → dropout 0.25 → FC 128 → ReLU → dropout 0.5
→ FC; Adam(1e-3), batch 64, 10 epochs. As in their code, the epoch is chosen on a
held-out slice of the *synthetic* data (10% here; 5,000 images there), never on the real
test split.
With the quick presets' 1,000 samples that slice is 100 images, and its accuracy often ties
across epochs (1.0 from the first epoch for a generator whose classes are easy to tell
apart, a collapsed one included); the first best epoch is kept, as ``np.argmax`` does in the
authors' code, where 5,000 images make ties rare. Which of the tied epochs is kept moves a
run's number both ways (mnist-5k, test split, seed 0 unless said, ties going to the last best
epoch instead):
gan 0.609 → 0.642 (epoch 1 → 10), dpmean 0.764 → 0.775, dpmerf 0.815 → 0.799, dpaf without
noise 0.660 / 0.573 / 0.659 → 0.658 / 0.544 / 0.602 (seeds 0 / 1 / 2; more epochs on
synthetic images can cost real accuracy), runs at chance unchanged: a ±0.06 spread of the
protocol at this sample size, not a bias in one direction, so the authors' rule stays.

Classifier (ResNet, ``gen2real_resnet``): a ResNet-18-style network shrunk for 16–32 px grey or
colour images and for CPU training — a 3×3 stem convolution (16 channels, stride 1, no
max-pool), four stages of *one* torchvision ``BasicBlock`` each (widths 16, 32, 64, 128;
strides 1, 2, 2, 2), global average pooling, a linear layer: 0.3 M parameters. Trained as the
CNN (Adam 1e-3, batch 64, 10 epochs, epoch chosen on the held-out synthetic slice).
Departures from DPImageBench's ResNet for MNIST-like data (``evaluation/classifier/resnet.py``
and ``evaluator.py``: depth 110, i.e. 18 BasicBlocks per stage at widths 16-32-64, Adam 1e-2
with a step schedule, batch 256, 50 epochs, EMA weights; the epoch also chosen on held-out
synthetic data): 4 blocks instead of 54, 10 epochs, Adam 1e-3, no EMA, so that it trains in
seconds on a CPU (5-6 s for 1,000 digits at 16×16, one thread; the CNN 3 s). Its
accuracies are this harness's, not DPImageBench's.

``gen2real_all``: CNN, ResNet and MLP, each as its own evaluator, and their mean
(``gen2real_all``) and population standard deviation (``gen2real_all_std``, numpy's default
``std`` as DPImageBench's ``acc_list``) — DPImageBench's aggregate, over our three classifiers
(theirs are WRN, ResNet and ResNeXt). The three accuracies are recorded under their own names
too. A gen2real accuracy is memoised in the process per (classifier, synthetic set, real test
split, seed, device): asking for ``gen2real_cnn`` and ``gen2real_all`` trains the CNN once.

The real2gen CNN depends only on the real training split, the seed, the device type and
the protocol, not on the run: it is trained once and cached (``$DPGEN_CACHE/classifiers``,
else ``~/.cache/dpgen_bench/classifiers``), keyed by the SHA-256 of the training images and
labels, the seed, the protocol's settings, the torch version and the device type; written
atomically, built under a file lock so that parallel runs train it once. A sweep of many
methods on one dataset and seed trains it once instead of once per run (39 s a run on
``mnist-5k`` on one CPU thread). ``protocol.classifier_cache`` says ``hit`` or ``built``.
``bench sweep`` builds it before the cells, in a worker of its own (``Real2GenCNN.prepare``),
so that the first cells do not queue on its lock.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import time
from collections import OrderedDict
from typing import Any

import numpy as np

import torch
import torch.nn.functional as F
from torch import nn

from dpgen_bench.api import EvalInput, Evaluator
from dpgen_bench.cache import cache_dir
from dpgen_bench.store import atomic_path, file_lock

log = logging.getLogger("dpgen_bench")
CLASSIFIER_CACHE = "classifiers"  # cache_dir kind of the real2gen CNNs
CLASSIFIER_CACHE_VERSION = 2  # bump when the CNN or its training changes (2: initial weights from the seed)


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


class ResNet(nn.Module):
    """ResNet-18-style classifier for small images (module docstring): 3×3 stem, one
    torchvision ``BasicBlock`` per stage at widths 16-32-64-128, global average pool, linear."""

    widths = (16, 32, 64, 128)

    def __init__(self, image_shape: tuple[int, int, int], num_classes: int):
        super().__init__()
        from torchvision.models.resnet import BasicBlock, conv1x1

        c = image_shape[0]
        w0 = self.widths[0]
        layers: list[nn.Module] = [nn.Conv2d(c, w0, 3, padding=1, bias=False), nn.BatchNorm2d(w0), nn.ReLU()]
        inplanes = w0
        for i, width in enumerate(self.widths):
            stride = 1 if i == 0 else 2
            down = None
            if stride != 1 or inplanes != width:
                down = nn.Sequential(conv1x1(inplanes, width, stride), nn.BatchNorm2d(width))
            layers.append(BasicBlock(inplanes, width, stride, down))
            inplanes = width
        self.features = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(inplanes, num_classes)

    def forward(self, x):
        return self.head(self.features(x))


# 128 rows keep the CNN's activations in cache: on one CPU thread the 10,000 MNIST test images
# take about half the time of 512-row batches, with bit-identical logits (benchmarks/presets.md,
# "The demo on full MNIST")
@torch.no_grad()
def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int = 128) -> float:
    model.eval()
    correct = sum((model(x[i:i + batch]).argmax(1) == y[i:i + batch]).sum().item() for i in range(0, len(x), batch))
    return correct / max(1, len(x))


def train_classifier(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, seed: int, epochs: int = 10,
                     batch_size: int = 64, lr: float = 1e-3, holdout: float = 0.1,
                     device: torch.device | str = "cpu") -> tuple[nn.Module, dict]:
    """Train with Adam on ``device`` (the run's: the data moves there once); keep the epoch
    with the best accuracy on a held-out slice of the training data itself. The batch order
    comes from a CPU generator, so it is the same on every device."""
    model, x, y = model.to(device), x.to(device), y.to(device)
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(len(x), generator=g)
    n_hold = max(1, int(len(x) * holdout))
    hold, fit = perm[:n_hold], perm[n_hold:]
    torch.manual_seed(seed)
    # the initial weights come from the seed too, not from whatever the global generator held
    # when the model was built (a run's fit consumes it): the same data and seed give the
    # same classifier in every process, so a cached real CNN equals a fresh one
    for module in model.modules():
        if hasattr(module, "reset_parameters"):
            module.reset_parameters()
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


def real_cnn(x: torch.Tensor, y: torch.Tensor, image_shape: tuple[int, int, int], num_classes: int, *, seed: int,
             device: torch.device) -> tuple[nn.Module, dict]:
    """The CNN trained on the real split ``(x, y)``, from the classifier cache when the same
    data, seed, protocol, torch version and device type trained one before."""
    x, y = x.detach().cpu().contiguous(), y.detach().cpu().long().contiguous()
    h = hashlib.sha256()
    h.update(x.numpy().tobytes())
    h.update(y.numpy().tobytes())
    h.update(json.dumps({"version": CLASSIFIER_CACHE_VERSION, "shape": list(x.shape), "classes": num_classes,
                         "seed": seed, "torch": torch.__version__, "device": device.type}, sort_keys=True).encode())
    key = h.hexdigest()[:32]
    directory = cache_dir(CLASSIFIER_CACHE)
    path = directory / f"real-cnn-{key}.pt"
    model = CNN(image_shape, num_classes)

    def cached() -> dict | None:
        if not path.is_file():
            return None
        try:
            return torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # noqa: BLE001 - a damaged cache file is rebuilt, never trusted
            log.warning("rebuilding the damaged classifier cache %s (%s)", path, type(e).__name__)
            return None

    with file_lock(directory / f".real-cnn-{key}.lock"):
        entry = cached()
        if entry is None:
            model, proto = train_classifier(model, x, y, seed=seed, device=device)
            with atomic_path(path) as tmp:
                torch.save({"state": {k: v.cpu() for k, v in model.state_dict().items()}, "protocol": proto}, tmp)
            return model, {**proto, "classifier_cache": "built", "classifier_key": key}
    model.load_state_dict(entry["state"])
    return model.to(device), {**entry["protocol"], "classifier_cache": "hit", "classifier_key": key}


MAX_REAL2GEN_TEST = 10_000


def stratified_cap(labels: torch.Tensor, cap: int, num_classes: int, seed: int) -> torch.Tensor:
    """Indices of at most ``cap`` rows, each class keeping its share (largest remainders),
    chosen within a class by a seeded permutation; all rows when there are ≤ ``cap``."""
    n = len(labels)
    if n <= cap:
        return torch.arange(n)
    counts = torch.bincount(labels, minlength=num_classes).double()
    exact = counts * cap / n
    take = exact.floor().long()
    short = cap - int(take.sum())
    if short:
        order = torch.argsort(exact - take, descending=True, stable=True)
        take[order[:short]] += 1
    g = torch.Generator().manual_seed(seed)
    keep = []
    for c in range(num_classes):
        rows = torch.nonzero(labels == c).flatten()
        keep.append(rows[torch.randperm(len(rows), generator=g)[:int(take[c])]])
    return torch.sort(torch.cat(keep)).values


def per_class(labels: torch.Tensor, num_classes: int) -> list[int]:
    return torch.bincount(labels.long(), minlength=num_classes).tolist()


def mlp_accuracy(x_train, y_train, x_test, y_test, *, seed: int) -> tuple[float, dict]:
    import warnings

    from sklearn.exceptions import ConvergenceWarning
    from sklearn.neural_network import MLPClassifier

    def flat(x):  # [-1, 1] NCHW → [0, 1] rows
        return ((x.reshape(len(x), -1).cpu().numpy() + 1) / 2).astype("float32")

    clf = MLPClassifier(random_state=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf.fit(flat(x_train), y_train.cpu().numpy())
    acc = float((clf.predict(flat(x_test)) == y_test.cpu().numpy()).mean())
    return acc, {"classifier": "mlp (sklearn MLPClassifier defaults, GS-WGAN eval_sklearn.py)",
                 "hidden_layer_sizes": list(clf.hidden_layer_sizes), "n_iter": int(clf.n_iter_)}


NETS = {"cnn": CNN, "resnet": ResNet}
NET_NAMES = {"cnn": "cnn (Private GANs acc.py)",
             "resnet": "resnet (ResNet-18-style: 3x3 stem, 1 BasicBlock per stage, widths 16-32-64-128)"}
_GEN2REAL_MEMO: "OrderedDict[str, tuple[float, dict]]" = OrderedDict()  # key → (accuracy, protocol)
_GEN2REAL_MEMO_SIZE = 8


def _digest(*tensors: torch.Tensor) -> str:
    h = hashlib.sha1()
    for t in tensors:
        t = t.detach().cpu().contiguous()
        h.update(repr((tuple(t.shape), str(t.dtype))).encode())
        h.update(t.numpy().tobytes())
    return h.hexdigest()


class _Transfer(Evaluator):
    direction: str  # "gen2real" | "real2gen"
    classifier: str  # "cnn" | "resnet" | "mlp"
    higher_is_better = True

    def evaluate(self, run: EvalInput) -> dict[str, Any]:
        if run.labels is None:  # not applicable to an unconditional generator: no metric, never 0
            return {"metrics": {}, "protocol": {"skipped": "unconditional generator"}}
        acc, proto = self.score(run)
        return {"metrics": {self.name: acc}, "protocol": proto}

    def score(self, run: EvalInput) -> tuple[float, dict[str, Any]]:
        """(accuracy, protocol) of this classifier and direction on a labelled run; a gen2real
        score is memoised in the process (module docstring)."""
        data = run.data
        gen_x, gen_y = run.images.cpu(), run.labels.cpu()
        dev = torch.device(run.device)
        key = None
        if self.direction == "gen2real":
            (x_tr, y_tr), (x_te, y_te) = (gen_x, gen_y), (data.test.images.cpu(), data.test.labels.cpu())
            where = {"train_on": f"synthetic ({len(gen_x)})", "test_on": f"real {data.eval_split} ({len(data.test)})"}
            key = f"{self.classifier}:{_digest(x_tr, y_tr, x_te, y_te)}:{run.seed}:{dev}"
            if key in _GEN2REAL_MEMO:
                _GEN2REAL_MEMO.move_to_end(key)
                acc, proto = _GEN2REAL_MEMO[key]
                return acc, {**proto, "memoised": True}
        else:
            keep = stratified_cap(gen_y.long(), MAX_REAL2GEN_TEST, data.num_classes, run.seed)
            (x_tr, y_tr), (x_te, y_te) = (data.train.images.cpu(), data.train.labels.cpu()), (gen_x[keep], gen_y[keep])
            train = "real train" if data.eval_split == "test" else "real train minus val"
            where = {"train_on": f"{train} ({len(data.train)})", "test_on": f"synthetic ({len(keep)})",
                     "per_class": per_class(y_te, data.num_classes)}
        t0 = time.perf_counter()
        if self.classifier in NETS:
            if self.direction == "real2gen" and self.classifier == "cnn":
                model, proto = real_cnn(x_tr, y_tr, data.image_shape, data.num_classes, seed=run.seed, device=dev)
            else:
                model, proto = train_classifier(NETS[self.classifier](data.image_shape, data.num_classes), x_tr, y_tr,
                                                seed=run.seed, device=dev)
            acc = accuracy(model, x_te.to(dev), y_te.to(dev))
            proto["classifier"] = NET_NAMES[self.classifier]
            proto["device"] = str(dev)
        else:
            acc, proto = mlp_accuracy(x_tr, y_tr, x_te, y_te, seed=run.seed)
        proto = {**proto, **where, "train_time_s": round(time.perf_counter() - t0, 3)}
        if key is not None:
            _GEN2REAL_MEMO[key] = (acc, dict(proto))
            while len(_GEN2REAL_MEMO) > _GEN2REAL_MEMO_SIZE:
                _GEN2REAL_MEMO.popitem(last=False)
        return acc, proto


class Gen2RealCNN(_Transfer):
    """Accuracy on the real test split of a CNN trained on the synthetic set."""

    name, direction, classifier = "gen2real_cnn", "gen2real", "cnn"


class Gen2RealResNet(_Transfer):
    """Accuracy on the real test split of a small ResNet trained on the synthetic set."""

    name, direction, classifier = "gen2real_resnet", "gen2real", "resnet"


class Gen2RealMLP(_Transfer):
    """Accuracy on the real test split of an MLP trained on the synthetic set."""

    name, direction, classifier = "gen2real_mlp", "gen2real", "mlp"


class Real2GenCNN(_Transfer):
    """Accuracy on the synthetic set of a CNN trained on the real training split."""

    name, direction, classifier = "real2gen_cnn", "real2gen", "cnn"
    has_prepare = True

    def prepare(self, data, *, seed: int, device: torch.device) -> dict[str, Any]:
        """Train (or find) the cached real CNN that ``evaluate`` will load."""
        _, proto = real_cnn(data.train.images, data.train.labels, data.image_shape, data.num_classes, seed=seed,
                            device=torch.device(device))
        return {"classifier_cache": proto["classifier_cache"], "classifier_key": proto["classifier_key"]}


class Real2GenMLP(_Transfer):
    """Accuracy on the synthetic set of an MLP trained on the real training split."""

    name, direction, classifier = "real2gen_mlp", "real2gen", "mlp"


class Gen2RealAll(Evaluator):
    """Mean ± std over the CNN, ResNet and MLP of their accuracies on the real test split when
    trained on the synthetic set (DPImageBench's aggregate over three classifiers)."""

    name = "gen2real_all"
    higher_is_better = True
    parts: tuple[type[_Transfer], ...] = (Gen2RealCNN, Gen2RealResNet, Gen2RealMLP)

    def evaluate(self, run: EvalInput) -> dict[str, Any]:
        if run.labels is None:
            return {"metrics": {}, "protocol": {"skipped": "unconditional generator"}}
        metrics: dict[str, float] = {}
        protocol: dict[str, Any] = {}
        for part in self.parts:
            metrics[part.name], protocol[part.name] = part().score(run)
        accs = np.array([metrics[p.name] for p in self.parts])
        metrics[self.name], metrics[f"{self.name}_std"] = float(accs.mean()), float(accs.std())
        first = protocol[self.parts[0].name]
        protocol.update({"classifiers": [p.classifier for p in self.parts], "train_on": first["train_on"],
                         "test_on": first["test_on"],
                         "aggregate": "mean and population std (numpy std, ddof 0, as DPImageBench's acc_list) over "
                                      "the three accuracies, each also recorded under its own evaluator's name"})
        return {"metrics": metrics, "protocol": protocol}
