"""FID / KID evaluator: converted weights equal the TorchScript port, caches are keyed and
reused, FID behaves (self ≈ 0, grows with a perturbation), small samples are flagged.

InceptionV3 at 299×299 costs about 0.25 CPU-s an image here, so only the weights test
and the FID-behaviour test run it (on 3 and 3 × 16 images); the cache and warning tests
count calls to a stand-in feature function instead.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil

import pytest
import torch

from dpgen_bench.api import EvalInput, ImageData, Split
from evaluators import fid as F

N = 16


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty DPGEN_CACHE and no in-process memo."""
    monkeypatch.setenv("DPGEN_CACHE", str(tmp_path / "cache"))
    F.clear_memory_cache()
    yield tmp_path / "cache"
    F.clear_memory_cache()


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    """The converted weights, made once for the module (tests copy them into their cache)."""
    mp = pytest.MonkeyPatch()
    mp.setenv("DPGEN_CACHE", str(tmp_path_factory.mktemp("weights")))
    try:
        yield F.converted_weights_path()
    finally:
        mp.undo()


@pytest.fixture
def warm_cache(cache, weights):
    cache.mkdir(parents=True, exist_ok=True)
    shutil.copy(weights, cache / weights.name)
    return cache


def _digits(n: int = N) -> torch.Tensor:
    from dpgen_bench.data.digits import load_digits_data

    return load_digits_data().test.images[:n].clone()


def _run(real: torch.Tensor, generated: torch.Tensor, name: str = "digits40", seed: int = 0) -> EvalInput:
    labels = torch.zeros(len(real), dtype=torch.long)
    data = ImageData(name=name, train=Split(real, labels), test=Split(real, labels), class_names=("0",))
    return EvalInput(data=data, images=generated, labels=None, method=None, device=torch.device("cpu"), seed=seed,
                     options={"fid_batch_size": 20})


def _fake_features(images: torch.Tensor) -> torch.Tensor:
    """A fixed random projection of the uint8 pixels to 2048-d: a deterministic function of
    the images, as InceptionV3 is, at no cost."""
    x = F.to_uint8_rgb(images).float().flatten(1) / 255
    return torch.relu(x @ torch.randn(x.shape[1], 2048, generator=torch.Generator().manual_seed(0)))


class FakeExtract:
    """Stands in for ``extract_features``, counting calls and images."""

    def __init__(self, monkeypatch):
        self.calls, self.images = 0, 0
        monkeypatch.setattr(F, "extract_features", self)

    def __call__(self, images, plan=None):
        self.calls += 1
        self.images += len(images)
        return _fake_features(images)


# ---------------------------------------------------------------------- (a) weights


def test_converted_weights_reproduce_the_torchscript_features(weights):
    fe = F.build_extractor("cpu", weights)
    ts = torch.jit.load(str(F.source_weights_path()), map_location="cpu").eval()
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (3, 3, 299, 299), generator=g, dtype=torch.uint8)
    with F._extraction_mode(F.ExtractionPlan.for_run("cpu", len(x))):  # inference mode, idle-CPU threads
        ours = fe(x)[0]
        ref = ts((x.float() - 128) / 128)  # the port takes TF's (x - 128) / 128 input at 299x299
    assert ours.shape == ref.shape == (3, 2048)
    assert (ours - ref).abs().max().item() <= 1e-4


# ---------------------------------------------------------------------- (b) conversion cache


