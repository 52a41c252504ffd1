"""What makes two runs the same: one rule for a run's random streams, its sweep cell and its
configuration in ``bench report``.

Every setting counts for some of three things (``RUN_SETTINGS`` for the run-level ones):
``STREAMS``, the random streams (batches, noise, initial weights: ``config.stream_key``, beside
the seed); ``CELL``, the sweep cell (the run directory a sweep looks for: ``sweep.Cell.key``);
``REPORT``, the report's configuration (the row whose seeds are pooled: ``report.table.identity``).
- A training setting (ε, δ, preset, members, split, canaries, a method hparam not named below)
  counts for all three (ε and members as the report's own columns, beside method and dataset).
- A post-processing hparam (``POST_PROCESSING_HPARAMS``: the weight average's warm-up, which
  leaves the trained iterates as they are) counts for the cell and the report, not the streams;
  so do the samples drawn per class and ``--noise-off`` (the same batches with σ = 0).
- The seed, device and evaluators count for the cell only (the seed keys the streams itself).
- A bookkeeping hparam (``Method.bookkeeping_hparams``: logging, threads, memory chunking)
  counts for none.
Records keep their keys: a late setting at its "as before" value is left out, a renamed one is
hashed under its former name, and a bookkeeping one is hashed at its preset's value (the value
every recorded run has unless set by hand), whatever the run's own value.
"""

from __future__ import annotations

import functools
import hashlib
import json
from typing import Any

from . import registry

STREAMS, CELL, REPORT = "streams", "cell", "report"
ALL = frozenset({STREAMS, CELL, REPORT})
# RunConfig's fields (the report's order) and what each counts for; ``hparams`` is per setting, below
RUN_SETTINGS: dict[str, frozenset[str]] = {
    "method": frozenset({STREAMS, CELL}), "dataset": frozenset({STREAMS, CELL}),  # the report's own columns
    "epsilon": frozenset({STREAMS, CELL}), "members": frozenset({STREAMS, CELL}),  # the report's own columns
    "seed": frozenset({CELL}),  # the streams are seeded by it beside their key; the report pools seeds
    "preset": ALL, "delta": ALL, "samples_per_class": frozenset({CELL, REPORT}), "eval_split": ALL,
    "noise_off": frozenset({CELL, REPORT}), "noise_off_parts": frozenset({CELL, REPORT}), "canaries": ALL,
    "gradient_canaries": frozenset({STREAMS, CELL}),
    "device": frozenset({CELL}), "evaluators": frozenset({CELL}),
}
# hparams that only post-process the trained iterates: runs that differ in them train the same
# iterates on the same batches and noise, a paired comparison
POST_PROCESSING_HPARAMS = frozenset({"ema_warmup"})
# every method's bookkeeping hparams (``api.Method.bookkeeping_hparams``; a method adds its own)
BOOKKEEPING_HPARAMS = frozenset({"log_every", "torch_threads"})


def counts_for(method: str, key: str) -> frozenset[str]:
    """What the method hparam ``key`` (its current name) counts for."""
    if key in bookkeeping(method):
        return frozenset()
    return frozenset({CELL, REPORT}) if key in POST_PROCESSING_HPARAMS else ALL


# ------------------------------------------------------------- the methods' hooks


def method_attribute(method: str, attr: str) -> dict:
    try:
        return registry.methods.attribute(method, attr)
    except Exception:  # noqa: BLE001 - a method not installed here: nothing renamed or late
        return {}


@functools.lru_cache(maxsize=None)
def bookkeeping(method: str) -> frozenset[str]:
    """The method's ``bookkeeping_hparams`` (the base class' for a method not installed here)."""
    try:
        return frozenset(registry.methods.attribute(method, "bookkeeping_hparams"))
    except Exception:  # noqa: BLE001 - a method that is not installed here: the base class' set
        return BOOKKEEPING_HPARAMS


def current_hparams(method: str, hparams: dict[str, Any]) -> dict[str, Any]:
    """``hparams`` with the method's ``renamed_hparams`` under their current names (a
    record, ``--set`` or a config file from before a rename)."""
    renamed = method_attribute(method, "renamed_hparams")
    return {renamed.get(k, k): v for k, v in hparams.items()}


