"""FID and KID of the generated set against the real test split, computed by
torch-fidelity (Obukhov et al., https://github.com/toshas/torch-fidelity, v0.4.0) on the
2048-d pool3 features of its ``inception-v3-compat`` InceptionV3 (``evaluators.inception``:
weights, input quantisation, resize, extraction settings and caches).

Both evaluators use one pass of the extractor per image set: the real split's features,
mu and sigma come from the disk cache of ``inception.real_statistics``, and the generated
features are memoised in the process, so FID then KID on the same samples extract once.
The Fréchet distance is torch-fidelity's ``fid_statistics_to_metric`` (the reference TTUR
``fid.py``, Heusel et al. 2017) on statistics from its ``fid_features_to_statistics``; KID
(Bińkowski et al. 2018, "Demystifying MMD GANs") is its ``kid_features_to_metric`` (cubic
polynomial kernel, 100 subsets of min(1000, n_gen, n_real) images, seeded by the run). FID
is biased upwards for small sets: below 2,048 images on either side (the 2048-d covariance
is then singular) the result carries a warning.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch
from torch import Tensor

from dpgen_bench.api import EvalInput, Evaluator
from evaluators import inception

log = logging.getLogger("dpgen_bench")

MIN_IMAGES = 2048  # below this on either side: small-sample warning


class _InceptionEvaluator(Evaluator):
    """What FID and KID share: checks, the small-sample warning, features and protocol."""

    higher_is_better = False

    def _features(self, run: EvalInput) -> tuple[Tensor, dict[str, Tensor], dict[str, Any], float,
                                                   inception.ExtractionPlan]:
        """(generated features, real statistics, protocol, start time, extraction plan):
        one pass of the extractor over each set, shared by FID and KID."""
        import torch_fidelity

        t0 = time.perf_counter()
        device = torch.device(run.device)
        batch_size = int(run.options.get("fid_batch_size", inception.DEFAULT_BATCH_SIZE))
        real_images = run.data.test.images
        n_gen, n_real = len(run.images), len(real_images)
        if n_gen < 2 or n_real < 2:
            raise ValueError(f"{self.name}: need at least 2 images on each side (generated {n_gen}, real {n_real})")
        small = n_gen < MIN_IMAGES or n_real < MIN_IMAGES
        if small:
            log.warning("%s on %d generated vs %d real images (< %d on a side): biased, not comparable with "
                        "published numbers", self.name.upper(), n_gen, n_real, MIN_IMAGES)
        threads = run.options.get("fid_num_threads")
        plan = inception.ExtractionPlan.for_run(device, batch_size, None if threads is None else int(threads),
                                                run.options.get("fid_compile", "auto"))
        real, path, cached = inception.real_statistics(run.data.name, run.data.eval_split, real_images, plan)
        gen, _, memo = inception.features_memoised(run.images, plan)
        protocol = {
            "n_generated": n_gen,
            "n_real": n_real,
            "real_split": run.data.eval_split,
            "test_on": f"real {run.data.eval_split} ({n_real})",
            "dataset": run.data.name,
            "extractor": inception.extractor_description(),
            "torch_fidelity": torch_fidelity.__version__,
            "input": inception.QUANTISATION,
            "resize": f"{tuple(real_images.shape[2:])} -> (299, 299), {inception.RESIZE}",
            "real_stats_from_cache": cached,
            "real_stats_cache": path.name,
            "generated_features_reused": memo,
            "small_sample_warning": small,
            "batch_size": batch_size,
            "device": str(device),
            "extraction": {**plan.to_json(), "compiled": {"real": plan.compiles(n_real) and not cached,
                                                          "generated": plan.compiles(n_gen) and not memo}},
        }
        fallback = inception.compile_fallback(plan.device)
        if fallback:
            protocol["extraction"]["compile_fallback"] = fallback
        return gen, real, protocol, t0, plan

    @staticmethod
    def _finish(metrics: dict[str, float], protocol: dict[str, Any], t0: float) -> dict[str, Any]:
        protocol["wall_time_s"] = round(time.perf_counter() - t0, 3)
        return {"metrics": metrics, "protocol": protocol}


class FID(_InceptionEvaluator):
    """Fréchet Inception Distance (torch-fidelity, inception-v3-compat) to the real test split."""

    name = "fid"

    def evaluate(self, run: EvalInput) -> dict[str, Any]:
        from torch_fidelity.metric_fid import KEY_METRIC_FID, fid_features_to_statistics, fid_statistics_to_metric

        gen, real, protocol, t0, plan = self._features(run)
        with inception.blas_threads(plan.num_threads):
            stats_gen = fid_features_to_statistics(gen)
            stats_real = {"mu": real["mu"].numpy(), "sigma": real["sigma"].numpy()}
            fid = fid_statistics_to_metric(stats_gen, stats_real, verbose=False)[KEY_METRIC_FID]
        protocol["metric"] = "torch_fidelity.metric_fid.fid_statistics_to_metric (TTUR fid.py)"
        return self._finish({"fid": float(fid)}, protocol, t0)


class KID(_InceptionEvaluator):
    """Kernel Inception Distance (torch-fidelity, cubic polynomial kernel) to the real test split."""

    name = "kid"
    subsets = 100
    max_subset_size = 1000  # torch-fidelity's default

    def evaluate(self, run: EvalInput) -> dict[str, Any]:
        from torch_fidelity.metric_kid import KEY_METRIC_KID_MEAN, KEY_METRIC_KID_STD, kid_features_to_metric

        gen, real, protocol, t0, plan = self._features(run)
        subset = min(self.max_subset_size, len(gen), len(real["features"]))
        with inception.blas_threads(plan.num_threads):
            out = kid_features_to_metric(gen, real["features"], kid_subsets=self.subsets, kid_subset_size=subset,
                                         kid_kernel="poly", kid_kernel_poly_degree=3, kid_kernel_poly_gamma=None,
                                         kid_kernel_poly_coef0=1, rng_seed=run.seed, verbose=False)
        protocol.update({"metric": "torch_fidelity.metric_kid.kid_features_to_metric (unbiased MMD^2)",
                         "kernel": "polynomial, degree 3, gamma 1/2048, coef0 1", "subsets": self.subsets,
                         "subset_size": subset, "rng_seed": run.seed})
        if subset == len(gen) == len(real["features"]):
            protocol["kid_std_note"] = "every subset is the whole of both sets (n <= 1000): kid_std ~ 0 is no error bar"
        return self._finish({"kid": float(out[KEY_METRIC_KID_MEAN]), "kid_std": float(out[KEY_METRIC_KID_STD])},
                            protocol, t0)