def test_conversion_is_cached_by_source_hash_and_reused(cache, weights, monkeypatch, tmp_path):
    path = F.converted_weights_path()
    assert path.parent == cache and F.SOURCE_SHA1 in path.name
    assert not [p for p in cache.iterdir() if p.name.endswith(".tmp")]  # atomic: no temp file left
    state = torch.load(path, map_location="cpu", weights_only=True)
    assert len(state) == 94 * 6 + 2
    assert torch.isnan(state["fc.weight"]).all()  # no logits in the port: IS must not be computable
    source = torch.jit.load(str(F.source_weights_path())).state_dict()
    assert torch.equal(state["Mixed_7c.branch_pool.bn.bias"], source["net.layers.mixed_10.tower_2_conv.beta"])
    mtime = path.stat().st_mtime_ns

    def boom(_):
        raise AssertionError("converted again")

    monkeypatch.setattr(F, "convert_state_dict", boom)
    assert F.converted_weights_path() == path and path.stat().st_mtime_ns == mtime  # reused, not rewritten

    tampered = tmp_path / "default_1.pt"
    shutil.copy(F.source_weights_path(), tampered)
    with open(tampered, "ab") as f:
        f.write(b"\0")
    with pytest.raises(RuntimeError, match="sha1"):  # verified before use, cached or not
        F.converted_weights_path(tampered)


# ---------------------------------------------------------------------- (c) real statistics


def test_real_statistics_are_cached_on_disk(cache, monkeypatch):
    real = _digits(40)
    counter = FakeExtract(monkeypatch)
    first = F.KID().evaluate(_run(real, -real))
    assert counter.calls == 2 and not first["protocol"]["real_stats_from_cache"]
    path = cache / first["protocol"]["real_stats_cache"]
    assert path.exists() and "digits40-test-1x16x16-n40-" in path.name
    assert not [p for p in cache.iterdir() if p.name.endswith(".tmp")]

    F.clear_memory_cache()  # a new process: only the disk cache is left
    second = F.FID().evaluate(_run(real, real.flip(-1)))  # FID reads mu / sigma from the cache
    assert counter.calls == 3 and counter.images == 3 * 40  # the generated set only
    assert second["protocol"]["real_stats_from_cache"]
    stats = torch.load(path, weights_only=True)
    assert torch.allclose(stats["mu"], _fake_features(real).mean(0))

    kid = F.KID().evaluate(_run(real, real.flip(-1)))  # same samples: nothing extracted at all
    assert counter.calls == 3 and kid["protocol"]["real_stats_from_cache"]
    assert kid["protocol"]["generated_features_reused"]
    assert set(kid["metrics"]) == {"kid", "kid_std"} and kid["protocol"]["subset_size"] == 40

    other = F.KID().evaluate(_run(real[:39], real.flip(-1)))  # another n: another entry
    renamed = F.KID().evaluate(_run(real, real.flip(-1), name="other"))  # another dataset: another entry
    assert not other["protocol"]["real_stats_from_cache"] and not renamed["protocol"]["real_stats_from_cache"]
    assert len(list(cache.glob("real-*.pt"))) == 3


def test_a_corrupt_statistics_file_is_recomputed(cache, monkeypatch, caplog):
    real = _digits(40)
    counter = FakeExtract(monkeypatch)
    path = cache / F.KID().evaluate(_run(real, -real))["protocol"]["real_stats_cache"]
    path.write_bytes(b"not a torch file")
    F.clear_memory_cache()
    with caplog.at_level(logging.WARNING, logger="dpgen_bench"):
        out = F.KID().evaluate(_run(real, -real))
    assert not out["protocol"]["real_stats_from_cache"] and counter.calls == 4
    assert any("unreadable" in r.getMessage() for r in caplog.records)
    assert torch.load(path, weights_only=True)["features"].shape == (40, 2048)


# ---------------------------------------------------------------------- (d) FID behaves


def test_fid_of_a_set_with_itself_is_zero_and_grows_with_a_perturbation(warm_cache):
    real = _digits()
    noise = torch.randn(real.shape, generator=torch.Generator().manual_seed(0))
    fid, kid = {}, {}
    for level in (0.0, 0.3, 1.0):
        run = _run(real, (real + level * noise).clamp(-1, 1))
        if level != 0.3:  # torch-fidelity's FID takes eigvals of a 2048x2048 matrix: 7-15 s each here
            out = F.FID().evaluate(run)
            assert set(out["metrics"]) == {"fid"} and out["protocol"]["small_sample_warning"]
            fid[level] = out["metrics"]["fid"]
        kid[level] = F.KID().evaluate(run)["metrics"]["kid"]  # same features: memo hits
    assert out["protocol"]["real_stats_from_cache"] and out["protocol"]["extraction"]["compiled"]["generated"] is False
    assert abs(fid[0.0]) < 1e-2, fid
    assert fid[1.0] > fid[0.0] + 10.0, fid
    assert kid[1.0] > kid[0.3] > kid[0.0], kid


