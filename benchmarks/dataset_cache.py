"""CelebA loader cache: build time, second-load time and peak memory, on a generated fake.

    .venv/bin/python benchmarks/dataset_cache.py [--n 20000] [--size 64] [--workers N] [--dir DIR]

Writes ``--n`` fake 178x218 JPEGs (smooth random colour fields plus noise, quality 95:
about the size and decode cost of the real aligned CelebA files) in torchvision's layout,
with CelebA's partition proportions (80.3 % train, 9.8 % valid, 9.9 % test) and random
attributes, in a temporary directory (or ``--dir``). The loads run with ``$DPGEN_CACHE``
= ``<dir>/.dpgen_cache``, so the cache (``<dir>/.dpgen_cache/datasets``) goes with that
directory. Then each phase runs in a fresh subprocess so that its peak memory is its own:

1. ``build``: ``celeba-gender`` at ``--size`` with an empty cache (decode every JPEG
   into the uint8 cache, then the float32 split; float32 kept in memory when under 2 GiB);
2. ``second load``: the same call again (cache hit);
3. the other storage of the float32 split (unless ``--auto-only``): when the loader kept it
   in memory (under 2 GiB), ``in_memory=False`` — the path it takes by itself for larger
   data sets (full CelebA-64: 9.96 GB): the float32 split written once as a derived cache
   and served copy-on-write; when it chose the memory map, one load with ``in_memory=True``.

Peak memory: "private" is the peak of ``RssAnon`` (``/proc/self/status``, sampled every
10 ms during the load): the memory the process really holds; "incl. mapped files" is
``resource.getrusage(RUSAGE_SELF).ru_maxrss``, which also counts page-cache pages of the
memory maps it touched (inflated by the kernel's readahead and large folios; reclaimable).
Both include the imports (torch alone: ~280 MiB private, ~650 MiB RSS here). Decode
workers are forked, so their RSS starts with the parent's shared pages: the table gives
their peak and their growth during decoding (``RUSAGE_CHILDREN`` is useless here: torch's
import runs a ~580 MiB child process of its own).
Prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

CACHE_ROOT = ".dpgen_cache"  # $DPGEN_CACHE of the measured loads, inside the benchmark's directory


def _write_jpegs(task: tuple[str, int, int]) -> int:
    from PIL import Image

    folder, start, stop = task
    rng = np.random.default_rng(start)
    for i in range(start, stop):
        field = Image.fromarray(rng.integers(0, 256, size=(9, 8, 3), dtype=np.uint8)).resize(
            (178, 218), Image.Resampling.BICUBIC)
        a = np.asarray(field, dtype=np.int16) + rng.integers(-12, 13, size=(218, 178, 1), dtype=np.int16)
        Image.fromarray(a.clip(0, 255).astype(np.uint8)).save(f"{folder}/{i + 1:06d}.jpg", quality=95)
    return stop - start


def make_fake_celeba(root: Path, n: int, workers: int) -> float:
    import multiprocessing

    base = root / "celeba"
    img = base / "img_align_celeba"
    img.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    step = 500
    tasks = [(str(img), a, min(n, a + step)) for a in range(0, n, step)]
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        sum(pool.imap_unordered(_write_jpegs, tasks))
    rng = np.random.default_rng(0)
    names = [f"{i + 1:06d}.jpg" for i in range(n)]
    from dpgen_bench.data.celeba import ATTRIBUTES  # here, not at the top: phase() imports torch first

    values = np.where(rng.random((n, len(ATTRIBUTES))) < 0.3, 1, -1)
    lines = [str(n), " ".join(ATTRIBUTES) + " "] + [nm + " " + " ".join(f"{v:2d}" for v in row)
                                               for nm, row in zip(names, values)]
    (base / "list_attr_celeba.txt").write_text("\n".join(lines) + "\n")
    n_train, n_valid = int(round(n * 162770 / 202599)), int(round(n * 19867 / 202599))
    part = np.r_[np.zeros(n_train, int), np.ones(n_valid, int), np.full(n - n_train - n_valid, 2)]
    (base / "list_eval_partition.txt").write_text("".join(f"{nm} {p}\n" for nm, p in zip(names, part)))
    return time.perf_counter() - t0


_MEASURE_DIR: str | None = None
_DECODE = None


def _rss_kib() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def _measured_decode(task: tuple):
    """files._decode_range, recording this worker's RSS at the start and its peak."""
    start = _rss_kib()
    result = _DECODE(task)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with open(os.path.join(_MEASURE_DIR, f"{os.getpid()}-{task[1]}.json"), "w") as f:
        json.dump({"pid": os.getpid(), "start": start, "peak": peak}, f)
    return result


