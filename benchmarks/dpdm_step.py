"""DPDM's private step on its paper U-Net: one physical chunk of E examples × K noised rows,
non-private against the book-keeping (``bk``) path it trains with, and where the time goes.

    .venv/bin/python benchmarks/dpdm_step.py [--dataset mnist|celeba-gender-32] [--examples E]
                                             [--k 32] [--repeats 5] [--profile]

The chunk is the one ``methods/dpdm.py`` takes at the dataset's paper preset (MNIST: 64
examples of K = 32 rows, 2,048 rows of the 28×28 U-Net, nf 32, ch_mult 1,2,2, 2 res blocks,
attention at 7; CelebA-Gender-32: 32 examples, 3×32×32, attention at 16 and 8), unless
``--examples`` says otherwise: the EDM loss, then a plain backward (non-private) or
``private_backward`` with ``group=K`` (each example's gradient is the mean over its K rows,
clipped once).
``bk:ghost`` / ``bk:per_example`` force one norm rule on every layer (the default ``bk``
picks per layer), as in ``benchmarks/dp_step.py``. Timed round-robin, median of
``--repeats``; rows/s = E·K / step time. ``--profile`` prints torch.profiler's top operators
of one ``bk`` chunk (self time, CUDA if on a GPU). ``--json``: one object on stdout.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys

import torch

from dp_step import PartContext, _sync, round_robin  # this directory: the script's own, on sys.path

from dpgen_bench.api import DataInfo
from dpgen_bench.privacy.dpsgd import make_private, private_backward
from methods.dpdm import DPDM, DPDMHparams, edm_loss

MODES = ("non-private", "bk", "bk:ghost", "bk:per_example")


# what DPDM may know of each dataset before loading it (image shape, classes, training N)
INFO = {"mnist": DataInfo("mnist", (1, 28, 28), 10, 60_000),
        "celeba-gender-32": DataInfo("celeba-gender-32", (3, 32, 32), 2, 182_637)}


def make_step(examples: int, k: int, mode: str, device, h: DPDMHparams, dataset: str = "mnist"):
    torch.manual_seed(0)
    info = INFO[dataset]
    shape = info.image_shape
    net = DPDM(h, info).net.to(device)  # the method's own network for these hparams
    opt = torch.optim.Adam(net.parameters(), lr=h.lr)
    model, private = net, mode != "non-private"
    if private:
        base, _, norms = mode.partition(":")
        model, opt = make_private(net, opt, ctx=PartContext(1.0), part="d", max_grad_norm=1.0,
                                  expected_batch_size=examples, grad_sample_mode=base)
        if norms:
            model.norms = norms
    n = examples * k
    g = torch.Generator(device=device).manual_seed(0)
    x = torch.rand(examples, *shape, device=device, generator=g).repeat_interleave(k, 0) * 2 - 1
    y = torch.randint(0, info.num_classes, (examples,), device=device, generator=g).repeat_interleave(k, 0)
    sigma = (torch.randn(n, device=device, generator=g) * h.p_std + h.p_mean).exp()
    noise = torch.randn(x.shape, device=device, generator=g)

    def step():
        opt.zero_grad(set_to_none=True)
        losses = edm_loss(model, x, y, sigma, noise)
        if private:
            private_backward(model, opt, losses, group=k)
        else:
            losses.mean().backward()
        opt.step()
        _sync()

    return step


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dataset", choices=sorted(INFO), default="mnist", help="whose paper preset (net, chunk)")
    ap.add_argument("--examples", type=int, default=None,
                    help="examples in the chunk [default: the preset's max_physical_batch]")
    ap.add_argument("--k", type=int, default=32, help="noise multiplicity K (rows per example)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--profile", action="store_true", help="torch.profiler's top operators of one bk chunk")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    device = torch.device(args.device)
    preset = DPDM.presets["paper"][args.dataset]
    h = DPDMHparams(**{k: v for k, v in preset.items() if k in DPDMHparams.__dataclass_fields__})
    if args.examples is None:
        args.examples = h.max_physical_batch
    modes = args.modes.split(",")
    print(f"device {device}, torch {torch.__version__}, {args.dataset}: chunk {args.examples} × K {args.k} rows",
          file=sys.stderr)
    builders = {m: (lambda m=m: make_step(args.examples, args.k, m, device, h, args.dataset)) for m in modes}
    res = round_robin(builders, args.repeats, warmup=1)
    rows = []
    base = res.get("non-private")
    for m, t in res.items():
        ok = isinstance(t, float)
        rows.append({"mode": m, "step_s": round(t, 4) if ok else None,
                     "rows_per_s": round(args.examples * args.k / t) if ok else None,
                     "ratio": round(t / base, 3) if ok and isinstance(base, float) else None,
                     **({} if ok else {"error": t})})
    out = {"device": str(device), "gpu": torch.cuda.get_device_name() if device.type == "cuda" else None,
           "torch": torch.__version__, "dataset": args.dataset, "examples": args.examples, "k": args.k, "rows": rows}
    if device.type == "cuda":
        # the timing loop holds every mode's model at once: its peak is the largest of them
        # plus the others' weights. Each mode's own peak: one chunk alone, after the others freed
        out["peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        for r in rows:
            if r["step_s"] is None:
                continue
            gc.collect()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            step = make_step(args.examples, args.k, r["mode"], device, h, args.dataset)
            step()
            r["peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
            del step
    if args.json:
        print(json.dumps(out))
    else:
        print("| mode | chunk (s) | rows/s | ratio to non-private | peak GiB (alone) |\n|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['mode']} | {r['step_s']} | {r['rows_per_s']} | {r['ratio']} | {r.get('peak_gib', '—')} |"
                  if r["step_s"] is not None else f"| {r['mode']} | fails: {r['error']} | | | |")
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        step = make_step(args.examples, args.k, "bk", device, h, args.dataset)
        step()
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        with profile(activities=acts) as prof:
            step()
        key = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
        print(prof.key_averages().table(sort_by=key, row_limit=20), file=sys.stderr)


if __name__ == "__main__":
    main()
