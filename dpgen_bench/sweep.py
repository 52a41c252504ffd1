"""``bench sweep``: expand a grid (methods × datasets × ε × seeds), skip cells that already
have a complete record, run the rest locally (in this process, or ``--jobs N`` processes)
or on Ray (one task per run, ``num_gpus=1`` where a GPU exists), then report.

Each cell has a deterministic run directory ``sweep-<method>-<dataset>-eps<ε>-s<seed>-<hash>``
(the hash covers the settings that count for the cell: ``dpgen_bench.identity``, every
resolved setting but the bookkeeping ones), so a re-run finds what is done: a complete
record is skipped; an incomplete one (a crash, a kill) with a readable checkpoint is
resumed from it (``bench run --resume``: the steps already spent stay spent), and one
without is moved aside to a hidden ``.failed-…`` directory and run again. Records are
never rewritten.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import json
import logging
import math
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from . import registry, runner, store
from .config import MAX_SEED, RunConfig, build_config, cell_key, parse_seed
from .context import STOP_SIGNALS, handling_stops
from .errors import Interrupted, UserError
from .logs import setup_logging

log = logging.getLogger("dpgen_bench")


@dataclass(frozen=True)
class Cell:
    config: RunConfig

    @property
    def key(self) -> str:
        return cell_key(self.config)  # the settings that count for the cell (dpgen_bench.identity)

    @property
    def run_name(self) -> str:
        c = self.config
        eps = "inf" if not math.isfinite(c.epsilon) else f"{c.epsilon:g}"
        members = f"-m{c.members}" if c.members else ""
        noise = "-noiseoff" if c.noise_off else ""
        return f"sweep-{c.method}-{c.dataset}-eps{eps}{members}{noise}-s{c.seed}-{self.key}"


def _listify(v: Any) -> list:
    if v is None:
        return [None]
    if isinstance(v, str):
        return [x.strip() for x in v.split(",") if x.strip()]
    return list(v) if isinstance(v, (list, tuple)) else [v]


def _parsed(grid: dict[str, Any], key: str, parse, what: str, default: Any = None) -> list:
    """The grid key's values, each parsed; a value that does not parse is one line naming it."""
    out = []
    for v in _listify(grid.get(key, default)):
        if v is None:
            out.append(None)
            continue
        try:
            out.append(parse(v))
        except (TypeError, ValueError, UserError):
            raise UserError(f"--{key} / grid key '{key}': {v!r} is not {what}") from None
    return out


def _float(v: Any) -> float:
    if isinstance(v, bool):
        raise ValueError(v)
    return float(v)


def _count(v: Any) -> int:
    if isinstance(v, bool) or isinstance(v, float) or (isinstance(v, str) and not v.strip().isdigit()):
        raise ValueError(v)
    return int(v)


# Keys of a grid file (README, "Reports and sweeps"). Axes (a list, or "a,b"): method, dataset,
# eps, seeds, members, n_d; one value for every cell: preset, delta, eval, eval_split, set.
GRID_KEYS = ("method", "dataset", "eps", "seeds", "members", "n_d", "preset", "delta", "eval", "eval_split", "set",
             "noise_off")


