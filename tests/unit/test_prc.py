"""Precision / recall / density / coverage (``prc``) and FID against the training split
(``fid_train``) on the Inception features FID uses, one feature pass for all of them, and
their directions in ``bench report``.

The behaviour tests run on a cheap deterministic feature map (a fixed random projection of
the pixels) instead of InceptionV3 (about 0.25 CPU-s an image here); one test runs the real
extractor on 40 + 40 digits. The plumbing tests replace torch-fidelity's Fréchet distance
(eigenvalues of a 2048×2048 matrix: 7-15 s each here) by a cheap stand-in.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from dpgen_bench import registry
from dpgen_bench.api import EvalInput, ImageData, Split
from evaluators import fid as F
from evaluators import inception as I


def _digits():
    from dpgen_bench.data.digits import load_digits_data

    return load_digits_data()


def _features(images: torch.Tensor) -> torch.Tensor:
    """A deterministic function of the uint8 images, as InceptionV3 is, at no cost."""
    x = I.to_uint8_rgb(images).float().flatten(1) / 255
    return torch.relu(x @ torch.randn(x.shape[1], 2048, generator=torch.Generator().manual_seed(0)))


class CountingExtractor:
    """Stands in for ``inception.extract_features``; records the sets it was called on."""

    def __init__(self, monkeypatch):
        self.sets: list[str] = []
        monkeypatch.setattr(I, "extract_features", self)

    def __call__(self, images, plan=None):
        self.sets.append(I.content_digest(images))
        return _features(images)


@pytest.fixture
def cheap_fid(monkeypatch):
    """torch-fidelity's Fréchet distance replaced by |mu_1 - mu_2|^2 (the plumbing is under test)."""
    import torch_fidelity.metric_fid as mf

    def stand_in(stats_1, stats_2, verbose=False):
        return {mf.KEY_METRIC_FID: float(((stats_1["mu"] - stats_2["mu"]) ** 2).sum())}

    monkeypatch.setattr(mf, "fid_statistics_to_metric", stand_in)


def _data(real: torch.Tensor, labels: torch.Tensor, train: torch.Tensor | None = None) -> ImageData:
    train = real if train is None else train
    return ImageData(name="digits-prc", train=Split(train, torch.zeros(len(train), dtype=torch.long)),
                     test=Split(real, labels), class_names=tuple(str(c) for c in range(10)))


def _run(data: ImageData, generated: torch.Tensor) -> EvalInput:
    return EvalInput(data=data, images=generated, labels=None, method=None, device=torch.device("cpu"), seed=0,
                     options={"fid_batch_size": 50})


