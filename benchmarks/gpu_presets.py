"""Every private method's ``paper`` preset on a GPU: throughput, peak memory and projected
wall time of the full run, beside ``bench run --dry-run``'s estimate (issue "Verified on a
GPU"; the table in benchmarks/README.md).

For each case, on full-size fake data written here (MNIST: 60,000 / 10,000 random images in
torchvision's IDX layout; CelebA: ``--celeba-n`` random JPEGs in its layout, fewer than the
real 202,599, which changes the sampling rate and the calibrated σ but not the cost of a
step), the script

1. prepares the full paper preset and runs ``--dry-run``'s timing probe (``--probe-seconds``)
   on it: the planned private steps, the probe's estimate of the training time and the peak
   GPU memory of those first steps;
2. runs the same preset cut to a few hundred private steps (``CASES``' overrides; few
   samples, no evaluator) to completion through the runner, as ``bench run`` does, and reads
   the run's ``protocol.throughput``: private steps per second of the whole fit (set-up
   included, so a lower bound on the steady rate) and the fit's peak GPU memory;
3. projects the full run's training time as planned private steps / measured rate.

Writes one JSON line per case to ``OUT/gpu_presets.jsonl`` as it goes (a case that fails
writes its error and the next one runs) and a markdown table to ``OUT/gpu_presets.md``.

    python benchmarks/gpu_presets.py --out OUT                 # on the GPU machine
    python benchmarks/gpu_presets.py --out OUT --smoke         # CPU: two steps each, a check of this script
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
# the tests' fake-data writers (fake_data, test_datasets_real): tests/ is not an installed package
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "unit")]

# (method, dataset, overrides cutting the paper preset to a few hundred private steps)
CASES = [
    ("dpgan", "mnist", ["steps=300"]),
    ("dpgan", "celeba-gender-32", ["steps=100"]),
    ("dpaf", "mnist", ["batches=400", "classifier_batches=100"]),
    ("dpaf", "celeba-gender", ["batches=400", "classifier_batches=100"]),
    ("gswgan", "mnist", ["steps=300", "pretrain_steps=2", "num_discriminators=100"]),
    ("dpac", "mnist", ["steps=300", "pretrain_steps=2", "num_discriminators=100", "t_c=100"]),
    ("dpsinkhorn", "mnist", ["max_steps=300"]),
    ("dpmerf", "mnist", ["epochs=1"]),
    ("dpntk", "mnist", ["steps=20"]),
    ("dpkernel", "mnist", ["steps=300"]),
    # one paper step is 4,096 × 32 = 131,072 rows (~24 s on an H200, 2026-11-27; ~75 s on an
    # H100 before bk's one-copy im2col): two steps, and no probe (it would time four)
    ("dpdm", "mnist", ["steps=2"]),
]
NO_PROBE = {"dpdm"}
# --smoke (CPU): a couple of steps, narrower where the paper width is slow on two cores
SMOKE = {
    "dpgan": ["steps=2", "max_physical_batch=256"],
    "dpaf": ["batches=8", "classifier_batches=2"],
    "gswgan": ["steps=2", "pretrain_steps=1", "num_discriminators=10"],
    "dpac": ["steps=2", "pretrain_steps=1", "num_discriminators=10", "t_c=1"],
    "dpsinkhorn": ["max_steps=2"],
    "dpmerf": ["epochs=1", "num_features=500"],
    "dpntk": ["steps=2", "widths=50", "batch_size=100"],
    "dpkernel": ["steps=2"],
    "dpdm": ["steps=2", "batch_size=16", "noise_multiplicity=2", "max_physical_batch=8", "sampler_steps=3"],
}


def write_fake_data(root: Path, celeba_n: int) -> None:
    from fake_data import write_idx
    from test_datasets_real import make_celeba

    rng = np.random.default_rng(0)
    raw = root / "MNIST" / "raw"
    for split, n in (("train", 60_000), ("t10k", 10_000)):
        write_idx(raw / f"{split}-images-idx3-ubyte", rng.integers(0, 256, (n, 28, 28)))
        write_idx(raw / f"{split}-labels-idx1-ubyte", rng.integers(0, 10, n))
    make_celeba(root, n=celeba_n)


def one_case(method, dataset, overrides, device, data_root, work, probe_seconds, eps) -> dict:
    from dpgen_bench import probe, runner
    from dpgen_bench.config import build_config

    cuda = torch.device(device).type == "cuda"
    row: dict = {"method": method, "dataset": dataset, "overrides": overrides}
    full = build_config(method, dataset, epsilon=eps, preset="paper", device=device, evaluators="", seed=0)
    p = runner.prepare(full, str(data_root))
    plan = p.ledger.planned_report().to_json()
    row["planned_private_steps"] = {part["name"]: part["steps"] for part in plan["parts"]}
    row["sigma"] = {part["name"]: part["noise_multiplier"] for part in plan["parts"]}
    row["n_train"] = len(p.data.train)
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    if probe_seconds > 0 and method not in NO_PROBE:
        est = probe.estimate_runtime(p, probe_seconds)
        row["dry_run"] = {"estimated_fit_seconds": est["estimated_fit_seconds"], "complete": est["complete"],
                          "phases": est["phases"], "setup_seconds": est["setup_seconds"],
                          "sampling": est["sampling"]}  # the paper preset's sample set, extrapolated
    else:
        row["dry_run"] = {"estimated_fit_seconds": None, "complete": False, "phases": [], "setup_seconds": None}
    row["probe_peak_gpu_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30 if cuda else None
    del p
    if cuda:
        torch.cuda.empty_cache()

    cfg_file = work / "samples.json"
    cfg_file.write_text(json.dumps({"samples_per_class": 10}))
    short = build_config(method, dataset, epsilon=eps, preset="paper", device=device, evaluators="", seed=0,
                         sets=overrides, config_file=cfg_file)
    out = work / f"{method}-{dataset}"
    t0 = time.time()
    result = runner.run(short, out=str(out), data_root=str(data_root))
    row["short_run_wall_seconds"] = round(time.time() - t0, 1)
    thr = result["protocol"]["throughput"]
    row["throughput"] = thr
    row["fit_seconds"] = result["protocol"]["timings"]["fit"]
    rate = thr["private_steps_per_second"]
    total = sum(row["planned_private_steps"].values())
    row["projected_fit_hours"] = total / rate / 3600 if rate else None
    row["epsilon_short_run"] = result["privacy"]["epsilon"]["rdp"]
    if cuda:
        torch.cuda.empty_cache()
    return row


def table(rows: list[dict]) -> str:
    def fmt_h(sec):
        return "—" if sec is None or not math.isfinite(sec) else (f"{sec / 3600:.2f} h" if sec >= 360 else f"{sec:.0f} s")

    lines = ["| method | dataset | planned private steps | measured steps/s (short run) | peak GPU memory | "
             "projected fit | `--dry-run` estimate |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['method']} | {r['dataset']} | failed: {r['error'][:80]} | | | | |")
            continue
        thr = r["throughput"]
        mem = thr.get("peak_gpu_memory_gib")
        proj = r["projected_fit_hours"]
        est = r["dry_run"]["estimated_fit_seconds"]
        lines.append(f"| {r['method']} | {r['dataset']} | {sum(r['planned_private_steps'].values()):,} | "
                     f"{thr['private_steps_per_second']:.2f} | {'—' if mem is None else f'{mem:.1f} GiB'} | "
                     f"{fmt_h(None if proj is None else proj * 3600)} | {fmt_h(est)}"
                     f"{'' if est is None or r['dry_run']['complete'] else ' (first phases only)'} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--smoke", action="store_true", help="CPU check: two steps a case (SMOKE overrides)")
    ap.add_argument("--probe-seconds", type=float, default=8.0)
    ap.add_argument("--celeba-n", type=int, default=8000)
    ap.add_argument("--eps", type=float, default=10.0)
    ap.add_argument("--only", default=None, help="comma-separated methods")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.smoke:
        args.device = "cpu"
    work = Path(tempfile.mkdtemp(prefix="gpu_presets_"))
    data_root = work / "data"
    t0 = time.time()
    write_fake_data(data_root, args.celeba_n)
    print(f"fake data written in {time.time() - t0:.1f} s", file=sys.stderr)
    rows = []
    jsonl = args.out / "gpu_presets.jsonl"
    only = set(args.only.split(",")) if args.only else None
    for method, dataset, overrides in CASES:
        if only and method not in only:
            continue
        ov = SMOKE[method] if args.smoke else overrides
        t1 = time.time()
        try:
            row = one_case(method, dataset, ov, args.device, data_root, work,
                           1.0 if args.smoke else args.probe_seconds, args.eps)
        except Exception as e:  # noqa: BLE001 - one failing case must not hide the others
            row = {"method": method, "dataset": dataset, "overrides": ov, "error": f"{type(e).__name__}: {e}",
                   "traceback": traceback.format_exc()}
        row["case_seconds"] = round(time.time() - t1, 1)
        row["device_name"] = torch.cuda.get_device_name() if torch.device(args.device).type == "cuda" else "cpu"
        row["torch"] = torch.__version__
        rows.append(row)
        with jsonl.open("a") as f:
            f.write(json.dumps(row, default=str) + "\n")
        print(f"{method} {dataset}: {row.get('error') or row['throughput']} ({row['case_seconds']} s)",
              file=sys.stderr, flush=True)
        (args.out / "gpu_presets.md").write_text(table(rows))
    print(table(rows))
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