def expand(grid: dict[str, Any]) -> list[Cell]:
    """The cells of ``grid`` (keys ``GRID_KEYS``), one per combination of the axes."""
    unknown = set(grid) - set(GRID_KEYS)
    if unknown:
        raise UserError(f"sweep grid: unknown keys {sorted(unknown)} (known: {', '.join(sorted(GRID_KEYS))})")
    methods = _listify(grid.get("method"))
    if methods == [None]:
        raise UserError("sweep grid: no method given")
    if methods == ["all"]:  # every method bench list shows (plugins included)
        methods = registry.methods.names()
    if grid.get("set") is not None and not isinstance(grid["set"], dict):
        raise UserError(f"sweep grid: 'set' must be a mapping of method settings, got {grid['set']!r}")
    sets = tuple(f"{k}={v}" for k, v in (grid.get("set") or {}).items())
    evaluators = grid.get("eval")
    if isinstance(evaluators, (list, tuple)):
        evaluators = ",".join(evaluators)
    epsilons = _parsed(grid, "eps", _float, "a number")
    seeds = _parsed(grid, "seeds", parse_seed, f"an integer from 0 to {MAX_SEED}", default=0)
    member_counts = _parsed(grid, "members", _count, "a whole number")
    cells: dict[str, Cell] = {}
    for method, dataset, eps, seed, members, n_d in itertools.product(
            methods, _listify(grid.get("dataset", "digits")), epsilons, seeds, member_counts,
            _listify(grid.get("n_d"))):
        private = registry.methods.get(method).private
        cfg = build_config(method, dataset, epsilon=eps if private else None, delta=grid.get("delta"),
                           preset=grid.get("preset"), n_d=n_d, sets=sets, seed=seed, members=members,
                           evaluators=evaluators, eval_split=grid.get("eval_split"),
                           noise_off=bool(grid.get("noise_off")) and private)
        cell = Cell(cfg)
        cells.setdefault(cell.run_name, cell)  # a non-private method runs once per seed, not per ε
    return list(cells.values())


PRESET_SECONDS_FILE = "preset_seconds.json"  # package data, beside this module


@functools.cache
def measured_seconds() -> dict[str, dict[str, dict[str, float]]]:
    """The built-in methods' measured wall seconds of one run, ``{method: {preset: {dataset:
    seconds}}}``, from ``dpgen_bench/preset_seconds.json`` (how they were measured:
    benchmarks/presets.md, "The measured seconds of the presets")."""
    from importlib.resources import files

    return json.loads(files(__package__).joinpath(PRESET_SECONDS_FILE).read_text(encoding="utf-8"))


def preset_seconds(method: str) -> dict[str, dict[str, float]]:
    """``{preset: {dataset: seconds}}`` of a method: its own ``Method.preset_seconds`` when it
    sets one (a plugin), else the built-ins' data file (``measured_seconds``)."""
    own = registry.methods.attribute(method, "preset_seconds") or {}
    return own or measured_seconds().get(method, {})


def expected_seconds(cell: Cell) -> float:
    """The method's measured seconds for the cell's preset and dataset (``preset_seconds``),
    ∞ when unknown: a cell of unknown length starts early."""
    c = cell.config
    return float(preset_seconds(c.method).get(c.preset, {}).get(c.dataset, math.inf))


def longest_first(cells: list[Cell]) -> list[Cell]:
    """The cells in the order a pool of workers should start them: longest expected first
    (the longest-processing-time rule: the last cell to start is a short one, so the
    workers finish together), ties in the given order."""
    return sorted(cells, key=lambda cell: -expected_seconds(cell))


def status(cell: Cell, root: Path) -> str:
    d = root / cell.run_name
    if store.is_complete(d):
        return "done"
    return "partial" if d.exists() else "todo"


def _has_checkpoint(run_dir: Path) -> bool:
    """A readable resume checkpoint of this cell's config (the directory name hashes it)."""
    if not (run_dir / runner.RESUME_FILE).is_file() or not (run_dir / "config.json").is_file():
        return False
    try:
        runner.load_resume(run_dir)
    except UserError as e:
        log.warning("%s: %s; running the cell again", run_dir.name, e)
        return False
    return True


def cap_threads(threads: int) -> None:
    """Cap this process's compute threads at ``threads``: torch's and the BLAS pools' of
    numpy / scipy (OpenBLAS: sklearn's MLP evaluators, FID's matrix square root), which
    start one thread per core whatever torch is told. N processes × 2 threads on 2 cores
    slow each other down ~10× (measured for torch; OpenBLAS's waiting threads spin too:
    sklearn's MLP on digits took 14 CPU-s under two pytest workers against 1.4 s capped)."""
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(threads)
    threadpool_limits(threads)  # called, not entered: in force for the rest of the process