def _collapsed(real: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """One real image per class, each repeated len(real) // 10 times: a mode-collapsed copy."""
    first = torch.stack([torch.nonzero(labels == c)[0, 0] for c in range(10)])
    return real[first].repeat_interleave(len(real) // 10, 0)


# ---------------------------------------------------------------------- the definitions


def _brute(gen: torch.Tensor, real: torch.Tensor, k_pr: int, k_dc: int) -> dict[str, float]:
    """Kynkäänniemi et al. (2019) eqs. 1-3 and Naeem et al. (2020) eqs. 3-4, by loops."""
    def dist(a, b):
        return float(((a - b) ** 2).sum().sqrt())

    def radius(points, i, k):  # distance to the k-th nearest *other* point
        return sorted(dist(points[i], points[j]) for j in range(len(points)) if j != i)[k - 1]

    r_real = [radius(real, i, k_pr) for i in range(len(real))]
    r_gen = [radius(gen, j, k_pr) for j in range(len(gen))]
    precision = sum(any(dist(g, real[i]) <= r_real[i] for i in range(len(real))) for g in gen) / len(gen)
    recall = sum(any(dist(x, gen[j]) <= r_gen[j] for j in range(len(gen))) for x in real) / len(real)
    r_dc = [radius(real, i, k_dc) for i in range(len(real))]
    inside = [[dist(g, real[i]) <= r_dc[i] for g in gen] for i in range(len(real))]
    density = sum(map(sum, inside)) / (k_dc * len(gen))
    coverage = sum(any(row) for row in inside) / len(real)
    return {"precision": precision, "recall": recall, "density": density, "coverage": coverage}


def test_density_and_coverage_follow_naeem_et_al():
    g = torch.Generator().manual_seed(0)
    real, gen = torch.randn(23, 5, generator=g), torch.randn(17, 5, generator=g) * 1.5 + 0.3
    want = _brute(gen, real, 3, 5)
    assert F.density_coverage(gen, real, 5) == pytest.approx((want["density"], want["coverage"]))
    assert F.density_coverage(gen, real, 5, batch_size=4) == pytest.approx((want["density"], want["coverage"]))
    with pytest.raises(ValueError, match="more than 5 real points"):
        F.density_coverage(gen, real[:5], 5)


def test_prc_records_precision_recall_density_coverage_as_defined(inception_cache, monkeypatch):
    """Through the evaluator (generated and real features in torch-fidelity's order), against
    the loops above on the same features."""
    CountingExtractor(monkeypatch)
    d = _digits()
    real, gen = d.test.images[:30], (d.train.images[:25] + 0.3).clamp(-1, 1)
    out = F.PRC().evaluate(_run(_data(real, d.test.labels[:30]), gen))
    want = _brute(_features(gen), _features(real), F.PRC_NEIGHBOURHOOD, F.DC_NEIGHBOURHOOD)
    assert out["metrics"] == pytest.approx(want, abs=1e-6)
    assert 0 < want["precision"] < 1 and 0 < want["recall"] < 1  # neither degenerate
    p = out["protocol"]
    assert (p["k_precision_recall"], p["k_torch_fidelity_default"], p["k_density_coverage"]) == (3, 3, 5)
    assert p["k_dpimagebench"].startswith("3") and (p["n_generated"], p["n_real"]) == (25, 30)
    assert p["real_split"] == "test" and p["save_cpu_ram"] is False


# ---------------------------------------------------------------------- behaviour


def test_precision_and_recall_tell_collapse_from_spread(inception_cache, monkeypatch):
    CountingExtractor(monkeypatch)
    d = _digits()
    real, labels = d.test.images[:100], d.test.labels[:100]
    data = _data(real, labels)
    noise = torch.randn(real.shape, generator=torch.Generator().manual_seed(1))
    same = F.PRC().evaluate(_run(data, real))["metrics"]
    collapsed = F.PRC().evaluate(_run(data, _collapsed(real, labels)))["metrics"]
    broad = F.PRC().evaluate(_run(data, (real + 0.5 * noise).clamp(-1, 1)))["metrics"]
    assert same["precision"] == same["recall"] == same["coverage"] == 1.0
    assert same["density"] == pytest.approx((F.DC_NEIGHBOURHOOD + 1) / F.DC_NEIGHBOURHOOD)  # each ball holds its centre
    assert collapsed["precision"] > 0.9 and collapsed["recall"] < 0.2  # faithful, not diverse
    assert broad["precision"] < 0.5 and broad["recall"] > 0.9  # diverse, not faithful
    assert broad["density"] < 0.5 < collapsed["density"]


def test_prc_on_inception_features(warm_inception_cache):
    """The real extractor on 40 digits: a set against itself, and a mode-collapsed copy (one
    image per class, 4 times each)."""
    d = _digits()
    real, labels = d.test.images[:40], d.test.labels[:40]
    data = _data(real, labels)
    same = F.PRC().evaluate(_run(data, real))
    assert same["protocol"]["generated_features_reused"] is False  # generated first, the real set then reuses it
    assert same["metrics"]["precision"] == same["metrics"]["recall"] == 1.0
    collapsed = F.PRC().evaluate(_run(data, _collapsed(real, labels)))["metrics"]
    assert collapsed["precision"] == 1.0 and collapsed["recall"] <= 0.25, collapsed


# ---------------------------------------------------------------------- one feature pass


def test_fid_kid_prc_and_fid_train_extract_the_samples_once(inception_cache, monkeypatch, cheap_fid):
    from dpgen_bench.runner import run_evaluators

    counter = CountingExtractor(monkeypatch)
    d = _digits()
    data = _data(d.test.images[:40], d.test.labels[:40], train=d.train.images[:60])
    gen = d.train.images[100:150].flip(-1)
    config = SimpleNamespace(evaluators=("fid", "kid", "prc", "fid_train"), seed=0, delta=1e-5)
    names = config.evaluators
    rotations = [names[i:] + names[:i] for i in range(len(names))]
    for names in rotations + [r[::-1] for r in rotations]:  # each first and each last, both ways round
        I.clear_memory_cache()
        for path in inception_cache.glob("real-*.pt"):
            path.unlink()
        counter.sets.clear()
        out = run_evaluators(SimpleNamespace(evaluators=names, seed=0, delta=1e-5), data, None,
                             torch.device("cpu"), gen, None)
        assert counter.sets.count(I.content_digest(gen)) == 1, names  # InceptionV3 once over the samples
        assert len(counter.sets) == 3  # and once over each real split
    assert {"fid", "kid", "kid_std", "precision", "recall", "density", "coverage", "fid_train"} == set(out["metrics"])
    assert sum(out["protocol"][n]["generated_features_reused"] for n in config.evaluators) == 3

    I.clear_memory_cache()  # a new process: the real splits come from the disk cache
    counter.sets.clear()
    again = run_evaluators(config, data, None, torch.device("cpu"), gen, None)
    assert counter.sets == [I.content_digest(gen)]
    assert all(again["protocol"][n]["real_stats_from_cache"] for n in config.evaluators)
    assert again["metrics"] == pytest.approx(out["metrics"])
    cached = torch.load(inception_cache / again["protocol"]["prc"]["real_stats_cache"], weights_only=True)
    assert cached["features"].shape == (40, 2048)  # features on disk, not only mu / sigma


# ---------------------------------------------------------------------- fid_train


def test_fid_train_compares_with_the_training_split(inception_cache, monkeypatch, cheap_fid):
    CountingExtractor(monkeypatch)
    d = _digits()
    data = _data(d.test.images[:40], d.test.labels[:40], train=d.train.images[:60])
    gen = d.train.images[:60]
    train = F.FIDTrain().evaluate(_run(data, gen))
    test = F.FID().evaluate(_run(data, gen))
    assert set(train["metrics"]) == {"fid_train"} and train["metrics"]["fid_train"] == pytest.approx(0.0, abs=1e-6)
    assert test["metrics"]["fid"] > 0.01  # the same samples against the test split
    p = train["protocol"]
    assert (p["real_split"], p["n_real"], p["test_on"]) == ("train", 60, "real train (60)")
    assert "-train-1x16x16-n60-" in p["real_stats_cache"] and "not released" in p["privacy_note"]
    assert test["protocol"]["real_split"] == "test"

    members = data.with_members(16, seed=0)
    out = F.FIDTrain().evaluate(_run(members, gen))
    assert out["protocol"]["real_split"] == "train-members16" and out["protocol"]["n_real"] == 16
    val = ImageData(name="v", train=data.train, test=data.test, class_names=data.class_names, eval_split="val")
    assert F.training_split_name(val) == "train-minus-val"


# ---------------------------------------------------------------------- the report


def test_new_columns_have_their_directions(tmp_path, cli_runner):
    from dpgen_bench.cli import cli
    from dpgen_bench.report import table as T
    from report_fixtures import make_record

    ups = ["precision", "recall", "density", "coverage", "gen2real_resnet", "gen2real_all"]
    assert all(T.higher_is_better(m) is True for m in ups)
    assert T.higher_is_better("fid_train") is False and T.higher_is_better("fid") is False
    assert T.higher_is_better("gen2real_all_std") is None and T.higher_is_better("kid_std") is None  # spreads
    assert T.recording_evaluator("precision") == "prc" and T.recording_evaluator("kid_std") == "kid"
    assert set(F.PRC.metric_names) == set(registry.evaluators.attribute("prc", "metric_names"))

    root = tmp_path / "runs"
    for seed, (p, r) in enumerate([(0.9, 0.1), (0.7, 0.3)]):
        make_record(root, f"a{seed}", "dpgan", "digits", 10.0, seed, {"fid": 50.0, "fid_train": 48.0, "precision": p,
                    "recall": r, "gen2real_all": 0.5, "gen2real_all_std": 0.1 * (seed + 1)}, rdp=9.0, prv=8.0)
        make_record(root, f"b{seed}", "dpmerf", "digits", 10.0, seed, {"fid": 60.0, "fid_train": 58.0, "precision": r,
                    "recall": p, "gen2real_all": 0.4, "gen2real_all_std": 0.05}, rdp=9.0, prv=8.0)
    res = cli_runner.invoke(cli, ["report", "--results", str(root), "--layout", "b", "--eps", "10"])
    assert res.exit_code == 0, res.stderr
    header = res.output.splitlines()[0]
    for col in ("fid ↓", "fid_train ↓", "gen2real_all ↑", "precision ↑", "recall ↑"):
        assert col in header, header
    assert "gen2real_all_std |" in header and "gen2real_all_std ↑" not in header
    assert header.index("precision") < header.index("recall")  # prc's declared order
    listed = cli_runner.invoke(cli, ["list", "evaluators"]).output
    assert "prc\thigher is better" in listed and "fid_train\tlower is better" in listed
    assert "gen2real_resnet\thigher is better" in listed and "gen2real_all\thigher is better" in listed


def test_dpimagebench_reference_rows_line_up_with_the_new_columns():
    from dpgen_bench.report.references import load_references

    ref = load_references()
    every = ref[ref["run_id"].str.startswith("dpimagebench:")]
    dib = every[every["metric"] != "gen2real_all"]  # the fidelity tables (ε = 10)
    assert set(dib["metric"]) == {"fid_train", "precision", "recall"} and len(dib) == 3 * 3 * 13
    assert set(dib["dataset"]) == {"mnist", "fashion-mnist", "celeba-gender-32"} and set(dib["eps_target"]) == {10.0}
    # the utility table (ε = 1 / 10) for the methods implemented here and DP-FETA: the mean of
    # DPImageBench's three classifiers, beside our gen2real_all
    acc = every[every["metric"] == "gen2real_all"]
    assert set(acc["method"]) == {"dp-feta", "dpdm", "dpgan", "dpkernel", "dpmerf", "dpntk", "gswgan"}
    assert len(acc) == 7 * 3 * 2 and set(acc["eps_target"]) == {1.0, 10.0}
    mnist = acc[(acc["method"] == "dpdm") & (acc["dataset"] == "mnist")].set_index("eps_target")["value"]
    assert mnist.to_dict() == {1.0: 0.892, 10.0: 0.977}
    dpdm = dib[(dib["method"] == "dpdm") & (dib["dataset"] == "mnist")].set_index("metric")["value"]
    assert dpdm.to_dict() == {"fid_train": 4.4, "precision": 0.63, "recall": 0.73}  # README §7, MNIST, ε = 10
    assert dib[(dib["method"] == "dpmerf") & (dib["dataset"] == "mnist")].shape[0] == 3  # our method names


def test_bench_run_with_the_new_evaluators_and_its_report(inception_cache, monkeypatch, cheap_fid, results,
                                                           cli_runner):
    """``bench run ... --eval fid,kid,prc,fid_train,gen2real_resnet`` (the dummy method, cheap
    features) records every new column; ``bench report`` shows them with their arrows."""
    from dpgen_bench.cli import cli

    counter = CountingExtractor(monkeypatch)
    res = cli_runner.invoke(cli, ["run", "--method", "dummy", "--dataset", "digits", "--eps", "10", "--preset",
                                  "tiny", "--eval", "fid,kid,prc,fid_train,gen2real_resnet", "--device", "cpu",
                                  "--out", str(results / "r")])
    assert res.exit_code == 0, res.output
    assert len(counter.sets) == 3  # the samples, the test split, the training split: once each
    ev = json.loads((results / "r" / "eval.json").read_text())
    assert {"fid", "kid", "kid_std", "precision", "recall", "density", "coverage", "fid_train",
            "gen2real_resnet"} == set(ev["metrics"])
    assert ev["protocol"]["fid_train"]["real_split"] == "train" and ev["protocol"]["prc"]["real_split"] == "test"
    rep = cli_runner.invoke(cli, ["report", "--results", str(results), "--layout", "b"])
    assert rep.exit_code == 0, rep.stderr
    for col in ("fid_train ↓", "gen2real_resnet ↑", "precision ↑", "recall ↑", "density ↑", "coverage ↑"):
        assert col in rep.output, rep.output
