"""Inception feature extractor: converted weights equal the TorchScript port, the
conversion is cached by source hash in the ``inception`` cache, images reach
torch-fidelity as uint8 RGB, the extraction plan, compiled extraction.

InceptionV3 at 299×299 costs about 0.25 CPU-s an image here, so only the weights test
runs it (on 3 images); the compiled-extraction test is marked slow.
"""

from __future__ import annotations

import dataclasses
import shutil

import pytest
import torch

from evaluators import inception as I


def _digits(n: int) -> torch.Tensor:
    from dpgen_bench.data.digits import load_digits_data

    return load_digits_data().test.images[:n].clone()


# ---------------------------------------------------------------------- weights


def test_converted_weights_reproduce_the_torchscript_features(inception_weights):
    fe = I.build_extractor("cpu", inception_weights)
    ts = torch.jit.load(str(I.source_weights_path()), map_location="cpu").eval()
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (3, 3, 299, 299), generator=g, dtype=torch.uint8)
    with I.extraction_mode(I.ExtractionPlan.for_run("cpu", len(x))):  # inference mode, idle-CPU threads
        ours = fe(x)[0]
        ref = ts((x.float() - 128) / 128)  # the port takes TF's (x - 128) / 128 input at 299x299
    assert ours.shape == ref.shape == (3, 2048)
    assert (ours - ref).abs().max().item() <= 1e-4


def test_conversion_is_cached_by_source_hash_and_reused(inception_cache, inception_weights, monkeypatch, tmp_path):
    path = I.converted_weights_path()
    assert path.parent == inception_cache and I.SOURCE_SHA1 in path.name
    assert inception_cache.parent.name == "cache" and inception_cache.name == "inception"  # $DPGEN_CACHE/inception
    assert not [p for p in inception_cache.iterdir() if p.name.endswith(".tmp")]  # atomic: no temp file left
    state = torch.load(path, map_location="cpu", weights_only=True)
    assert len(state) == 94 * 6 + 2
    assert torch.isnan(state["fc.weight"]).all()  # no logits in the port: IS must not be computable
    source = torch.jit.load(str(I.source_weights_path())).state_dict()
    assert torch.equal(state["Mixed_7c.branch_pool.bn.bias"], source["net.layers.mixed_10.tower_2_conv.beta"])
    mtime = path.stat().st_mtime_ns

    def boom(_):
        raise AssertionError("converted again")

    monkeypatch.setattr(I, "convert_state_dict", boom)
    assert I.converted_weights_path() == path and path.stat().st_mtime_ns == mtime  # reused, not rewritten

    tampered = tmp_path / "default_1.pt"
    shutil.copy(I.source_weights_path(), tampered)
    with open(tampered, "ab") as f:
        f.write(b"\0")
    with pytest.raises(RuntimeError, match="sha1"):  # verified before use, cached or not
        I.converted_weights_path(tampered)


# ---------------------------------------------------------------------- input format and plan


def test_images_become_uint8_rgb_for_torch_fidelity():
    x = torch.tensor([-1.0, -0.5, 0.0, 1.0, 2.0]).view(1, 1, 1, 5)
    u = I.to_uint8_rgb(x)
    assert u.dtype == torch.uint8 and u.shape == (1, 3, 1, 5)
    assert u[0, 0, 0].tolist() == [0, 64, 128, 255, 255] and torch.equal(u[:, 0], u[:, 2])
    ds = I.TensorImages(torch.zeros(4, 3, 8, 8))
    assert len(ds) == 4 and ds[0].shape == (3, 8, 8) and ds[0].dtype == torch.uint8
    with pytest.raises(ValueError):
        I.to_uint8_rgb(torch.zeros(2, 2, 8, 8))


def test_content_digest_depends_on_what_the_extractor_sees():
    x = _digits(4)
    assert I.content_digest(x) == I.content_digest(x.clone())
    assert I.content_digest(x) != I.content_digest(x.flip(-1))
    assert I.content_digest(x) != I.content_digest(x[:3])


def test_extraction_plan():
    plan = I.ExtractionPlan.for_run("cpu", 64)
    assert plan.forward_chunk == I.CPU_FORWARD_CHUNK and plan.num_threads >= 1
    assert not plan.compiles(I.COMPILE_MIN_IMAGES - 1) and plan.compiles(I.COMPILE_MIN_IMAGES)
    assert I.ExtractionPlan.for_run("cpu", 4, num_threads=1).forward_chunk == 4
    assert I.ExtractionPlan.for_run("cpu", 64, num_threads=3).num_threads == 3
    assert I.ExtractionPlan.for_run("cpu", 64, compile="off").compile is False
    gpu = I.ExtractionPlan.for_run("cuda", 64)
    assert gpu.num_threads is None and gpu.forward_chunk == 64 and not gpu.compiles(10**6)
    assert set(plan.to_json()) == {"device", "batch_size", "forward_chunk", "num_threads", "threads_rule", "compile"}


def test_extraction_runs_in_inference_mode_and_restores_threads():
    before = torch.get_num_threads()
    with I.extraction_mode(I.ExtractionPlan(num_threads=1)):
        assert torch.is_inference_mode_enabled() and torch.get_num_threads() == 1
    assert not torch.is_inference_mode_enabled() and torch.get_num_threads() == before


def test_features_are_memoised_per_content(monkeypatch):
    calls = []
    monkeypatch.setattr(I, "extract_features", lambda images, plan=None: calls.append(len(images)) or
                        torch.zeros(len(images), 2048))
    I.clear_memory_cache()
    plan = I.ExtractionPlan()
    a, b, c = _digits(3), _digits(3).flip(-1), -_digits(3)
    assert I.features_memoised(a, plan)[2] is False
    assert I.features_memoised(a.clone(), plan)[2] is True  # same content: no extraction
    I.features_memoised(b, plan)
    I.features_memoised(c, plan)  # the memo holds the last two sets: a is forgotten
    assert I.features_memoised(a, plan)[2] is False and len(calls) == 4
    I.clear_memory_cache()


@pytest.mark.slow
def test_compiled_extraction_matches_eager(warm_inception_cache):
    images = _digits(10)  # 8 + 2: the last chunk is padded to the compiled shape
    plan = I.ExtractionPlan.for_run("cpu", 64)
    eager = I.extract_features(images, dataclasses.replace(plan, compile=False))
    compiled = I.extract_features(images, dataclasses.replace(plan, compile=True))
    assert I.get_extractor("cpu", compiled=True).fallback is None and I.compile_fallback("cpu") is None
    assert compiled.shape == eager.shape == (10, 2048)
    assert (compiled - eager).abs().max().item() <= 1e-4
