"""The transfer evaluators on real data standing in for synthetic data."""

import pytest
import torch

from dpgen_bench import registry
from dpgen_bench.api import EvalInput
from dpgen_bench.data.digits import load_digits_data


# Half of digits' training split (700 of 1,437, each class its share, seeded): the
# classifiers here stand in for the evaluators' sanity on real data, and train on it (the
# real2gen ones always, the gen2real ones when it is the "synthetic" set); half the data
# halves the module's time and still separates real from shuffled labels by far.
N_TRAIN = 700


@pytest.fixture(scope="module")
def digits():
    import dataclasses

    from dpgen_bench.api import Split
    from evaluators.transfer import stratified_cap

    full = load_digits_data()
    keep = stratified_cap(full.train.labels, N_TRAIN, full.num_classes, seed=0)
    return dataclasses.replace(full, train=Split(full.train.images[keep], full.train.labels[keep]))


@pytest.mark.parametrize("name", ["gen2real_cnn", "gen2real_resnet", "gen2real_mlp", "real2gen_cnn", "real2gen_mlp"])
def test_real_data_as_synthetic_scores_high(digits, name):
    ev = registry.evaluators.get(name)()
    assert ev.higher_is_better
    src = digits.train if name.startswith("gen2real") else digits.test
    out = ev.evaluate(EvalInput(digits, src.images, src.labels, None, torch.device("cpu"), seed=0))
    assert out["metrics"][name] > 0.9
    assert {"train_on", "test_on", "classifier"} <= set(out["protocol"])


@pytest.mark.parametrize("name", ["gen2real_cnn", "real2gen_mlp"])
def test_shuffled_labels_score_near_chance(digits, name):
    ev = registry.evaluators.get(name)()
    src = digits.train if name.startswith("gen2real") else digits.test
    wrong = src.labels[torch.randperm(len(src.labels), generator=torch.Generator().manual_seed(0))]
    out = ev.evaluate(EvalInput(digits, src.images, wrong, None, torch.device("cpu"), seed=0))
    assert out["metrics"][name] < 0.25


def test_unconditional_generator_is_not_applicable(digits):
    ev = registry.evaluators.get("gen2real_cnn")()
    out = ev.evaluate(EvalInput(digits, digits.test.images, None, None, torch.device("cpu"), seed=0))
    assert out["metrics"] == {} and "skipped" in out["protocol"]


def test_stratified_cap_keeps_every_class_share():
    from evaluators.transfer import stratified_cap

    labels = torch.arange(10).repeat_interleave(torch.tensor([6000] * 9 + [3000]))  # class-sorted
    keep = stratified_cap(labels, 10_000, 10, seed=0)
    counts = torch.bincount(labels[keep], minlength=10).tolist()
    assert len(keep) == 10_000 and len(set(keep.tolist())) == 10_000
    assert all(abs(c - 6000 * 10_000 / 57_000) < 1 for c in counts[:9])  # 1052.6 each
    assert abs(counts[9] - 3000 * 10_000 / 57_000) < 1  # 526.3
    assert torch.equal(keep, stratified_cap(labels, 10_000, 10, seed=0))  # seeded
    assert torch.equal(stratified_cap(labels[:50], 100, 10, seed=0), torch.arange(50))  # under the cap: all


@pytest.mark.parametrize("name", ["real2gen_cnn", "real2gen_mlp"])
def test_real2gen_on_a_class_sorted_set_tests_every_class(digits, name, monkeypatch):
    """A class-sorted synthetic set larger than the cap (as gswgan's 6,000 per class on
    MNIST) is tested on every class, not on the first classes only."""
    monkeypatch.setattr("evaluators.transfer.MAX_REAL2GEN_TEST", 200)
    order = torch.argsort(digits.train.labels, stable=True)
    x, y = digits.train.images[order], digits.train.labels[order]
    out = registry.evaluators.get(name)().evaluate(EvalInput(digits, x, y, None, torch.device("cpu"), seed=0))
    per = out["protocol"]["per_class"]
    assert sum(per) == 200 and len(per) == 10 and min(per) >= 18
    assert out["protocol"]["test_on"] == "synthetic (200)"


@pytest.mark.parametrize("shape", [(1, 16, 16), (1, 28, 28), (3, 32, 32)])
def test_the_small_resnet_fits_grey_and_colour_images(shape):
    from evaluators.transfer import ResNet

    net = ResNet(shape, 10)
    assert net(torch.zeros(2, *shape)).shape == (2, 10)
    assert sum(p.numel() for p in net.parameters()) < 400_000  # trains in seconds on a CPU
    assert len([m for m in net.modules() if type(m).__name__ == "BasicBlock"]) == 4  # one per stage


def test_gen2real_all_is_the_mean_and_std_of_three_classifiers_trained_once(digits, monkeypatch):
    import numpy as np

    from evaluators import transfer

    monkeypatch.setattr(transfer, "_GEN2REAL_MEMO", type(transfer._GEN2REAL_MEMO)())
    x, y = digits.train.images[:400], digits.train.labels[:400]
    run = EvalInput(digits, x, y, None, torch.device("cpu"), seed=0)
    out = registry.evaluators.get("gen2real_all")().evaluate(run)
    parts = [out["metrics"][n] for n in ("gen2real_cnn", "gen2real_resnet", "gen2real_mlp")]
    assert out["metrics"]["gen2real_all"] == pytest.approx(np.mean(parts))
    assert out["metrics"]["gen2real_all_std"] == pytest.approx(np.std(parts))  # population std, as DPImageBench
    assert min(parts) > 0.8 and out["protocol"]["classifiers"] == ["cnn", "resnet", "mlp"]
    assert out["protocol"]["gen2real_resnet"]["classifier"].startswith("resnet")

    def no_training(*a, **k):
        raise AssertionError("trained again")

    monkeypatch.setattr(transfer, "train_classifier", no_training)
    monkeypatch.setattr(transfer, "mlp_accuracy", no_training)
    again = registry.evaluators.get("gen2real_resnet")().evaluate(run)  # the same samples: memoised
    assert again["metrics"]["gen2real_resnet"] == out["metrics"]["gen2real_resnet"] and again["protocol"]["memoised"]
    assert registry.evaluators.get("gen2real_all")().evaluate(
        EvalInput(digits, x, None, None, torch.device("cpu"), seed=0))["metrics"] == {}  # unconditional


def test_tied_holdout_epochs_keep_the_first_as_the_authors_argmax():
    """The epoch is chosen as ``np.argmax`` over the held-out accuracies (Private GANs'
    acc.py): among tied epochs the first. Two classes that differ in every pixel are told
    apart from the first epoch on, so every epoch ties at 1.0 and epoch 1 is kept (the
    module docstring says how much this choice moves a run at 100 held-out images)."""
    from evaluators.transfer import CNN, train_classifier

    x = torch.cat([torch.full((40, 1, 12, 12), -1.0), torch.full((40, 1, 12, 12), 1.0)])
    y = torch.cat([torch.zeros(40, dtype=torch.long), torch.ones(40, dtype=torch.long)])
    _, proto = train_classifier(CNN((1, 12, 12), 2), x, y, seed=0, epochs=4)
    assert proto["holdout_accuracy"] == 1.0
    assert proto["selected_epoch"] == 1
