"""The weight average's warm-up, A/B on one training: the released generator of a run (the
bias-corrected average, ``dpgen_bench/nets/averaging.py``) against the plain average started at
G's initial weights (the records before it) and against G's last iterate, each sampled and
evaluated as ``bench run`` does (same sampling seed, same evaluators, validation split).

One training serves all three: with ``A_T`` the bias-corrected average after ``T`` updates and
``θ_0`` the initial weights, the plain average is exactly ``β^T θ_0 + (1 − β^T) A_T`` (both
weigh the iterates alike; the plain one keeps ``β^T`` for θ_0), θ_0 is rebuilt from the seed as
the runner builds it, and the last iterate is saved when the fit ends.

    python benchmarks/ema_ab.py --seed 0                      # dpgan long, mnist, ε = 10, val
    python benchmarks/ema_ab.py --method gan --set steps=200  # any method whose G is averaged
    python benchmarks/ema_ab.py --method dpaf --set ema_decay=0.999 --decays 0.99,0.995

The plain average is evaluated only for the methods whose records before the warm-up kept one
(dpgan, gan); dpaf had no average before, so its rows compare the averages with the last iterate.

It resumes an interrupted run (its directory under --results) and appends its row to --out
(replacing a row of the same training: method, dataset, preset, seed, settings, device and run
directory). ``--merge FILE …`` adds the rows
of other row files to --out the same way (the GPU's stage V writes one file a candidate):

    python benchmarks/ema_ab.py --merge gpu_val/*.json
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import sys
import time
from pathlib import Path

import torch

from dpgen_bench import runner, store
from dpgen_bench.api import DataInfo
from dpgen_bench.config import build_config
from dpgen_bench.errors import Interrupted
from dpgen_bench.nets.averaging import initial_share
from dpgen_bench import registry

from dpaf_gap import within_class_std  # benchmarks/ is on sys.path when this script runs

LAST = "last_iterate.pt"


EXTRA = "extra_averages.pt"
PLAIN_BEFORE = {"dpgan", "gan"}  # methods whose records before the bias correction kept a plain average


def _capture_last_iterate(cls, run_dir: Path, decays: list[float]) -> None:
    """Wrap ``cls.fit`` (and the ``update_average`` its module calls): the last G iterate, before
    the average replaces it, and bias-corrected averages at further ``decays`` kept beside the
    run's own (saved with each checkpoint, so a resumed run continues them)."""
    module = sys.modules[cls.fit.__module__]  # gan inherits DPGAN.fit: methods.dpgan
    real_fit, real_update = cls.fit, module.update_average
    seen: dict = {}
    extra_path = run_dir / EXTRA
    saved = torch.load(extra_path, weights_only=False) if extra_path.is_file() else None

    def update(average, model, decay, step, warmup="bias-corrected"):
        seen["state"], seen["step"] = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}, step
        if decays:
            if "extra" not in seen:
                seen["extra"] = {d: copy.deepcopy(model) for d in decays}
                if saved is not None and saved["step"] == step - 1:  # resumed where the checkpoint left them
                    for d, m in seen["extra"].items():
                        m.load_state_dict(saved["averages"][d])
                elif step != 1:
                    raise SystemExit(f"{extra_path} does not match the resumed step {step}: start the run afresh")
            for d, m in seen["extra"].items():
                real_update(m, model, d, step, warmup)
        return real_update(average, model, decay, step, warmup)

    def fit(self, train, budget, ctx):
        module.update_average = update
        real_checkpoint = ctx.checkpoint

        def checkpoint(state):
            if "extra" in seen:
                with store.atomic_open(extra_path) as f:
                    torch.save({"step": seen["step"], "averages": {
                        d: m.state_dict() for d, m in seen["extra"].items()}}, f)
            return real_checkpoint(state)

        ctx.checkpoint = checkpoint
        try:
            real_fit(self, train, budget, ctx)
        finally:
            module.update_average = real_update
            ctx.checkpoint = real_checkpoint
        torch.save({"G": seen["state"], "updates": seen["step"],
                    "extra": {d: m.state_dict() for d, m in seen.get("extra", {}).items()}}, run_dir / LAST)

    cls.fit = fit


def _samples(p, checkpoint: dict, g_state: dict):
    """The run's samples (``p``: the run prepared, ``checkpoint`` its state) with G's weights
    ``g_state``, drawn as the runner draws them."""
    p.method.load_state_dict(checkpoint)
    p.method.G.load_state_dict(g_state)
    p.method.G.eval()
    return runner.draw_samples(p.config, p.data.num_classes, p.method, p.device)


def _spread(images: torch.Tensor, labels: torch.Tensor) -> float:
    """The samples' within-class spread (benchmarks/dpaf_gap.py): an average of G's weights can
    raise accuracy and narrow the samples at once."""
    return round(within_class_std(images.float().numpy(), labels.numpy()), 3)


def _evaluate(p, images: torch.Tensor, labels: torch.Tensor) -> float:
    """gen2real of the samples, evaluated as the runner does."""
    cfg = p.config
    runner.seed_everything(cfg.seed)
    out = runner.run_evaluators(cfg, p.data, p.method, p.device, images, labels)
    return out["metrics"]["gen2real_cnn"]


