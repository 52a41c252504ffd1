"""GAN-Leaks membership inference (Chen, Yu, Zhang, Fritz; CCS 2020), the protocol of
DPAF appendix A.13 / Table 18: train on a small member set (``bench run ... --members 64``
or ``128``), use the same number of held-out test images as non-members, score each
query by how well the generator reconstructs it, report the ROC AUC (scikit-learn).

Attacks (score = − reconstruction distance; a higher score says "member"):

- full black-box: the attacker sees k generated samples only; L2 distance to the nearest
  of them (batched ``torch.cdist``). For a conditional generator the k samples are drawn
  with the query's label (k per class; GAN-Leaks is unconditional: same-class search is
  the natural, stronger, adaptation).
- partial black-box: the attacker can feed latent codes (and the label) and see outputs,
  no gradients: a derivative-free (1+λ) evolution strategy on z from the best of R
  random starts. GAN-Leaks uses Powell's method here; the ES is its batched equivalent.
- white-box: gradient-based latent optimisation with L-BFGS (as GAN-Leaks).
  Both latent attacks minimise GAN-Leaks' objective, the per-pixel mean squared error
  plus ``mia_lambda``·(‖z‖² − d)² (their LAMBDA3 = 0.001), and their distance is that
  mean squared error (``dpgen_bench.attacks`` lists the departures).
- ``_calibrated``: the same distance minus the distance under a reference generator
  trained (non-privately, the ``gan`` method) on data disjoint from members and
  non-members: the training split without the members (GAN-Leaks §5.4 "calibration"; their
  ``eval_roc.py`` subtracts the same quantities: L2 for full black-box, the mean squared
  error for the others). The reference model is cached per (dataset, member set, seed,
  settings).

Beside each AUC the protocol records its uncertainty (``auc_uncertainty``, from
``dpgen_bench.auc``): DeLong's standard error, a 95 % interval, the spread an AUC of no leak
has at these sizes (±0.051 at 64 members against 64 non-members) and the one-sided
Mann–Whitney p-value of "members score higher". An AUC of 0.58 on 64 members is 1.6 null
standard deviations from 0.5: not evidence of a leak by itself.

Departures from GAN-Leaks: no LPIPS term (it needs downloaded weights); derivative-free
ES instead of Powell for partial black-box; the best of R random starts (the objective's
earlier, weaker prior: CHANGELOG.md). ROC points are saved in the protocol for plotting.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dpgen_bench.api import EvalInput, Evaluator, Method, Split
from dpgen_bench.attacks import full_black_box_distance, partial_black_box_distance, white_box_distance
from dpgen_bench.auc import auc_summary
from dpgen_bench.privacy.audit_bounds import roc_epsilon_lower_bound

log = logging.getLogger("dpgen_bench")

DEFAULTS = {
    "mia_k": 2000,  # generated samples per class for full black-box
    "mia_restarts": 8,  # random starts for latent optimisation
    "mia_steps": 100,  # ES generations / L-BFGS iterations
    "mia_lambda": 0.001,  # weight of the latent prior (‖z‖² − d)² (GAN-Leaks LAMBDA3)
    "mia_reference_steps": 1500,
}


def _opt(run: EvalInput, key: str):
    return run.options.get(key, DEFAULTS[key])


def queries(data) -> tuple[Split, Split]:
    """Members (the run's member images, never its audit canaries) and non-members (held-out
    test images). Under ``bench audit --members N`` the training split is the N members
    followed by the included canaries (negated images with wrong labels): counting those as
    members against natural non-members would score the canaries' oddness, not a leak."""
    if data.member_indices is None:
        raise ValueError("membership inference needs a member subset: run with --members N")
    members = data.train.subset(np.arange(len(data.member_indices)))  # with_canaries appends after them
    return members, data.test.subset(data.nonmember_indices)


ATTACKS = {
    "full_black_box": lambda m, x, y, run, seed: full_black_box_distance(
        m, x, y, _opt(run, "mia_k"), run.data.num_classes, seed),
    "partial_black_box": lambda m, x, y, run, seed: partial_black_box_distance(
        m, x, y, restarts=_opt(run, "mia_restarts"), steps=_opt(run, "mia_steps"), lam=_opt(run, "mia_lambda"),
        seed=seed),
    "white_box": lambda m, x, y, run, seed: white_box_distance(
        m, x, y, restarts=_opt(run, "mia_restarts"), steps=_opt(run, "mia_steps"), lam=_opt(run, "mia_lambda"),
        seed=seed),
}


# ------------------------------------------------------------- reference model


def _cache_dir() -> Path:
    """Where reference generators are cached: ``cache_dir("mia_reference")``."""
    from dpgen_bench.cache import cache_dir

    return cache_dir("mia_reference")