# ---------------------------------------------------------------------- (e) small samples


def test_small_samples_are_warned_about_and_recorded(cache, monkeypatch, caplog):
    FakeExtract(monkeypatch)
    real = _digits(40)
    with caplog.at_level(logging.WARNING, logger="dpgen_bench"):
        out = F.KID().evaluate(_run(real, real[:30]))
    p = out["protocol"]
    assert F.MIN_IMAGES == 2048 and p["small_sample_warning"] is True
    assert any("2048" in r.getMessage() for r in caplog.records if r.name == "dpgen_bench")
    assert (p["n_generated"], p["n_real"]) == (30, 40)
    assert F.SOURCE_SHA1 in p["extractor"] and "(16, 16) -> (299, 299)" in p["resize"]
    assert p["wall_time_s"] >= 0 and p["batch_size"] == 20 and p["device"] == "cpu"


def test_no_warning_from_the_threshold_on(cache, monkeypatch, caplog):
    FakeExtract(monkeypatch)
    monkeypatch.setattr(F, "MIN_IMAGES", 30)  # the rule at a size that costs nothing
    real = _digits(40)
    with caplog.at_level(logging.WARNING, logger="dpgen_bench"):
        at = F.KID().evaluate(_run(real, real[:30]))
        below = F.KID().evaluate(_run(real, real[:29]))
    assert at["protocol"]["small_sample_warning"] is False and below["protocol"]["small_sample_warning"] is True
    assert len([r for r in caplog.records if r.name == "dpgen_bench"]) == 1


# ---------------------------------------------------------------------- input format and plan


def test_images_become_uint8_rgb_for_torch_fidelity():
    x = torch.tensor([-1.0, -0.5, 0.0, 1.0, 2.0]).view(1, 1, 1, 5)
    u = F.to_uint8_rgb(x)
    assert u.dtype == torch.uint8 and u.shape == (1, 3, 1, 5)
    assert u[0, 0, 0].tolist() == [0, 64, 128, 255, 255] and torch.equal(u[:, 0], u[:, 2])
    ds = F.TensorImages(torch.zeros(4, 3, 8, 8))
    assert len(ds) == 4 and ds[0].shape == (3, 8, 8) and ds[0].dtype == torch.uint8
    with pytest.raises(ValueError):
        F.to_uint8_rgb(torch.zeros(2, 2, 8, 8))


def test_extraction_plan():
    plan = F.ExtractionPlan.for_run("cpu", 64)
    assert plan.forward_chunk == F.CPU_FORWARD_CHUNK and plan.inference_mode and plan.num_threads >= 1
    assert not plan.compiles(F.COMPILE_MIN_IMAGES - 1) and plan.compiles(F.COMPILE_MIN_IMAGES)
    assert F.ExtractionPlan.for_run("cpu", 4, num_threads=1).forward_chunk == 4
    assert F.ExtractionPlan.for_run("cpu", 64, num_threads=3).num_threads == 3
    gpu = F.ExtractionPlan.for_run("cuda", 64)
    assert gpu.num_threads is None and gpu.forward_chunk == 64 and not gpu.compiles(10**6)


@pytest.mark.slow
def test_compiled_extraction_matches_eager(warm_cache):
    images = _digits(10)  # 8 + 2: the last chunk is padded to the compiled shape
    plan = F.ExtractionPlan.for_run("cpu", 64)
    eager = F.extract_features(images, dataclasses.replace(plan, compile=False))
    compiled = F.extract_features(images, dataclasses.replace(plan, compile=True))
    assert F._EXTRACTORS[("cpu", True)].fallback is None
    assert compiled.shape == eager.shape == (10, 2048)
    assert (compiled - eager).abs().max().item() <= 1e-4
