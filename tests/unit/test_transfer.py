"""The transfer evaluators on real data standing in for synthetic data."""

import pytest
import torch

from dpgen_bench import registry
from dpgen_bench.api import EvalInput
from dpgen_bench.data.digits import load_digits_data


@pytest.fixture(scope="module")
def digits():
    return load_digits_data()


@pytest.mark.parametrize("name", ["gen2real_cnn", "gen2real_mlp", "real2gen_cnn", "real2gen_mlp"])
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
