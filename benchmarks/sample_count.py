"""Does the evaluation's sample count own part of a gap to a paper? A finished run's generator
(its ``checkpoint.pt``) sampled again at other counts per class, each set evaluated by gen2real
CNN as ``bench run`` evaluates (the run's split, seed and sampling generator), with the samples'
within-class spread. Nothing is trained.

The `long` presets evaluate 100 samples per class (1,000 images) to keep the evaluation at
seconds; the papers train their classifiers on 60,000 generated images (docs/provenance.md). The
count the run itself used is evaluated again first: its value must equal the run's ``eval.json``
(``matches_record``), which checks that this script draws the run's own samples.

    python benchmarks/sample_count.py results/mnist_long/sweep-dpgan-mnist-eps10-s*/ --per-class 1000

Rows go to --out (one per run and count, replacing a row of the same run and count).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import torch

from dpgen_bench import runner, store
from dpgen_bench.config import RunConfig

from dpaf_gap import within_class_std  # benchmarks/ is on sys.path when this script runs


def _load(run_dir: Path):
    """The run's configuration (gen2real CNN its only evaluator), its data and its trained method,
    built as the runner builds them (``runner.prepare``: members and canaries drawn in)."""
    cfg = dataclasses.replace(runner.recorded_config(run_dir), evaluators=("gen2real_cnn",))
    p = runner.prepare(cfg)
    p.method.load_state_dict(torch.load(run_dir / "checkpoint.pt", weights_only=True, map_location="cpu"))
    return cfg, p.data, p.method


def evaluate(cfg: RunConfig, data, method, per_class: int) -> tuple[float, float]:
    """(gen2real CNN, within-class spread: None for an unconditional method) of ``per_class``
    samples a class, drawn as the runner draws them (``runner.draw_samples``: the run's sample
    stream: at the run's own count, the record's images)."""
    cfg = dataclasses.replace(cfg, samples_per_class=per_class)
    images, labels = runner.draw_samples(cfg, data.num_classes, method, torch.device("cpu"))
    runner.seed_everything(cfg.seed)
    out = runner.run_evaluators(cfg, data, method, torch.device("cpu"), images,
                                labels if method.conditional else None)
    spread = round(within_class_std(images.numpy(), labels.numpy()), 3) if method.conditional else None
    return out["metrics"]["gen2real_cnn"], spread


def _key(row: dict) -> tuple:
    return row["run"], row["per_class"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="finished run directories (config.json, checkpoint.pt)")
    ap.add_argument("--per-class", default="1000", help="comma-separated sample counts per class")
    ap.add_argument("--out", default="benchmarks/sample_count.json")
    a = ap.parse_args()
    torch.set_num_threads(1)  # beside training jobs (matches_record says whether the record's value came back)
    out = Path(a.out)
    rows = json.loads(out.read_text()) if out.is_file() else []
    for run_dir in a.runs:
        cfg, data, method = _load(run_dir)
        recorded = store.read_json(run_dir / store.COMPLETE_MARKER)["metrics"].get("gen2real_cnn")
        counts = [cfg.samples_per_class] + [int(n) for n in a.per_class.split(",") if int(n) != cfg.samples_per_class]
        for n in counts:
            t0 = time.time()
            acc, spread = evaluate(cfg, data, method, n)
            row = {"run": run_dir.name, "method": cfg.method, "dataset": cfg.dataset, "preset": cfg.preset,
                   "seed": cfg.seed, "split": cfg.eval_split, "per_class": n, "gen2real_cnn": acc,
                   "within_class_std": spread, "seconds": round(time.time() - t0)}
            if n == cfg.samples_per_class:
                row["matches_record"] = acc == recorded
                if acc != recorded:
                    print(f"{run_dir}: {acc} here against {recorded} in eval.json: not the run's samples",
                          file=sys.stderr)
            rows = [r for r in rows if _key(r) != _key(row)] + [row]
            store.write_json(out, rows)
            print(json.dumps(row))


if __name__ == "__main__":
    main()
