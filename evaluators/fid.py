"""FID, KID, precision / recall (with density / coverage) and FID against the training split,
computed by torch-fidelity (Obukhov et al., https://github.com/toshas/torch-fidelity, v0.4.0)
on the 2048-d pool3 features of its ``inception-v3-compat`` InceptionV3
(``evaluators.inception``: weights, input quantisation, resize, extraction settings and caches).

Evaluators and the real split each compares with:

- ``fid``, ``kid``, ``prc``: the run's evaluation split (the real test split; the validation
  part under ``--eval-split val``), the seed papers' protocol (Private GANs, DPAF, DP-GAN-DPAC).
- ``fid_train``: the training split the method was trained on (the members under
  ``--members``, the included canaries under ``--canaries``, the training split minus the
  validation part under ``--eval-split val``): DPImageBench's protocol (its
  ``evaluation/evaluator.py``: ``FID().compute_metric(train_feat, None, gen_feat)``). Privacy:
  the training split's features and statistics are computed by the evaluator and cached on
  this machine (``$DPGEN_CACHE/inception``); the method never sees or releases them, but a
  published ``fid_train`` is one more function of the private data, outside ε (as in
  DPImageBench).

One feature pass. Each evaluator extracts the generated set's features first through
``inception.features_memoised`` (memoised in the process), then reads the real split's
features, mu and sigma from the disk cache of ``inception.real_statistics`` (keyed by
dataset, split, image size, n, content digest and extractor; the preprocessing is fixed, see
``evaluators.inception``): a run asking for any of ``fid, kid, prc, fid_train`` runs
InceptionV3 once over its samples, and once over each real split the first time it is seen.

Metrics. The Fréchet distance is torch-fidelity's ``fid_statistics_to_metric`` (Heusel et al.
2017's formula; tr √(Σ₁Σ₂) as the sum of the square roots of the product's eigenvalues, where
the reference TTUR ``fid.py`` takes ``scipy.linalg.sqrtm`` with a 1e-6 ridge when that fails:
equal for well-conditioned covariances, not always for singular ones) on statistics from its
``fid_features_to_statistics``. KID (Bińkowski et al. 2018, "Demystifying MMD GANs") is its
``kid_features_to_metric`` (cubic polynomial kernel, 100 subsets of min(1000, n_gen, n_real)
images, seeded by the run). FID is
biased upwards for small sets: at 2,048 images or fewer on either side (the 2048-d
covariance of n images has rank ≤ n − 1, so it is singular) the result carries a warning.

``prc``: improved precision and recall (Kynkäänniemi et al., NeurIPS 2019) from torch-fidelity's
``prc_features_to_metric`` with k = 3 (``prc_neighborhood``, torch-fidelity's default): a
generated image is precise if it lies within the distance of some real image to that image's
3rd nearest real neighbour, a real image is recalled if it lies within some generated image's
3-NN ball. Density and coverage (Naeem et al., ICML 2020, "Reliable Fidelity and Diversity
Metrics for Generative Models") with their k = 5, on torch-fidelity's batched ``cdist``
helper (:func:`density_coverage`). Departures, all recorded in the protocol:

- Sample counts: all generated images against the whole evaluation split (digits: 360 test
  images; MNIST: 10,000). The papers use 50,000 / 10,000 per side; DPImageBench its
  60,000 synthetic images against the whole training split. Precision and recall depend on
  the sample counts (a larger real set draws a larger manifold): compare them at equal counts.
- Reference split: DPImageBench computes precision / recall against the *training* split's
  features; ``prc`` uses the evaluation split, as ``fid`` (no private statistics).
- Same k: DPImageBench's ``PrecisionRecall(num_neighbors=4)`` (the ``fld`` package) counts the
  point itself among its 4 neighbours, i.e. k = 3 as here.
- Ties: a point on a ball's boundary counts as inside (≤, Kynkäänniemi et al.'s definition and
  torch-fidelity's code); ``fld`` and Naeem et al.'s ``prdc`` code use <. They differ only on
  exact ties (e.g. duplicated images).
- Extractor: DPImageBench's ``fld`` uses pytorch-fid's InceptionV3 (the same TF weights, but
  PyTorch's bilinear resize); here the TF1-compatible resize of torch-fidelity.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch
from torch import Tensor

from dpgen_bench.api import EvalInput, Evaluator, ImageData
from evaluators import inception

log = logging.getLogger("dpgen_bench")

MIN_IMAGES = 2048  # this many or fewer on either side: small-sample warning (n images: covariance rank ≤ n − 1)
PRC_NEIGHBOURHOOD = 3  # k of precision / recall: Kynkäänniemi et al., torch-fidelity's default, DPImageBench's
DC_NEIGHBOURHOOD = 5  # k of density / coverage: Naeem et al.'s recommended value
PRC_BATCH = 10_000  # rows per cdist block (torch-fidelity's prc_batch_size default)
PRC_FULL_MAX = 10_000  # up to this many images a side the distance matrices are built whole


def training_split_name(data: ImageData) -> str:
    """What ``data.train`` holds, for cache keys and protocols."""
    name = "train" if data.eval_split == "test" else "train-minus-val"
    if data.member_indices is not None:
        name += f"-members{len(data.member_indices)}"
    if data.canary_included is not None:
        name += f"-canaries{int(data.canary_included.sum())}"
    return name


class _InceptionEvaluator(Evaluator):
    """What the Inception-feature evaluators share: checks, the small-sample warning, the
    features of both sets (generated first, then the real split's cached ones) and protocol."""

    higher_is_better = False
    reference = "eval"  # the real split compared with: "eval" (data.test) or "train" (data.train)

    def _real(self, data: ImageData) -> tuple[Tensor, str]:
        if self.reference == "train":
            return data.train.images, training_split_name(data)
        return data.test.images, data.eval_split

    def _features(self, run: EvalInput) -> tuple[Tensor, dict[str, Tensor], dict[str, Any], float,
                                                   inception.ExtractionPlan]:
        """(generated features, real statistics, protocol, start time, extraction plan):
        one pass of the extractor over each set, shared by every evaluator here."""
        import torch_fidelity

        t0 = time.perf_counter()
        device = torch.device(run.device)
        batch_size = int(run.options.get("fid_batch_size", inception.DEFAULT_BATCH_SIZE))
        real_images, split = self._real(run.data)
        n_gen, n_real = len(run.images), len(real_images)
        if n_gen < 2 or n_real < 2:
            raise ValueError(f"{self.name}: need at least 2 images on each side (generated {n_gen}, real {n_real})")
        small = n_gen <= MIN_IMAGES or n_real <= MIN_IMAGES
        if small:
            log.warning("%s on %d generated vs %d real images (≤ %d on a side): biased, not comparable with "
                        "published numbers", self.name.upper(), n_gen, n_real, MIN_IMAGES)
        threads = run.options.get("fid_num_threads")
        plan = inception.ExtractionPlan.for_run(device, batch_size, None if threads is None else int(threads),
                                                run.options.get("fid_compile", "auto"))
        # the generated set first: it is then the newest memo entry, and extracting a real split
        # (evicting the oldest) cannot push it out before the next evaluator of the run reads it
        gen, _, memo = inception.features_memoised(run.images, plan)
        real, path, cached = inception.real_statistics(run.data.name, split, real_images, plan)
        protocol = {
            "n_generated": n_gen,
            "n_real": n_real,
            "real_split": split,
            "test_on": f"real {split} ({n_real})",
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
        protocol["metric"] = "torch_fidelity.metric_fid.fid_statistics_to_metric (eigenvalues of Σ₁Σ₂)"
        return self._finish({self.name: float(fid)}, protocol, t0)


class FIDTrain(FID):
    """FID to the training split the method was trained on (DPImageBench's protocol)."""

    name = "fid_train"
    reference = "train"

    def evaluate(self, run: EvalInput) -> dict[str, Any]:
        out = super().evaluate(run)
        out["protocol"]["privacy_note"] = ("reference statistics of the private training split, computed by the "
                                           "evaluator and cached locally; not released by the method, not in ε")
        return out


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


def density_coverage(generated: Tensor, real: Tensor, k: int = DC_NEIGHBOURHOOD,
                     batch_size: int = PRC_BATCH) -> tuple[float, float]:
    """Density and coverage of Naeem et al. (2020), eqs. (3) and (4): with r_i the distance of
    real point X_i to its k-th nearest other real point and B_i the ball of radius r_i around it,
    density = 1/(k M) Σ_j Σ_i 1[Y_j ∈ B_i] over the M generated points Y_j, coverage = 1/N Σ_i
    1[∃ j: Y_j ∈ B_i] over the N real points. Distances by torch-fidelity's ``calc_cdist_part``
    (blocks of ``batch_size`` rows), the ball closed (≤) as in its precision / recall."""
    from torch_fidelity.metric_prc import calc_cdist_part

    if len(real) <= k:
        raise ValueError(f"density / coverage with k = {k} need more than {k} real points, got {len(real)}")
    inside, covered = 0, []
    for block in real.split(batch_size):
        radii = calc_cdist_part(block, real, batch_size).kthvalue(k + 1, dim=1).values  # +1: the point itself
        within = calc_cdist_part(block, generated, batch_size) <= radii.unsqueeze(1)
        inside += int(within.sum())
        covered.append(within.any(dim=1))
    return inside / (k * len(generated)), torch.cat(covered).float().mean().item()


class PRC(_InceptionEvaluator):
    """Precision and recall (Kynkäänniemi et al. 2019, torch-fidelity, k = 3) with density and
    coverage (Naeem et al. 2020, k = 5) on the Inception pool features, to the real test split."""

    name = "prc"
    higher_is_better = True
    metric_names = ("precision", "recall", "density", "coverage")  # what it records (not its own name)

    def evaluate(self, run: EvalInput) -> dict[str, Any]:
        from torch_fidelity.metric_prc import KEY_METRIC_PRECISION, KEY_METRIC_RECALL, prc_features_to_metric

        gen, real, protocol, t0, plan = self._features(run)
        real_feats = real["features"]
        if len(gen) <= PRC_NEIGHBOURHOOD or len(real_feats) <= DC_NEIGHBOURHOOD:
            raise ValueError(f"prc: need more than {PRC_NEIGHBOURHOOD} generated and {DC_NEIGHBOURHOOD} real images "
                             f"(got {len(gen)}, {len(real_feats)})")
        save_ram = max(len(gen), len(real_feats)) > PRC_FULL_MAX  # n x n distances: 400 MB at 10,000
        device = torch.device(plan.device)
        gen_d, real_d = gen.to(device), real_feats.to(device)
        with inception.extraction_mode(plan):
            out = prc_features_to_metric(gen_d, real_d, prc_neighborhood=PRC_NEIGHBOURHOOD, prc_batch_size=PRC_BATCH,
                                         save_cpu_ram=save_ram, verbose=False)
            density, coverage = density_coverage(gen_d, real_d, DC_NEIGHBOURHOOD, PRC_BATCH)
        protocol.update({
            "metric": "torch_fidelity.metric_prc.prc_features_to_metric (Kynkäänniemi et al. 2019); density / "
                      "coverage: Naeem et al. 2020 (evaluators.fid.density_coverage)",
            "k_precision_recall": PRC_NEIGHBOURHOOD,
            "k_torch_fidelity_default": 3,
            "k_dpimagebench": "3 (fld PrecisionRecall num_neighbors=4 counts the point itself)",
            "k_density_coverage": DC_NEIGHBOURHOOD,
            "ball": "closed (<=): torch-fidelity; fld and prdc use <, which differs only on exact ties",
            "sample_counts": f"{len(gen)} generated vs {len(real_feats)} real {protocol['real_split']} (DPImageBench: "
                             "all synthetic vs the whole training split)",
            "save_cpu_ram": save_ram,
        })
        metrics = {"precision": float(out[KEY_METRIC_PRECISION]), "recall": float(out[KEY_METRIC_RECALL]),
                   "density": float(density), "coverage": float(coverage)}
        return self._finish(metrics, protocol, t0)