def worker_threads(jobs: int) -> int:
    """Compute threads for each of ``jobs`` local workers: the cores shared out, at most an
    ``OMP_NUM_THREADS`` the caller set (several sweeps side by side on one machine, as the GPU
    check's stage L runs them, would each share out all the cores)."""
    threads = max(1, (os.cpu_count() or 1) // jobs)
    asked = os.environ.get("OMP_NUM_THREADS", "")
    return min(threads, int(asked)) if asked.isdigit() and int(asked) > 0 else threads


def run_cell(config_json: dict, run_dir: str, data_root: str | None = None, threads: int | None = None,
             resume: bool = False) -> dict[str, Any]:
    """Run one cell (in this process, a worker process, or a Ray task). ``threads`` caps
    the worker's compute threads (``cap_threads``)."""
    setup_logging(False)
    if threads:
        cap_threads(threads)
    cfg = RunConfig.from_json(config_json)
    t = time.time()
    prepared = runner.prepare(cfg, data_root)
    result = runner.execute(prepared, Path(run_dir), resume=resume)
    return {"run_dir": run_dir, "seconds": time.time() - t, "metrics": result["metrics"],
            "epsilon": result["privacy"]["epsilon"]}


def prepare_cell(config_json: dict, data_root: str | None = None, threads: int | None = None) -> dict[str, Any]:
    """The evaluators' real-data work for ``config`` (``runner.prepare_evaluators``), in a
    worker, ahead of the cells that share it."""
    setup_logging(False)
    if threads:
        cap_threads(threads)
    t = time.time()
    out = runner.prepare_evaluators(RunConfig.from_json(config_json), data_root)
    return {"seconds": time.time() - t, "prepared": out}


def shared_preparations(cells: list[Cell]) -> list[RunConfig]:
    """One config per distinct (dataset, split, seed, members, canaries, device) among the
    cells whose evaluators have real-data work to prepare (``Evaluator.has_prepare``), with
    only those evaluators. Worth a task of its own only when two or more cells share it."""
    groups: dict[tuple, list[RunConfig]] = {}
    for cell in cells:
        c = cell.config
        names = runner.evaluators_to_prepare(c.evaluators)
        if names:
            key = (c.dataset, c.eval_split, c.seed, c.members, c.canaries, c.device, names)
            groups.setdefault(key, []).append(c)
    return [dataclasses.replace(cs[0], evaluators=key[-1]) for key, cs in groups.items() if len(cs) > 1]


def visible_gpus() -> list[str]:
    """The CUDA devices a local sweep may spread its workers over (respecting an existing
    ``CUDA_VISIBLE_DEVICES``); empty without CUDA."""
    if not torch.cuda.is_available():
        return []
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        return [v.strip() for v in visible.split(",") if v.strip()]
    return [str(i) for i in range(torch.cuda.device_count())]


def _init_worker(counter, gpus: list[str]) -> None:
    """Worker initializer: its own process group, deaf to stops while idle (a running cell
    listens: ``context.stop_on_signals``), so that a stop reaches it once, forwarded by the
    sweep (``_forward_stops``) — a second signal would mean "stop now, no checkpoint" — and
    an idle worker is not killed by it. Then its GPU (``_pin_worker_gpu``)."""
    os.setpgid(0, 0)
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    if gpus:
        _pin_worker_gpu(counter, gpus)


@contextlib.contextmanager
def _forward_stops(pool):
    """While ``pool`` runs: SIGINT / SIGTERM to the sweep (Ctrl-C, ``kill PID``, a job
    scheduler's stop) go to its workers, whose running cells checkpoint and raise
    ``Interrupted``, which ends the sweep. Without it ``kill PID`` killed the sweep and left
    its workers training unseen until their cells ended."""
    def forward(signum, frame):
        for proc in list((getattr(pool, "_processes", None) or {}).values()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signum)

    with handling_stops(forward):
        yield


def _pin_worker_gpu(counter, gpus: list[str]) -> None:
    """Worker k sees only GPU k mod len(gpus), as its ``cuda`` (set before the worker
    touches CUDA), so ``--device auto`` cells spread over the GPUs."""
    with counter.get_lock():
        k = counter.value
        counter.value += 1
    os.environ["CUDA_VISIBLE_DEVICES"] = gpus[k % len(gpus)]


def _progress_line(cell: Cell, out: dict[str, Any]) -> str:
    c = cell.config
    eps = "∞" if not math.isfinite(c.epsilon) else f"{c.epsilon:g}"
    head = next(iter(out["metrics"].items()), None)
    metric = f"{head[0]}={head[1]:.4f}" if head else "no metric"
    node = f" on node {out['node'][:12]}" if out.get("node") else ""
    return f"done {c.method} {c.dataset} ε={eps} seed={c.seed} in {out['seconds']:.1f}s{node}: {metric}"


def _check_seen_by_workers(cells: list[Cell], how: str) -> None:
    """One line, before anything runs, when a cell names a plugin registered in this process
    only (``Registry.only_in_this_process``): the workers would not see it."""
    named = dict.fromkeys((kind, name) for c in (cell.config for cell in cells) for kind, name in (
        ("method", c.method), ("dataset", c.dataset), *(("evaluator", e) for e in c.evaluators)))
    kinds = {"method": registry.methods, "dataset": registry.datasets, "evaluator": registry.evaluators}
    for kind, name in named:  # each name once, however many cells share it
        if kinds[kind].only_in_this_process(name):
            raise UserError(f"{kind} '{name}' was registered in this process only; {how} runs cells in new processes, "
                            f"which would not see it: use --jobs 1 (in this process), register it as "
                            f"'module:attr' or make it an entry point (docs/adding-a-method.md)")


def run_sweep(cells: list[Cell], root: Path, *, engine: str = "local", jobs: int = 1, address: str | None = None,
              data_root: str | None = None, require_commit: str | None = None) -> dict[str, int]:
    """Run every cell without a complete record under ``root``; return the counts (done,
    partial, todo, stale, failed, ran, resumed). ``require_commit`` (a full hash:
    ``store.resolve_commit``): a complete record made by code without that commit (a fix
    made since: ``store.made_after``) is *stale*: its directory is renamed
    ``.stale-<run>-<time>`` (kept, out of the report's sight) and the cell runs again."""
    if engine == "ray" or jobs > 1:  # before anything is renamed or started
        _check_seen_by_workers(cells, "--engine ray" if engine == "ray" else f"--jobs {jobs}")
    root.mkdir(parents=True, exist_ok=True)
    todo, resumable = [], set()
    counts = {"done": 0, "partial": 0, "todo": 0, "stale": 0, "failed": 0, "ran": 0, "resumed": 0}
    for cell in cells:
        st = status(cell, root)
        made = store.record_commit(root / cell.run_name) if require_commit and st != "todo" else None
        if st == "done" and require_commit and not store.commit_contains(made, require_commit):
            log.info("%s: made at %s, without %s: running it again", cell.run_name,
                     made[:12] if made else "an unknown commit", require_commit[:12])
            (root / cell.run_name).rename(root / f".stale-{cell.run_name}-{time.strftime('%Y%m%d-%H%M%S')}")
            st = "stale"
        counts[st] += 1
        if st == "done":
            continue
        if st == "partial":
            # a checkpoint of code without the required commit is not resumed: the run would mix both
            if _has_checkpoint(root / cell.run_name) and (
                    not require_commit or store.commit_contains(made, require_commit)):
                resumable.add(cell.run_name)
            else:  # keep the evidence, out of the report's sight
                (root / cell.run_name).rename(root / f".failed-{cell.run_name}-{time.strftime('%Y%m%d-%H%M%S')}")
        todo.append(cell)
    counts["resumed"] = len(resumable)
    if engine == "ray" or jobs > 1:
        todo = longest_first(todo)
    log.info("sweep: %d cells, %d already complete, %d to run (%d interrupted: %d resumed from a checkpoint%s)",
             len(cells), counts["done"], len(todo), counts["partial"], len(resumable),
             f"; {counts['stale']} stale: made without {require_commit[:12]}" if require_commit else "")
    args = [(c, c.config.to_json(), str(root / c.run_name), c.run_name in resumable) for c in todo]

    def finished(cell, out=None, err=None):
        if err is not None:
            counts["failed"] += 1
            log.error("failed %s: %s", cell.run_name, err)
        else:
            counts["ran"] += 1
            log.info(_progress_line(cell, out))

    if engine == "ray":
        _run_ray(args, address, data_root, finished)
    elif jobs > 1:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor, as_completed

        ctx = mp.get_context("spawn")
        # spread workers over the GPUs, unless a cell names its own (cuda:N)
        gpus = visible_gpus() if all(c.config.device in ("auto", "cuda") for c in todo) else []
        if gpus and jobs > len(gpus):
            log.warning("sweep: %d jobs share %d GPU(s); each holds its own CUDA context and models "
                        "(lower --jobs if they run out of GPU memory)", jobs, len(gpus))
        with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx, initializer=_init_worker,
                                 initargs=(ctx.Value("i", 0), gpus)) as pool, _forward_stops(pool):
            threads = worker_threads(jobs)
            # the evaluators' shared real-data work first (the real2gen CNN): one worker builds it
            # while the others train, instead of the first cells queueing on its lock
            prep = {pool.submit(prepare_cell, c.to_json(), data_root, threads): c for c in shared_preparations(todo)}
            futures = {pool.submit(run_cell, cfg, d, data_root, threads, r): cell for cell, cfg, d, r in args}
            for fut in as_completed([*prep, *futures]):
                if fut in prep:
                    c = prep[fut]
                    try:
                        log.info("prepared %s for %s seed %d in %.1fs", ", ".join(c.evaluators), c.dataset, c.seed,
                                 fut.result()["seconds"])
                    except Exception as e:  # noqa: BLE001 - the cells then prepare it themselves
                        log.warning("preparing %s for %s failed (%s); each cell will do it", ", ".join(c.evaluators),
                                    c.dataset, e)
                    continue
                try:
                    finished(futures[fut], fut.result())
                except Interrupted:  # a stop asked for (the workers share the signal): no cell starts after it
                    pool.shutdown(wait=True, cancel_futures=True)
                    raise
                except Exception as e:  # noqa: BLE001 - one failed cell must not stop the sweep
                    finished(futures[fut], err=e)
    else:
        for cell, cfg, d, r in args:
            try:
                finished(cell, run_cell(cfg, d, data_root, None, r))
            except (UserError, Interrupted):  # a signal stops the sweep, not only its cell
                raise
            except Exception as e:  # noqa: BLE001
                finished(cell, err=e)
    return counts


def _ray_cell(*args) -> dict[str, Any]:
    """``run_cell`` on a Ray worker, with the id of the node that ran it."""
    import ray

    return {**run_cell(*args), "node": ray.get_runtime_context().get_node_id()}


def _run_ray(args, address, data_root, finished) -> None:
    try:
        import ray
    except ImportError:
        raise UserError("--engine ray needs Ray: pip install -e '.[ray]'") from None
    ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
    gpu = torch.cuda.is_available() or bool(ray.cluster_resources().get("GPU"))
    # SPREAD: cells go to every node of the cluster, not first to fill the driver's node; a
    # CPU cell runs on one torch thread, its num_cpus
    remote = ray.remote(num_gpus=1 if gpu else 0, num_cpus=1, scheduling_strategy="SPREAD")(_ray_cell)
    refs = {remote.remote(cfg, d, data_root, None if gpu else 1, r): cell for cell, cfg, d, r in args}
    pending = list(refs)
    while pending:
        ready, pending = ray.wait(pending, num_returns=1)
        try:
            finished(refs[ready[0]], ray.get(ready[0]))
        except Exception as e:  # noqa: BLE001
            finished(refs[ready[0]], err=e)
