"""The real2gen CNN is trained once per (real split, seed, protocol, torch, device type)
and read back from the classifier cache: the same weights, a damaged file rebuilt, a
different split or seed never served another's classifier."""

from __future__ import annotations

import pytest
import torch

from evaluators import transfer


@pytest.fixture
def real(monkeypatch, tmp_path):
    monkeypatch.setenv("DPGEN_CACHE", str(tmp_path / "cache"))
    g = torch.Generator().manual_seed(0)
    x = torch.rand(120, 1, 8, 8, generator=g) * 2 - 1
    y = torch.arange(120) % 3
    x[y == 1, :, :4] = 1.0  # learnable classes
    x[y == 2, :, 4:] = 1.0
    return x, y, tmp_path / "cache" / transfer.CLASSIFIER_CACHE


def _weights(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_second_call_is_a_hit_with_the_same_weights(real, monkeypatch):
    x, y, cache = real
    m1, p1 = transfer.real_cnn(x, y, (1, 8, 8), 3, seed=4, device=torch.device("cpu"))
    assert p1["classifier_cache"] == "built" and len(list(cache.glob("real-cnn-*.pt"))) == 1

    def no_training(*a, **k):
        raise AssertionError("trained again")

    monkeypatch.setattr(transfer, "train_classifier", no_training)
    m2, p2 = transfer.real_cnn(x, y, (1, 8, 8), 3, seed=4, device=torch.device("cpu"))
    assert p2["classifier_cache"] == "hit" and p2["classifier_key"] == p1["classifier_key"]
    assert p2["selected_epoch"] == p1["selected_epoch"]
    w1, w2 = _weights(m1), _weights(m2)
    assert all(torch.equal(w1[k], w2[k]) for k in w1)


@pytest.mark.parametrize("change", ["seed", "image", "label"])
def test_other_data_or_seed_is_another_classifier(real, change):
    x, y, cache = real
    _, p1 = transfer.real_cnn(x, y, (1, 8, 8), 3, seed=4, device=torch.device("cpu"))
    seed = 4
    if change == "seed":
        seed = 5
    elif change == "image":
        x = x.clone()
        x[0, 0, 0, 0] += 1e-3
    else:
        y = y.clone()
        y[0] = (y[0] + 1) % 3
    _, p2 = transfer.real_cnn(x, y, (1, 8, 8), 3, seed=seed, device=torch.device("cpu"))
    assert p2["classifier_cache"] == "built" and p2["classifier_key"] != p1["classifier_key"]
    assert len(list(cache.glob("real-cnn-*.pt"))) == 2


def test_a_damaged_cache_file_is_rebuilt(real, caplog):
    x, y, cache = real
    _, p1 = transfer.real_cnn(x, y, (1, 8, 8), 3, seed=4, device=torch.device("cpu"))
    (path,) = cache.glob("real-cnn-*.pt")
    path.write_bytes(path.read_bytes()[:100])
    _, p2 = transfer.real_cnn(x, y, (1, 8, 8), 3, seed=4, device=torch.device("cpu"))
    assert p2["classifier_cache"] == "built" and "damaged classifier cache" in caplog.text
    assert torch.load(path, weights_only=True)["protocol"]["selected_epoch"] == p1["selected_epoch"]


def test_the_evaluator_records_the_cache_use(real):
    from dpgen_bench.api import EvalInput, ImageData, Split

    x, y, _ = real
    data = ImageData("toy", Split(x, y), Split(x[:30], y[:30]), ("a", "b", "c"))
    run = EvalInput(data=data, images=x[:60], labels=y[:60], method=None, device=torch.device("cpu"), seed=1,
                    options={})
    first = transfer.Real2GenCNN().evaluate(run)
    again = transfer.Real2GenCNN().evaluate(run)
    assert first["protocol"]["classifier_cache"] == "built" and again["protocol"]["classifier_cache"] == "hit"
    assert first["metrics"] == again["metrics"]


def test_the_classifier_does_not_depend_on_the_global_generator(real):
    """The same data and seed train the same CNN whatever the global generator held before
    (a run's fit consumes it): a cached real CNN equals the one a fresh process would build."""
    x, y, _ = real
    models = []
    for state in (0, 1):
        torch.manual_seed(1000 + state)
        torch.rand(7)
        model, _ = transfer.train_classifier(transfer.CNN((1, 8, 8), 3), x, y, seed=4, epochs=2)
        models.append(model.state_dict())
    assert all(torch.equal(models[0][k], models[1][k]) for k in models[0])