def _rss_anon_kib() -> int:
    """Private (anonymous) resident memory: what the process holds, not the page cache."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    return 0


class AnonPeak:
    """Samples RssAnon every 10 ms in a thread (ru_maxrss also counts mapped file pages,
    which the kernel's 8 MiB readahead and large folios inflate for memory maps)."""

    def __init__(self) -> None:
        import threading

        self.peak = _rss_anon_kib()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            self.peak = max(self.peak, _rss_anon_kib())

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return max(self.peak, _rss_anon_kib()) / 1024


def _cpu_seconds() -> float:
    """user + system CPU time of this process and its finished children (decode workers)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _worker_memory() -> tuple[float, float]:
    """(largest worker peak RSS, largest worker RSS growth over its first task's start), MiB."""
    per_pid: dict[int, list[int]] = {}
    for p in Path(_MEASURE_DIR).glob("*.json"):
        r = json.loads(p.read_text())
        lo_hi = per_pid.setdefault(r["pid"], [r["start"], r["peak"]])
        lo_hi[0], lo_hi[1] = min(lo_hi[0], r["start"]), max(lo_hi[1], r["peak"])
    if not per_pid:
        return 0.0, 0.0
    return max(v[1] for v in per_pid.values()) / 1024, max(v[1] - v[0] for v in per_pid.values()) / 1024


def phase(args: argparse.Namespace) -> None:
    """One load in this (fresh) process; prints a JSON line."""
    global _MEASURE_DIR, _DECODE
    import torch  # noqa: F401 - imported before measuring the baseline

    from dpgen_bench.data import celeba, files

    _MEASURE_DIR = tempfile.mkdtemp(prefix="dpgen_bench_rss_")
    _DECODE = files._decode_range
    files._decode_range = _measured_decode  # forked workers inherit it
    files.DECODE_START_METHOD = "fork"  # (spawned workers would import the unwrapped one)
    base_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    base_anon = _rss_anon_kib() / 1024
    sampler = AnonPeak()
    cpu0 = _cpu_seconds()
    loader = celeba.load_celeba_gender if args.size == 64 else celeba.load_celeba_gender_32
    in_memory = {"auto": None, "1": True, "0": False}[args.in_memory]
    t0 = time.perf_counter()
    data = loader(args.root, workers=args.workers, in_memory=in_memory)
    seconds = time.perf_counter() - t0
    anon_peak = sampler.stop()
    cpu = _cpu_seconds() - cpu0
    torch.set_num_threads(1)  # the gather alone, without thread wake-ups on a busy machine
    gen = torch.Generator().manual_seed(0)
    data.train.images[torch.randint(len(data.train), (8,), generator=gen)]  # warm-up
    times = []
    for _ in range(9):  # fresh random batches: first touches of memory-mapped pages included
        idx = torch.randint(len(data.train), (256,), generator=gen)
        t1 = time.perf_counter()
        data.train.images[idx]
        times.append(time.perf_counter() - t1)
    batch_s = sorted(times)[4]
    info = files.dataset_info(data.name)
    worker_peak, worker_growth = _worker_memory()
    shutil.rmtree(_MEASURE_DIR, ignore_errors=True)
    print(json.dumps({
        "seconds": seconds, "cpu_seconds": cpu, "batch_seconds": batch_s,
        "n_train": len(data.train), "n_test": len(data.test),
        "cache_hit": info["cache_hit"], "storage": info["storage"],
        "rss_after_imports_mib": base_kib / 1024, "anon_after_imports_mib": base_anon,
        "anon_peak_mib": anon_peak,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "worker_peak_rss_mib": worker_peak, "worker_rss_growth_mib": worker_growth,
        "float_gib": data.train.images.numel() * 4 / 2**30 + data.test.images.numel() * 4 / 2**30,
    }))


def run_phase(root: Path, size: int, workers: int, in_memory: str) -> dict:
    cmd = [sys.executable, __file__, "--phase", "--root", str(root), "--size", str(size), "--workers",
           str(workers), "--in-memory", in_memory]
    env = {k: v for k, v in os.environ.items() if k != "DPGEN_DATA_IN_MEMORY_GB"}
    env["DPGEN_CACHE"] = str(root / CACHE_ROOT)
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=20000, help="fake images")
    p.add_argument("--size", type=int, default=64, choices=(32, 64))
    p.add_argument("--workers", type=int, default=None, help="decode processes [min(8, CPUs)]")
    p.add_argument("--dir", default=None, help="keep the fake data set here (else a temp dir, removed)")
    p.add_argument("--auto-only", action="store_true", help="skip the loads forced to the other storage mode")
    p.add_argument("--phase", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--root", help=argparse.SUPPRESS)
    p.add_argument("--in-memory", default="auto", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.phase:
        phase(args)
        return
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    workers = args.workers or max(1, min(8, cpus))
    root = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="dpgen_celeba_fake_"))
    try:
        if not (root / "celeba" / "list_eval_partition.txt").is_file():
            gen = make_fake_celeba(root, args.n, workers)
            print(f"generated {args.n} fake CelebA JPEGs in {root} in {gen:.1f} s", file=sys.stderr, flush=True)
        shutil.rmtree(root / CACHE_ROOT, ignore_errors=True)
        rows = [("build (empty cache)", run_phase(root, args.size, workers, "auto"))]
        rows.append(("second load", run_phase(root, args.size, workers, "auto")))
        if args.auto_only:
            pass
        elif "in memory" in rows[0][1]["storage"]:  # the other path: float32 split memory-mapped
            rows.append(("build (forced memory-mapped float32)", run_phase(root, args.size, workers, "0")))
            rows.append(("second load (forced memory-mapped float32)", run_phase(root, args.size, workers, "0")))
        else:
            rows.append(("second load (forced in-memory float32)", run_phase(root, args.size, workers, "1")))
        cache_mib = sum(f.stat().st_size for f in (root / CACHE_ROOT / "datasets").glob("*.npy")) / 2**20
        jpg_mib = sum(f.stat().st_size for f in (root / "celeba" / "img_align_celeba").iterdir()) / 2**20
        r0 = rows[0][1]
        print(f"\nafter imports (torch): private RSS {r0['anon_after_imports_mib']:.0f} MiB, RSS "
              f"{r0['rss_after_imports_mib']:.0f} MiB", end="")
        print(f"\nceleba-gender at {args.size}x{args.size}, {args.n} fake 178x218 JPEGs ({jpg_mib:.0f} MiB), "
              f"{workers} decode worker(s), {cpus} CPU(s); cache files {cache_mib:.0f} MiB\n")
        print("| phase | images (train / test) | load time (s) | CPU time (s) | cache hit | float split storage | "
              "peak private RSS (MiB) | peak RSS incl. mapped files (MiB) | decode worker peak RSS / growth (MiB) | "
              "random 256-image batch, median of 9 (ms) |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for name, r in rows:
            worker = (f"{r['worker_peak_rss_mib']:.0f} / {r['worker_rss_growth_mib']:.0f}"
                      if r["worker_peak_rss_mib"] else "no decoding")
            print(f"| {name} | {r['n_train']} / {r['n_test']} | {r['seconds']:.2f} | {r['cpu_seconds']:.1f} | "
                  f"{r['cache_hit']} | {r['storage']} | {r['anon_peak_mib']:.0f} | {r['peak_rss_mib']:.0f} | "
                  f"{worker} | {r['batch_seconds'] * 1000:.1f} |")
    finally:
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
