"""``bench audit``'s flow: train one run with canaries, score them, write ``audit.json`` with a
measured lower bound on ε beside the accountant's (the bound's statistics are in
``privacy.audit_bounds``, the white-box canaries in ``privacy.canaries``, the GAN-Leaks
distances in ``attacks``).

One-run auditing (Steinke, Nasr, Jagielski, "Privacy Auditing with One (1) Training Run",
NeurIPS 2023): ``m`` canaries (``ImageData.with_canaries``: images of the whole training
split, each used at most once, turned negative with a wrong label, so unlike any real record
and unlike each other) each enter the training split independently with probability 1/2
(under ``--members N``: beside the N members); the run trains, samples and records as
``bench run`` does; then every canary is scored by each attack, and the number of correct
in/out guesses among the highest and lowest scores becomes an ε lower bound at ``confidence``
(``privacy.audit_bounds.best_one_run_bound``: the paper's theorem with δ, a union bound over the
(k₊, k₋) grid).

Scores use only what the DP guarantee covers (the adversary of the theorem sees the
mechanism's output):

- ``black_box``: GAN-Leaks full black-box, minus the distance from the canary to its
  nearest generated sample of the canary's label (G's samples);
- ``white_box_G``: GAN-Leaks white-box, minus the distance of the best reconstruction
  G(z*) by latent optimisation (G's weights; methods with a latent input);
- ``white_box_<part>``: each part a method names in ``released_parts`` (dpgan's D, trained
  by DPSGD: its logit on the canary). GS-WGAN's and DP-GAN-DPAC's discriminators are never
  released: not used.

Scores are uncalibrated (no reference model, no paired control). On one positive-control
run (the positive control below) white_box_D's raw logit gave 1.72; calibrated by D's logits under the other
labels 1.29-1.59, by its logit on the un-negated image 1.16, by D's loss difference 1.47;
black_box / white_box_G calibrated by their distances under other labels 0.85 / 0.21
against 0.78 / 0.89 raw: none kept.

Positive control (``tests/integration/test_audit_cli.py``, slow): the non-private ``gan``
with ``--preset memorise --members 16 --canaries 256`` (~3 min on one core) gives
white_box_D ≈ 2.6 at 95 % (101/102 correct guesses), black_box and white_box_G ≈ 1; the
canaries' distinct images are what make it work (a member-only pool of 16 images gave 0.85).

The bound is for this run's mechanism and these attacks; far below the accountant's ε is
normal for GANs (the accountant bounds the worst case over all datasets and adversaries).
A bound *above* the accountant's ε is a privacy or audit bug: ``audit.json`` records it as a
violation and the command fails.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Any

import torch
from sklearn.metrics import roc_auc_score

from . import runner, store
from .api import Method, Split
from .attacks import full_black_box_distance, white_box_distance
from .config import RunConfig
from .errors import PrivacyViolation, UserError
from .privacy.accounting import privacy_profile
from .privacy.audit_bounds import best_one_run_bound, fdp_gaussian_bound, profile_rejected

log = logging.getLogger("dpgen_bench")

DEFAULT_GRADIENT_CANARIES = 1000  # per private part (white-box): Dirac coordinates or sanitiser directions
DEFAULT_CANARIES = 500  # digits: ~250 included beside 1,437 real records; the bound's ceiling ~4.5 at 95 %
BLACK_BOX_SAMPLES = 2000  # generated samples per class for the nearest-neighbour score
WHITE_BOX = dict(restarts=4, steps=50, lam=0.001)  # GAN-Leaks latent optimisation, lighter than mia_*'s


def score_canaries(method: Method, canaries: Split, seed: int) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """{attack: one score per canary (higher: "included")}, {attack: the output it reads}."""
    x, y = canaries.images.cpu(), canaries.labels.cpu()
    k = method.info.num_classes
    scores = {"black_box": -full_black_box_distance(method, x, y, BLACK_BOX_SAMPLES, k, seed)}
    used = {"black_box": f"G's samples ({BLACK_BOX_SAMPLES} per class)"}
    if method.latent_dim is not None:
        scores["white_box_G"] = -white_box_distance(method, x, y, seed=seed, **WHITE_BOX).detach()
        used["white_box_G"] = "G's weights (latent reconstruction)"
    for part, s in method.released_scores(x, y).items():
        if part not in method.released_parts:
            raise ValueError(f"{method.name}.released_scores returned '{part}', not in released_parts")
        scores[f"white_box_{part}"] = s.detach().cpu().flatten()
        used[f"white_box_{part}"] = f"{part}'s weights ({part}'s logit on the canary)"
    return scores, used


TESTS_PER_ATTACK = 2  # the ε-bound against the accountant's ε, and the accountant's whole curve


def per_attack_confidence(confidence: float, attacks: int) -> float:
    """The level each of ``attacks`` bounds is computed at so that all hold together with
    probability ≥ ``confidence`` (union bound: 1 − (1 − confidence) / attacks)."""
    return 1.0 - (1.0 - confidence) / max(1, attacks)


def attack_bounds(scores, included, *, delta: float, confidence: float,
                  profile: list[tuple[float, float]] | None) -> dict[str, Any]:
    """One attack's statistics, each at ``confidence``: Steinke et al.'s ε lower bound (the
    keys of ``best_one_run_bound``), Mahloujifar et al.'s Gaussian-curve audit
    (``fdp_gaussian``: the largest rejected μ and its ε at δ, the paper's "empirical ε",
    descriptive) and whether the guesses reject the accountant's whole privacy profile
    (``accountant_curve_rejected``; None for a run without one). The two tests that can raise a
    violation (ε-bound > the accountant's ε, curve rejected) are why each attack counts as
    ``TESTS_PER_ATTACK`` tests in the union bound."""
    bound = best_one_run_bound(scores, included, delta=delta, confidence=confidence)
    gdp = fdp_gaussian_bound(scores, included, delta=delta, confidence=confidence)
    bound["fdp_gaussian"] = {k: gdp[k] for k in ("mu_lower_bound", "epsilon", "guesses", "correct")}
    bound["accountant_curve_rejected"] = (None if profile is None else
                                          profile_rejected(scores, included, profile=profile,
                                                           confidence=confidence)["rejected"])
    bound["auc"] = float(roc_auc_score(included, scores))  # diagnostic: how well the score separates at all
    return bound


def _profile(p) -> list[tuple[float, float]] | None:
    """The accountant's privacy profile of the run's parts (None: not private, or noise off)."""
    if not p.budget.private or p.ledger.noise_off:
        return None
    return privacy_profile(list(p.ledger.report().parts), p.budget.delta)


def _violations(attacks: dict[str, dict[str, Any]], eps_rdp: float) -> list[str]:
    return sorted(a for a, r in attacks.items()
                  if r["epsilon_lower_bound"] > eps_rdp or r.get("accountant_curve_rejected"))


def run_audit(config: RunConfig, *, out: str | None = None, results: str | None = None,
              data_root: str | None = None, confidence: float = 0.95) -> dict[str, Any]:
    """Train one run with ``config.canaries`` image canaries (or ``config.gradient_canaries``
    white-box gradient canaries in every private part), score them, write ``audit.json``."""
    if config.gradient_canaries:
        return run_white_box_audit(config, out=out, results=results, data_root=data_root, confidence=confidence)
    if not config.canaries:
        raise ValueError("run_audit needs config.canaries or config.gradient_canaries")
    p = runner.prepare(config, data_root)
    run_dir = runner.prepare_out_dir(config, out, results)
    log.info("audit: %d canaries, %d of them in the training split (N = %d)", config.canaries,
             int(p.data.canary_included.sum()), len(p.data.train))
    t0 = time.time()
    record = runner.execute(p, Path(run_dir))
    t_run = time.time() - t0
    scores, used = score_canaries(p.method, p.data.canaries, config.seed)
    delta = p.budget.delta
    # a violation is declared when ANY attack's bound exceeds the accountant's ε or rejects its
    # curve: each of the 2A tests is at 1 − β/(2A) (Bonferroni), so the false alarm rate is ≤ β
    per_attack = per_attack_confidence(confidence, TESTS_PER_ATTACK * len(scores))
    profile = _profile(p)
    attacks = {name: attack_bounds(s.numpy(), p.data.canary_included, delta=delta, confidence=per_attack,
                                   profile=profile) for name, s in scores.items()}
    eps = record["privacy"]["epsilon"]
    eps_rdp = float(eps["rdp"])
    violations = _violations(attacks, eps_rdp)
    audit = {
        "method": config.method, "dataset": config.dataset, "seed": config.seed,
        "canaries": config.canaries, "included": int(p.data.canary_included.sum()),
        "canary_kind": "training images, each used once, turned negative (x → −x) with a different random label",
        "confidence": confidence, "confidence_per_attack": per_attack, "delta": delta,
        "epsilon_accountant": {"rdp": eps_rdp, "prv": float(eps["prv"])},
        "attacks": attacks, "outputs_used": used,
        "violation": violations,
        "timings": {"run": t_run, "scoring": time.time() - t0 - t_run},
    }
    store.write_json(Path(run_dir) / store.AUDIT_FILE, audit)
    if violations and math.isfinite(eps_rdp) and not record["privacy"].get("noise_off"):
        raise PrivacyViolation(f"audit of {run_dir}: {', '.join(violations)} exceeds the accountant's ε = "
                               f"{eps_rdp:.4g} or rejects its privacy curve: a privacy or audit bug (audit.json "
                               "keeps the evidence)")
    return {"run_dir": str(run_dir), **audit}


def run_white_box_audit(config: RunConfig, *, out: str | None = None, results: str | None = None,
                        data_root: str | None = None, confidence: float = 0.95) -> dict[str, Any]:
    """The white-box audit (``privacy.canaries``): ``config.gradient_canaries`` canaries inside
    each private part the method announces (``RunContext.watch``), on the real training split
    (the canaries are gradients, not records of the data, so N and the plan are the run's
    own). One bound per part, each at 1 − β/A over the A parts; each is a lower bound on that
    part's ε alone, which is at most the run's composed ε, so a part's bound above the
    accountant's ε of the whole run is a violation. Parts the method did not announce and
    one-coordinate releases (dpmerf's count) are listed as not observed; a release with fewer
    coordinates than canaries gets one canary per coordinate ("count" in ``parts_observed``)."""
    from .privacy.canaries import GradientAudit

    if not config.gradient_canaries:
        raise ValueError("run_white_box_audit needs config.gradient_canaries")
    p = runner.prepare(config, data_root)
    if not p.budget.private or p.ledger.noise_off:
        raise UserError("a white-box audit needs a private run (a finite --eps, noise on)")
    why = getattr(p.method, "white_box_unsupported", None)
    if why:  # before training: the canaries would find no announced part afterwards
        raise UserError(f"method '{config.method}' cannot be audited white-box ({why}); use bench audit without "
                        "--white-box")
    run_dir = runner.prepare_out_dir(config, out, results)
    gradient_audit = GradientAudit(config.gradient_canaries, config.seed)
    log.info("white-box audit: %d gradient canaries in each private part", config.gradient_canaries)
    t0 = time.time()
    record = runner.execute(p, Path(run_dir), audit=gradient_audit)
    planned = p.ledger.planned
    if not gradient_audit.parts:
        raise UserError(f"method '{config.method}' announced no private part (RunContext.watch): nothing to audit "
                        "white-box; use bench audit without --white-box")
    watched = {name: c for name, c in gradient_audit.parts.items() if not c.too_small}
    if not watched:
        raise UserError(f"method '{config.method}' has no private part large enough for canaries (one coordinate "
                        "each): nothing to audit white-box; use bench audit without --white-box")
    per_attack = per_attack_confidence(confidence, TESTS_PER_ATTACK * len(watched))
    profile = _profile(p)
    attacks, observed = {}, {}
    for name, canaries in watched.items():
        bound = attack_bounds(canaries.scores, canaries.included, delta=p.budget.delta, confidence=per_attack,
                              profile=profile)
        bound["releases"] = canaries.steps
        score = getattr(canaries, "score_kind", "sum")
        if score == "mixture":  # the plain signed sum's separation beside it (a diagnostic)
            bound["auc_signed_sum"] = float(roc_auc_score(canaries.included, canaries.signed_sums))
        attacks[f"white_box_grad_{name}"] = bound
        observed[name] = {"canaries": type(canaries).__name__, "count": len(canaries.included),
                          "releases": canaries.steps, "score": score,
                          "sample_rate": canaries.sample_rate,
                          "noise_multiplier": planned[name].noise_multiplier if name in planned else None}
    eps = record["privacy"]["epsilon"]
    eps_rdp = float(eps["rdp"])
    violations = _violations(attacks, eps_rdp)
    audit = {
        "method": config.method, "dataset": config.dataset, "seed": config.seed, "mode": "white_box",
        "canaries": config.gradient_canaries,
        "canary_kind": "inside each private part's release: Dirac (±C·e_i) in a DP optimizer, orthogonal "
                       "worst-case changes of the clipped batch in a sanitiser, Δ·e_i in a one-shot sum; "
                       "included w.p. 1/2, sampled at the part's rate; scored by the signed sum over releases "
                       "or, where a part says so (GS-WGAN's 1/K), each release's likelihood ratio",
        "confidence": confidence, "confidence_per_attack": per_attack, "delta": p.budget.delta,
        "epsilon_accountant": {"rdp": eps_rdp, "prv": float(eps["prv"])},
        "attacks": attacks, "parts_observed": observed,
        "parts_not_observed": sorted(set(planned) - set(watched)),
        "violation": violations, "timings": {"run": time.time() - t0},
    }
    store.write_json(Path(run_dir) / store.AUDIT_FILE, audit)
    if violations:
        raise PrivacyViolation(f"audit of {run_dir}: the white-box audit of {', '.join(violations)} exceeds the "
                               f"accountant's ε = {eps_rdp:.4g} or rejects its privacy curve: a privacy bug "
                               "(audit.json keeps the evidence)")
    return {"run_dir": str(run_dir), **audit}


def summary_line(audit: dict[str, Any]) -> str:
    acc = audit["epsilon_accountant"]
    def one(a: str, r: dict[str, Any]) -> str:
        text = f"{a} {r['epsilon_lower_bound']:.3g} ({r['correct']}/{r['guesses']} correct"
        if "fdp_gaussian" in r:
            text += f"; Gaussian-curve ε {r['fdp_gaussian']['epsilon']:.3g}"
        if r.get("accountant_curve_rejected"):
            text += "; REJECTS the accountant's curve"
        return text + ")"
    bounds = ", ".join(one(a, r) for a, r in audit["attacks"].items())
    fmt = (lambda v: "∞" if math.isinf(v) else f"{v:.3g}")
    per = audit.get("confidence_per_attack", audit["confidence"])
    line = (f"audit: ε accountant {fmt(acc['rdp'])} (RDP) / {fmt(acc['prv'])} (PRV); ε lower bound at "
            f"{audit['confidence']:.0%} for all attacks together (each at {per:.2%}): {bounds}")
    if audit.get("parts_not_observed"):
        line += f"; parts not observed: {', '.join(audit['parts_not_observed'])}"
    return line
