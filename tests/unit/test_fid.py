"""FID / KID evaluators: real statistics are cached on disk (in the ``inception`` cache)
and reused, features are extracted once for both metrics, FID behaves (self ≈ 0, grows
with a perturbation), small samples are flagged. The extractor itself is tested in
test_inception.py.

InceptionV3 at 299×299 costs about 0.25 CPU-s an image here, so only the FID-behaviour
test runs it (on 3 × 16 images); the cache and warning tests count calls to a stand-in
feature function instead.
"""

from __future__ import annotations

import logging

import torch

from dpgen_bench.api import EvalInput, ImageData, Split
from evaluators import fid as F
from evaluators import inception as I

N = 16


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
    x = I.to_uint8_rgb(images).float().flatten(1) / 255
    return torch.relu(x @ torch.randn(x.shape[1], 2048, generator=torch.Generator().manual_seed(0)))


class FakeExtract:
    """Stands in for ``extract_features``, counting calls and images."""

    def __init__(self, monkeypatch):
        self.calls, self.images = 0, 0
        monkeypatch.setattr(I, "extract_features", self)

    def __call__(self, images, plan=None):
        self.calls += 1
        self.images += len(images)
        return _fake_features(images)


# ---------------------------------------------------------------------- real statistics


def test_real_statistics_are_cached_on_disk(inception_cache, monkeypatch):
    real = _digits(40)
    counter = FakeExtract(monkeypatch)
    first = F.KID().evaluate(_run(real, -real))
    assert counter.calls == 2 and not first["protocol"]["real_stats_from_cache"]
    path = inception_cache / first["protocol"]["real_stats_cache"]
    assert path.exists() and "digits40-test-1x16x16-n40-" in path.name
    assert not [p for p in inception_cache.iterdir() if p.name.endswith(".tmp")]

    I.clear_memory_cache()  # a new process: only the disk cache is left
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
    assert len(list(inception_cache.glob("real-*.pt"))) == 3


def test_a_corrupt_statistics_file_is_recomputed(inception_cache, monkeypatch, caplog):
    real = _digits(40)
    counter = FakeExtract(monkeypatch)
    path = inception_cache / F.KID().evaluate(_run(real, -real))["protocol"]["real_stats_cache"]
    path.write_bytes(b"not a torch file")
    I.clear_memory_cache()
    with caplog.at_level(logging.WARNING, logger="dpgen_bench"):
        out = F.KID().evaluate(_run(real, -real))
    assert not out["protocol"]["real_stats_from_cache"] and counter.calls == 4
    assert any("unreadable" in r.getMessage() for r in caplog.records)
    assert torch.load(path, weights_only=True)["features"].shape == (40, 2048)


# ---------------------------------------------------------------------- FID behaves


def test_fid_of_a_set_with_itself_is_zero_and_grows_with_a_perturbation(warm_inception_cache):
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


# ---------------------------------------------------------------------- small samples


def test_small_samples_are_warned_about_and_recorded(inception_cache, monkeypatch, caplog):
    FakeExtract(monkeypatch)
    real = _digits(40)
    with caplog.at_level(logging.WARNING, logger="dpgen_bench"):
        out = F.KID().evaluate(_run(real, real[:30]))
    p = out["protocol"]
    assert F.MIN_IMAGES == 2048 and p["small_sample_warning"] is True
    assert any("2048" in r.getMessage() for r in caplog.records if r.name == "dpgen_bench")
    assert (p["n_generated"], p["n_real"]) == (30, 40)
    assert I.SOURCE_SHA1 in p["extractor"] and "(16, 16) -> (299, 299)" in p["resize"]
    assert p["wall_time_s"] >= 0 and p["batch_size"] == 20 and p["device"] == "cpu"


def test_no_warning_from_the_threshold_on(inception_cache, monkeypatch, caplog):
    FakeExtract(monkeypatch)
    monkeypatch.setattr(F, "MIN_IMAGES", 30)  # the rule at a size that costs nothing
    real = _digits(40)
    with caplog.at_level(logging.WARNING, logger="dpgen_bench"):
        at = F.KID().evaluate(_run(real, real[:31]))  # one more than the dimension: full rank possible
        below = F.KID().evaluate(_run(real, real[:30]))  # n = d: the covariance is singular
    assert at["protocol"]["small_sample_warning"] is False and below["protocol"]["small_sample_warning"] is True
    assert len([r for r in caplog.records if r.name == "dpgen_bench"]) == 1