def _key(row: dict) -> tuple:
    """A row's identity: one training of one candidate on one kind of device (a GPU's row never
    replaces the CPU's: the same seed draws differently there) in one run directory (a preset's
    name with the same ``--set`` is another training once the preset changes: its run has another
    directory). Rows without ``device`` are the CPU's."""
    return (row["method"], row.get("dataset"), row["preset"], row["seed"], row["sets"], row.get("device", "cpu"),
            row.get("run_dir"))


def _put(rows: list[dict], row: dict) -> list[dict]:
    """``rows`` with ``row`` in place of any row of the same training (``_key``), appended last."""
    return [r for r in rows if _key(r) != _key(row)] + [row]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--method", default="dpgan")
    ap.add_argument("--dataset", default="mnist")
    ap.add_argument("--preset", default="long")
    ap.add_argument("--eps", type=float, default=10.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--set", dest="sets", action="append", default=[])
    ap.add_argument("--results", default="results/ema_ab")
    ap.add_argument("--out", default="benchmarks/ema_ab.json")
    ap.add_argument("--decays", default="", help="further bias-corrected averages to evaluate, e.g. 0.998,0.9995")
    ap.add_argument("--spread-only", action="store_true",
                    help="add the within-class spreads to an existing row (its gen2real kept, nothing retrained)")
    ap.add_argument("--name", default=None, help="run directory name under --results (default: method-dataset-preset-seed)")
    ap.add_argument("--merge", nargs="+", metavar="FILE", help="add these row files' rows to --out; nothing trained")
    a = ap.parse_args()
    if a.merge:
        out = Path(a.out)
        rows = json.loads(out.read_text()) if out.is_file() else []
        for f in a.merge:
            for row in json.loads(Path(f).read_text()):
                rows = _put(rows, row)
        store.write_json(out, rows)
        print(f"{out}: {len(rows)} rows", file=sys.stderr)
        return
    eps = a.eps if a.method != "gan" and math.isfinite(a.eps) else None
    cfg = build_config(a.method, a.dataset, epsilon=eps, preset=a.preset, seed=a.seed, sets=a.sets,
                       evaluators=["gen2real_cnn"], eval_split="val")
    if cfg.hparams["ema_warmup"] != "bias-corrected" or not cfg.hparams["ema_decay"] > 0:
        raise SystemExit("the run must keep a bias-corrected average (ema_decay > 0, ema_warmup=bias-corrected)")
    run_dir = Path(a.results) / (a.name or f"{a.method}-{a.dataset}-{a.preset}-s{a.seed}")
    decays = [float(d) for d in a.decays.split(",") if d]
    cls = registry.methods.get(a.method)
    _capture_last_iterate(cls, run_dir, decays)
    t0 = time.time()
    if not (run_dir / store.COMPLETE_MARKER).is_file():
        try:
            if (run_dir / "resume.pt").is_file():
                runner.resume(run_dir)
            else:
                runner.run(cfg, out=str(run_dir))
        except Interrupted as e:  # SIGTERM/SIGINT: checkpointed; the same command resumes
            raise SystemExit(f"{e}; run the same command again to resume") from None
    ours = store.read_json(run_dir / store.COMPLETE_MARKER)["metrics"]["gen2real_cnn"]
    # on the CPU whatever device trained (θ_0 is rebuilt there; load_state_dict moves each state back)
    last = torch.load(run_dir / LAST, weights_only=True, map_location="cpu")
    p = runner.prepare(cfg)
    checkpoint = torch.load(run_dir / "checkpoint.pt", weights_only=True, map_location="cpu")
    beta, T = cfg.hparams["ema_decay"], int(last["updates"])
    variants = {"bias-corrected": checkpoint["G"]}  # the run's released generator
    if a.method in PLAIN_BEFORE:
        theta0 = runner.build_method(cfg, cls, DataInfo(p.data.name, p.data.image_shape, p.data.num_classes,
                                                        p.method.info.n_train)).G.state_dict()
        keep = beta ** T
        variants["plain"] = {k: (keep * theta0[k] + (1 - keep) * v)
                             if v.is_floating_point() and "running" not in k else v
                             for k, v in checkpoint["G"].items()}
    variants["last_iterate"] = last["G"]
    variants |= {f"bias-corrected {d}": g for d, g in last.get("extra", {}).items()}
    out = Path(a.out)
    rows = json.loads(out.read_text()) if out.is_file() else []
    this = {"method": a.method, "dataset": a.dataset, "preset": a.preset, "seed": a.seed, "sets": a.sets,
            "device": p.device.type, "run_dir": str(run_dir)}
    same = [r for r in rows if _key(r) == _key(this)]
    if a.spread_only and not same:
        raise SystemExit(f"--spread-only: no row of this run in {out}")
    samples = {k: _samples(p, checkpoint, g) for k, g in variants.items()}  # each variant drawn once
    row = same[0] if a.spread_only else this | {
        "eps": a.eps, "split": "val", "ema_decay": beta, "g_updates": T,
        **({"initial_share_plain": initial_share(beta, T, "none")} if "plain" in variants else {}),
        "gen2real_cnn": {k: ours if k == "bias-corrected" else _evaluate(p, *samples[k]) for k in variants},
        "seconds": round(time.time() - t0)}
    row["within_class_std"] = {k: _spread(*xy) for k, xy in samples.items()}
    row["within_class_std_real"] = round(within_class_std(p.data.train.images.numpy(), p.data.train.labels.numpy()), 3)
    store.write_json(out, _put(rows, row))
    print(json.dumps(row, indent=1))


if __name__ == "__main__":
    main()