def stable_hparams(method: str, hparams: dict[str, Any]) -> dict[str, Any]:
    """``hparams`` under their current names, without the method's ``late_hparams`` that sit
    at their "as before" value: adding a setting to a method does not orphan the runs
    recorded before it existed."""
    late = method_attribute(method, "late_hparams")
    return {k: v for k, v in current_hparams(method, hparams).items() if not (k in late and _same(v, late[k]))}


def hashed_hparams(method: str, hparams: dict[str, Any]) -> dict[str, Any]:
    """``stable_hparams`` under the names they had when first recorded: what a sweep cell's
    key and the random streams' key hash, so a renamed setting keeps every run's cell and
    streams (a rename changes no result)."""
    old = {new: old for old, new in method_attribute(method, "renamed_hparams").items()}
    return {old.get(k, k): v for k, v in stable_hparams(method, hparams).items()}


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return list(a) == list(b)
    return a == b


# ------------------------------------------------------------------- the three uses


def hashed_settings(cfg: dict[str, Any], what: str, preset_hparams: dict[str, Any]) -> dict[str, Any]:
    """The settings of a run (``RunConfig.to_json()``) that ``what`` (``STREAMS`` or ``CELL``)
    hashes, as the records made before hash them: each bookkeeping hparam at its value in
    ``preset_hparams`` (a plain run of the run's preset; {} where unknown: the run's own)."""
    method = cfg["method"]
    out = {k: v for k, v in cfg.items() if k != "hparams" and what in RUN_SETTINGS.get(k, ALL)}
    hparams = {}
    for k, v in (cfg.get("hparams") or {}).items():
        if k in bookkeeping(method):  # counts for nothing: hashed as every run before this rule has it
            hparams[k] = preset_hparams.get(k, v)
        elif what in counts_for(method, k):
            hparams[k] = v
    out["hparams"] = hashed_hparams(method, hparams)
    return out


def stream_key(cfg: dict[str, Any], preset_hparams: dict[str, Any]) -> str:
    """What a run's random streams are keyed by, beside its seed (``context.stream_seed``):
    the settings that count for ``STREAMS``. Two runs differing in any of them draw
    independent batches and noise; a resumed run (same config) draws the same."""
    blob = json.dumps(hashed_settings(cfg, STREAMS, preset_hparams), sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def cell_key(cfg: dict[str, Any], preset_hparams: dict[str, Any]) -> str:
    """A sweep cell's key (its run directory's suffix): the settings that count for ``CELL``."""
    blob = json.dumps(hashed_settings(cfg, CELL, preset_hparams), sort_keys=True, default=str)
    return hashlib.sha1(blob.encode()).hexdigest()[:10]


def report_identity(cfg: dict[str, Any], priv: dict[str, Any]) -> dict[str, Any]:
    """The settings that count for ``REPORT`` of a recorded run (its config.json and
    privacy.json): two runs with equal identities are seeds of one configuration. δ is the
    one the run targeted, and ``--noise-off`` shows as ``noise`` on a private run only."""
    out: dict[str, Any] = {}
    for key, counts in RUN_SETTINGS.items():
        if REPORT not in counts:
            continue
        if key == "delta":
            out[key] = float(priv["target"]["delta"])
        elif key == "noise_off":
            if priv.get("private"):
                quiet = priv.get("noise_off_parts")
                out["noise"] = ("off: " + ",".join(quiet)) if quiet else "off" if priv.get("noise_off") else "on"
        elif key == "noise_off_parts":
            continue  # in "noise", above
        elif key == "eval_split":
            out[key] = cfg.get(key, "test")  # records made before --eval-split
        elif key == "canaries":
            if cfg.get(key):
                out[key] = cfg[key]
        else:
            out[key] = cfg.get(key)
    method = cfg["method"]
    return {**out, **{k: v for k, v in stable_hparams(method, cfg.get("hparams") or {}).items()
                      if REPORT in counts_for(method, k)}}
