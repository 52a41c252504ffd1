"""Synthetic run records for report tests (the files bench run writes, minus the heavy ones)."""

import json
import math
from pathlib import Path


def make_record(root: Path, name: str, method: str, dataset: str, eps: float, seed: int, metrics: dict,
                rdp: float | None = None, prv: float | None = None, members: int | None = None,
                complete: bool = True, hparams: dict | None = None, preset: str = "quick",
                caveat: str | None = None) -> Path:
    d = root / name
    d.mkdir(parents=True)
    private = math.isfinite(eps)
    fe = (lambda x: x if math.isfinite(x) else "inf")  # noqa: E731
    (d / "config.json").write_text(json.dumps({
        "run_id": name, "method": method, "dataset": dataset, "epsilon": fe(eps), "delta": 1e-5,
        "preset": preset, "seed": seed, "members": members, "device": "cpu", "evaluators": list(metrics),
        "samples_per_class": 10, "hparams": hparams or {}}))
    (d / "privacy.json").write_text(json.dumps({
        "private": private, "target": {"epsilon": fe(eps), "delta": 1e-5},
        "parts": [{"name": "d", "mechanism": "subsampled_gaussian", "noise_multiplier": 1.0, "sample_rate": 0.1,
                   "steps": 10, "epsilon": rdp}] if private else [],
        "epsilon": {"rdp": fe(rdp if private else math.inf), "prv": fe(prv if private else math.inf)},
        "caveat": caveat}))
    if complete:
        (d / "eval.json").write_text(json.dumps({"metrics": metrics, "protocol": {}}))
    return d


def standard_records(root: Path) -> Path:
    """dpgan and dpaf on digits at ε ∈ {1, 10} with 2–3 seeds, gan once, one incomplete run."""
    vals = {
        ("dpgan", 1): [(0.50, 120.0), (0.54, 110.0), (0.52, 115.0)],
        ("dpgan", 10): [(0.70, 60.0), (0.74, 58.0)],
        ("dpaf", 1): [(0.56, 100.0), (0.60, 98.0), (0.58, 102.0)],
        ("dpaf", 10): [(0.72, 70.0), (0.70, 66.0), (0.71, 68.0)],
    }
    for (method, eps), runs in vals.items():
        for seed, (acc, fid) in enumerate(runs):
            make_record(root, f"{method}-digits-eps{eps}-s{seed}", method, "digits", float(eps), seed,
                        {"gen2real_cnn": acc, "fid": fid}, rdp=eps * 0.998, prv=eps * 0.92)
    make_record(root, "gan-digits-s0", "gan", "digits", math.inf, 0, {"gen2real_cnn": 0.9, "fid": 20.0})
    make_record(root, "dpgan-digits-eps1-m64-s0", "dpgan", "digits", 1.0, 0,
                {"mia_auc_full_black_box": 0.51, "mia_auc_white_box": 0.49}, rdp=0.99, prv=0.9, members=64)
    make_record(root, "gan-digits-m64-s0", "gan", "digits", math.inf, 0,
                {"mia_auc_full_black_box": 0.98, "mia_auc_white_box": 0.97}, members=64)
    make_record(root, "broken", "dpgan", "digits", 1.0, 9, {"gen2real_cnn": 0.0}, rdp=1, prv=1, complete=False)
    return root