def reference_generator(run: EvalInput) -> Method:
    """A non-private ``gan`` trained on the training split without the members; cached."""
    from dpgen_bench import registry, store
    from dpgen_bench.api import Budget, DataInfo
    from dpgen_bench.config import resolve_hparams
    from dpgen_bench.context import TrainingContext
    from dpgen_bench.data import load_dataset
    from dpgen_bench.privacy import PrivacyLedger

    GAN = registry.methods.get("gan")

    data = run.data
    # member indices are into the training split the run used (minus the validation part under val)
    full = load_dataset(data.name, data.eval_split, root=run.options.get("data_root"))
    keep = np.setdiff1d(np.arange(len(full.train)), data.member_indices)
    steps = int(_opt(run, "mia_reference_steps"))
    try:
        hp, _ = resolve_hparams(GAN, "quick", data.name, {"steps": steps})
    except Exception:  # noqa: BLE001 - no quick preset for this dataset: defaults
        hp = GAN.Hparams(steps=steps)
    key = hashlib.sha1(repr((data.name, data.eval_split, keep.tobytes(), run.seed, hp)).encode()).hexdigest()[:16]
    path = _cache_dir() / f"{data.name}-{key}.pt"
    info = DataInfo(data.name, data.image_shape, data.num_classes, len(keep))
    model = GAN(hp, info)
    if path.is_file():
        try:
            model.load_state_dict(torch.load(path, weights_only=True, map_location="cpu"))
            return model
        except Exception:  # noqa: BLE001 - a corrupt cache is rebuilt
            log.warning("rebuilding corrupt MIA reference cache %s", path)
    log.info("training the MIA reference generator on %d non-member training images", len(keep))
    budget = Budget(float("inf"))
    torch.manual_seed(run.seed)
    model.fit(full.train.subset(keep), budget, TrainingContext(run.device, run.seed, PrivacyLedger(budget, [])))
    path.parent.mkdir(parents=True, exist_ok=True)
    with store.atomic_open(path) as f:
        torch.save({k: v for k, v in model.state_dict().items() if k in ("G", "D")}, f)
    return model


# ----------------------------------------------------------------- evaluators


class _MIA(Evaluator):
    attack: str
    calibrated: bool = False
    higher_is_better = False  # the Evaluator contract asks for a direction; ``ideal`` says what is best
    ideal = 0.5  # ROC AUC of an attack that learns nothing: no leakage
    needs_members = True  # the runner refuses the evaluator without --members N, before training
    needs_latent = False  # attacks that search the latent space need generate(z, labels)

    def evaluate(self, run: EvalInput) -> dict[str, Any]:
        from sklearn.metrics import roc_auc_score, roc_curve

        if run.method is None:
            return {"metrics": {}, "protocol": {"skipped": "needs the trained method"}}
        if run.data.member_indices is None:
            return {"metrics": {}, "protocol": {"skipped": "needs a member subset: run with --members N"}}
        if self.attack != "full_black_box" and run.method.latent_dim is None:
            return {"metrics": {}, "protocol": {"skipped": f"'{run.method.name}' exposes no latent input"}}
        members, nonmembers = queries(run.data)
        x = torch.cat([members.images, nonmembers.images]).cpu()
        y = torch.cat([members.labels, nonmembers.labels]).cpu()
        is_member = np.r_[np.ones(len(members)), np.zeros(len(nonmembers))]
        dist = ATTACKS[self.attack](run.method, x, y, run, run.seed)
        proto: dict[str, Any] = {"attack": self.attack, "n_members": len(members), "n_nonmembers": len(nonmembers),
                                 "test_on": f"members vs non-members from the real {run.data.eval_split} split",
                                 "distance": "L2 in [-1, 1] pixel space" if self.attack == "full_black_box"
                                 else "per-pixel mean squared error in [-1, 1] pixel space"}
        if self.calibrated:
            ref = reference_generator(run)
            dist = dist - ATTACKS[self.attack](ref, x, y, run, run.seed)
            proto["reference"] = "gan on the training split minus members"
        score = -dist.detach().numpy()
        auc = float(roc_auc_score(is_member, score))
        fpr, tpr, _ = roc_curve(is_member, score)
        proto["roc"] = {"fpr": fpr.round(5).tolist(), "tpr": tpr.round(5).tolist()}
        # the ROC as an ε lower bound (one-sided Clopper-Pearson, every threshold at once); a
        # heuristic for many members of one model (not independent trials): bench audit certifies
        members_mask = is_member.astype(bool)
        pos, neg = score[members_mask], score[~members_mask]
        # how far this AUC is from "no leak": DeLong's SE, a 95 % interval, the null spread at
        # these sizes and the one-sided Mann-Whitney p-value (dpgen_bench.auc)
        proto["auc_uncertainty"] = auc_summary(pos, neg, confidence=0.95)
        proto["epsilon_lower_bound"] = roc_epsilon_lower_bound(
            pos, neg, delta=float(run.options.get("delta", 1e-5)), confidence=0.95)
        proto.update({k: _opt(run, k) for k in DEFAULTS if k != "mia_reference_steps" or self.calibrated})
        return {"metrics": {self.name: auc}, "protocol": proto}


def _make(attack: str, calibrated: bool):
    name = f"mia_auc_{attack}" + ("_calibrated" if calibrated else "")
    doc = f"GAN-Leaks {attack.replace('_', ' ')} membership-inference ROC AUC" + (" (calibrated)" if calibrated else "")
    return type(name, (_MIA,), {"name": name, "attack": attack, "calibrated": calibrated, "__doc__": doc,
                                "needs_latent": attack != "full_black_box"})


MIAFullBlackBox = _make("full_black_box", False)
MIAPartialBlackBox = _make("partial_black_box", False)
MIAWhiteBox = _make("white_box", False)
MIAFullBlackBoxCalibrated = _make("full_black_box", True)
MIAPartialBlackBoxCalibrated = _make("partial_black_box", True)
MIAWhiteBoxCalibrated = _make("white_box", True)
