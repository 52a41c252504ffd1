"""Run configuration: a frozen ``RunConfig``; precedence CLI > ``--config`` file > preset >
the method's ``Hparams`` defaults.

Presets live on each method class (``Method.presets``): ``{preset: {dataset | "*": {...}}}``.
Besides the method's hyperparameters a preset may set the run-level keys in
``RUN_KEYS`` (e.g. which evaluators run, how many samples are drawn). The preset
``defaults`` exists for every method: its ``Hparams`` defaults, nothing overridden (the
default preset of a method without presets).

``build_config`` is the one way to a ``RunConfig`` from user input (the CLI, a sweep
grid, ``dpgen_bench.run``).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import identity, registry, settings
from .errors import UserError
# which settings change a run's random streams, its sweep cell and its report row: one rule, there
from .identity import current_hparams, hashed_hparams, method_attribute, stable_hparams  # noqa: F401
from .registry import suggest

# the splits --eval-split accepts (dpgen_bench.api re-exports it; here so that the CLI can
# build its options without importing torch)
EVAL_SPLITS = ("test", "val")

DEFAULT_DELTA = 1e-5
DEFAULTS_PRESET = "defaults"
DEFAULT_EVALUATORS = ("gen2real_cnn",)
MAX_SEED = 2**32 - 1  # numpy's seed range; torch takes it too, with the offsets methods add
RUN_KEYS = ("evaluators", "samples_per_class", "delta")  # delta: a paper that fixes δ (CLI --delta wins)


@dataclass(frozen=True)
class RunConfig:
    method: str
    dataset: str
    epsilon: float  # inf: non-private
    delta: float = DEFAULT_DELTA
    preset: str = "quick"
    seed: int = 0
    members: int | None = None
    device: str = "auto"
    evaluators: tuple[str, ...] = DEFAULT_EVALUATORS
    samples_per_class: int = 100
    hparams: dict[str, Any] = field(default_factory=dict)  # fully resolved
    eval_split: str = "test"  # "val": train on train minus a validation part, evaluate on it
    noise_off: bool = False  # diagnostic: the same pipeline with every noise multiplier 0 (not private)
    noise_off_parts: tuple[str, ...] = ()  # diagnostic: only these parts' noise multipliers 0 (not private)
    canaries: int | None = None  # bench audit: m canaries, each in the training split with probability 1/2
    gradient_canaries: int | None = None  # bench audit --white-box: m gradient canaries in each private part

    @property
    def any_noise_off(self) -> bool:
        """Some or all of the noise is switched off: the run is a diagnostic, not private."""
        return self.noise_off or bool(self.noise_off_parts)

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["evaluators"] = list(self.evaluators)
        d["epsilon"] = _json_float(self.epsilon)
        d["noise_off_parts"] = list(self.noise_off_parts)
        for key in ("noise_off", "noise_off_parts", "canaries", "gradient_canaries"):  # absent unless set: records and sweep cells stay as before
            if not d[key]:
                del d[key]
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "RunConfig":
        d = dict(d)
        d["epsilon"] = float(d["epsilon"])
        d["evaluators"] = tuple(d.get("evaluators", DEFAULT_EVALUATORS))
        d.setdefault("eval_split", "test")  # records written before --eval-split existed
        d["noise_off_parts"] = tuple(d.get("noise_off_parts", ()))
        d["hparams"] = recorded_hparams(d["method"], d.get("hparams") or {})  # records from before a rename
        return cls(**d)


def _json_float(x: float) -> float | str:
    return x if math.isfinite(x) else ("inf" if x > 0 else "-inf")


# ----------------------------------------------------------------------- presets


def preset_names(method_cls: type) -> list[str]:
    return [*getattr(method_cls, "presets", {}), DEFAULTS_PRESET]


def preset_overrides(method_cls: type, preset: str, dataset: str) -> dict[str, Any]:
    presets = getattr(method_cls, "presets", {})
    if preset == DEFAULTS_PRESET and preset not in presets:
        return {}
    if preset not in presets:
        raise UserError(f"unknown preset '{preset}' for method '{method_cls.name}'"
                        f"{suggest(preset, preset_names(method_cls))}")
    per_dataset = presets[preset]
    if dataset in per_dataset:
        return dict(per_dataset[dataset])
    if "*" in per_dataset:
        return dict(per_dataset["*"])
    raise UserError(no_preset_message(method_cls, preset, dataset))


def no_preset_message(method_cls: type, preset: str, dataset: str) -> str:
    """One line for a preset without settings for ``dataset``: the datasets it has, the
    presets that do apply, and ``--preset defaults`` (every method has it)."""
    presets = getattr(method_cls, "presets", {})
    have = ", ".join(sorted(presets.get(preset, {})))
    usable = [p for p, per in presets.items() if dataset in per or "*" in per]
    also = f"; presets of '{method_cls.name}' that do: {', '.join(usable)}" if usable else ""
    return (f"preset '{preset}' of method '{method_cls.name}' has no settings for dataset '{dataset}' (has: {have})"
            f"{also}; --preset {DEFAULTS_PRESET} runs the method's own defaults on any dataset (bench list presets; "
            "--set KEY=VALUE overrides one)")


def recorded_hparams(method: str, hparams: dict[str, Any]) -> dict[str, Any]:
    """A record's ``hparams`` under their current names, with each of the method's
    ``late_hparams`` it lacks at its "as before" value: a record made before a setting existed
    was made as that value says (dpgan's ``ema_warmup="none"``), whatever today's default is."""
    hp = current_hparams(method, hparams)  # the record's order kept: identities compare as JSON text
    return {**hp, **{k: v for k, v in method_attribute(method, "late_hparams").items() if k not in hp}}


def hparam_fields(hparams_cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(hparams_cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(hparams_cls)}


def coerce(key: str, value: Any, annotation: Any, source: str = "--set") -> Any:
    """Convert ``value`` (a string from ``--set`` or a JSON value) to the field's type;
    errors name the setting as ``<source> <key>`` (``--set``, ``--config FILE``, a preset)."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null")):
            if type(None) in args:
                return None
        options = [a for a in args if a is not type(None)]
        if len(options) == 1:
            return coerce(key, value, options[0], source)
        for a in options:
            try:
                return coerce(key, value, a, source)
            except UserError:
                pass
        names = " or ".join(_type_name(a) for a in options)
        raise UserError(f"{source} {key}: expected {names}, got {value!r}")
    if origin is typing.Literal:
        if value in args:
            return value
        raise UserError(f"{source} {key}: {value!r} is not one of {list(args)}{suggest(str(value), [str(a) for a in args])}")
    if origin in (tuple, list):
        if isinstance(value, str):
            value = [v for v in value.split(",") if v]
        inner = args[0] if args else str
        return tuple(coerce(key, v, inner, source) for v in value)
    if annotation is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("1", "true", "yes", "on", "0", "false", "no", "off"):
            return value.lower() in ("1", "true", "yes", "on")
        raise UserError(f"{source} {key}: expected true/false, got {value!r}")
    if annotation is int:
        if isinstance(value, bool):
            raise UserError(f"{source} {key}: expected an integer, got {value!r}")
        try:
            f = float(value)
        except (TypeError, ValueError):
            raise UserError(f"{source} {key}: expected an integer, got {value!r}") from None
        if not f.is_integer():
            raise UserError(f"{source} {key}: expected an integer, got {value!r}")
        return int(f)
    if annotation is float:
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise UserError(f"{source} {key}: expected a number, got {value!r}") from None
        if not math.isfinite(number):
            raise UserError(f"{source} {key}: expected a finite number, got {value!r}")
        return number
    if annotation is str:
        return str(value)
    return value


def _type_name(a: Any) -> str:
    if typing.get_origin(a) is typing.Literal:
        return " or ".join(repr(x) for x in typing.get_args(a))
    return {int: "an integer", float: "a number", bool: "true/false", str: "a string"}.get(a, str(a))


def resolve_hparams(method_cls: type, preset: str, dataset: str, overrides: dict[str, Any],
                    sources: dict[str, str] | None = None):
    """Defaults < preset < overrides; unknown keys, wrong types and values outside a
    setting's declared range (``settings.check_settings``, defaults included) are user
    errors that name where the setting came from (``sources``: key -> ``--set`` /
    ``--config FILE`` / ``hparams``; default ``--set``)."""
    fields = hparam_fields(method_cls.Hparams)
    values = preset_overrides(method_cls, preset, dataset)
    renamed = getattr(method_cls, "renamed_hparams", {})
    overrides = {renamed.get(k, k): v for k, v in overrides.items()}  # an old name still works
    sources = {renamed.get(k, k): v for k, v in (sources or {}).items()}
    run_level = {k: values.pop(k) for k in list(values) if k in RUN_KEYS}
    where = {k: f"preset '{preset}'" for k in values}
    for key, value in overrides.items():
        source = (sources or {}).get(key, "--set")
        if key not in fields:
            hint = (" (a run key: put it at the top level of the file)" if key in FILE_KEYS and source != "--set"
                    else suggest(key, list(fields)))
            raise UserError(f"{source}: '{method_cls.name}' has no setting '{key}'{hint}")
        values[key] = value
        where[key] = source
    coerced = {k: coerce(k, v, fields[k], where[k]) for k, v in values.items()}
    given = {k: v for k, v in settings.defaults(method_cls.Hparams).items() if k not in coerced}
    settings.check_settings(method_cls, {**given, **coerced}, {**{k: f"'{method_cls.name}' default" for k in given},
                                                               **where})
    try:
        hp = method_cls.Hparams(**coerced)
    except (TypeError, ValueError) as e:
        raise UserError(f"invalid settings for '{method_cls.name}': {e}") from None
    return hp, run_level


@functools.lru_cache(maxsize=None)
def _preset_hparams(method_cls: type, preset: str, dataset: str) -> dict[str, Any]:
    try:
        return dataclasses.asdict(resolve_hparams(method_cls, preset, dataset, {})[0])
    except Exception:  # noqa: BLE001 - a preset gone or changed since the run: {}
        return {}


def preset_hparams(config: RunConfig) -> dict[str, Any]:
    """The hparams of a plain run of the config's preset on its dataset ({} where that cannot
    be resolved here): the values a run's bookkeeping settings are hashed at."""
    try:
        method_cls = registry.methods.get(config.method)
    except Exception:  # noqa: BLE001 - a method not installed here
        return {}
    return _preset_hparams(method_cls, config.preset, config.dataset)


def stream_key(config: RunConfig) -> str:
    """What a run's random streams are keyed by, beside its seed (``context.stream_seed``):
    the settings that count for them (``dpgen_bench.identity``). Two runs differing in any of
    them draw independent batches and noise; a resumed run (same config) draws the same."""
    return identity.stream_key(config.to_json(), preset_hparams(config))


def cell_key(config: RunConfig) -> str:
    """A sweep cell's key: the settings that count for it (``dpgen_bench.identity``)."""
    return identity.cell_key(config.to_json(), preset_hparams(config))


def parse_set(pairs: tuple[str, ...] | list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise UserError(f"--set expects KEY=VALUE, got {pair!r}")
        out[key.strip()] = value.strip()
    return out


def load_config_file(path: str | Path) -> dict[str, Any]:
    """A YAML or JSON file with run keys and/or a ``hparams`` mapping."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise UserError(f"cannot read config file {p}: {e.strerror}") from None
    try:
        if p.suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
    except Exception as e:  # noqa: BLE001 - any parse error is the user's file
        first = " ".join(str(e).split())  # one line, whatever the parser's layout
        raise UserError(f"cannot parse config file {p}: {first}") from None
    if not isinstance(data, dict):
        raise UserError(f"config file {p} must hold a mapping")
    return data


# ------------------------------------------------------------------ run configs


def default_preset(method_cls: type, dataset: str) -> str:
    """``quick`` where the method has one for this dataset (digits), else ``paper``
    (which names the datasets it has when this one is not among them); ``defaults`` for a
    method with neither."""
    presets = getattr(method_cls, "presets", {})
    if not presets:
        return DEFAULTS_PRESET
    for name in ("quick", "paper"):
        if dataset in presets.get(name, {}):
            return name
    return "quick" if "*" in presets.get("quick", {}) else "paper" if "paper" in presets else DEFAULTS_PRESET


def parse_seed(value: Any) -> int:
    """A seed: an integer from 0 to ``MAX_SEED`` (an int, or its digits in a string)."""
    seed = None
    if isinstance(value, int) and not isinstance(value, bool):
        seed = value
    elif isinstance(value, str) and value.strip().lstrip("-").isdigit():
        seed = int(value)
    if seed is None or not 0 <= seed <= MAX_SEED:
        raise UserError(f"--seed must be an integer from 0 to {MAX_SEED}, got {value!r}")
    return seed


def parse_n_d(value: str | int | None) -> int | str | None:
    """``--n-d``: a positive integer or ``adaptive``."""
    if value is None or value == "adaptive":
        return value
    try:
        n = int(value)
    except ValueError:
        raise UserError(f"--n-d must be a positive integer or 'adaptive', got {value!r}") from None
    if n < 1:
        raise UserError(f"--n-d must be a positive integer or 'adaptive', got {value!r}")
    return n


FILE_KEYS = frozenset({"method", "dataset", "epsilon", "eps", "delta", "preset", "seed", "members", "device",
                       "evaluators", "samples_per_class", "eval_split", "noise_off",
                       "noise_off_parts"})


def build_config(method: str | None = None, dataset: str | None = None, *, epsilon: float | None = None,
                 delta: float | None = None, preset: str | None = None, n_d: str | int | None = None,
                 sets: tuple[str, ...] | list[str] = (), hparams: dict[str, Any] | None = None,
                 config_file: str | Path | None = None, seed: int | None = None, members: int | None = None,
                 device: str | None = None, evaluators: str | list[str] | tuple[str, ...] | None = None,
                 eval_split: str | None = None, noise_off: bool | None = None,
                 noise_off_parts: tuple[str, ...] | list[str] | None = None,
                 canaries: int | None = None, gradient_canaries: int | None = None) -> RunConfig:
    """A validated ``RunConfig``: given values > ``config_file`` > preset > ``Hparams``
    defaults. ``hparams`` (a mapping) and ``sets`` (``KEY=VALUE`` strings) override method
    settings, ``sets`` last. ``epsilon`` None: required for a private method, ∞ otherwise."""
    file_cfg = load_config_file(config_file) if config_file else {}
    file_hp = file_cfg.pop("hparams", {}) or {}
    if not isinstance(file_hp, dict):
        raise UserError(f"config file {config_file}: 'hparams' must be a mapping of method settings")
    unknown = set(file_cfg) - FILE_KEYS
    if unknown:
        raise UserError(f"config file {config_file}: unknown keys {sorted(unknown)} (run keys: "
                        f"{', '.join(sorted(FILE_KEYS))}; method settings go under 'hparams')")
    method = method or file_cfg.get("method")
    if not method:
        raise UserError("--method is required (bench list methods)")
    dataset = dataset or file_cfg.get("dataset", "digits")
    method_cls = registry.methods.get(method)
    registry.datasets.get(dataset)
    preset = preset or file_cfg.get("preset") or default_preset(method_cls, dataset)
    set_values = parse_set(sets)
    overrides = {**file_hp, **(hparams or {}), **set_values}
    sources = {**{k: f"--config {config_file} (hparams)" for k in file_hp}, **{k: "hparams" for k in hparams or {}},
               **{k: "--set" for k in set_values}}
    if n_d is not None:
        overrides["n_d"] = parse_n_d(n_d)
        sources["n_d"] = "--n-d"
    hp, run_level = resolve_hparams(method_cls, preset, dataset, overrides, sources)
    if epsilon is None:
        epsilon = file_cfg.get("epsilon", file_cfg.get("eps"))
    if epsilon is None:
        if method_cls.private:
            raise UserError(f"--eps is required for private method '{method}'")
        epsilon = math.inf
    if evaluators is None:
        evaluators = file_cfg.get("evaluators", run_level.get("evaluators"))
    if delta is None:
        delta = file_cfg.get("delta", run_level.get("delta", DEFAULT_DELTA))
    kwargs = dict(
        method=method, dataset=dataset, epsilon=float(epsilon), delta=float(delta), preset=preset,
        seed=parse_seed(seed if seed is not None else file_cfg.get("seed", 0)),
        members=members if members is not None else file_cfg.get("members"),
        device=device or file_cfg.get("device", "auto"),
        samples_per_class=int(file_cfg.get("samples_per_class", run_level.get("samples_per_class", 100))),
        hparams=dataclasses.asdict(hp),
        eval_split=eval_split or file_cfg.get("eval_split", "test"),
        noise_off=bool(noise_off if noise_off is not None else file_cfg.get("noise_off", False)),
        noise_off_parts=tuple(dict.fromkeys(noise_off_parts if noise_off_parts else
                                            file_cfg.get("noise_off_parts", ()))),
        canaries=canaries,
        gradient_canaries=gradient_canaries,
    )
    for given in (canaries, gradient_canaries):
        if given is not None and given < 2:
            raise UserError("--canaries must be ≥ 2")
    if kwargs["noise_off"] and kwargs["noise_off_parts"]:
        raise UserError("--noise-off switches every part's noise off; --noise-off-part some of them: give one")
    if canaries and gradient_canaries:
        raise UserError("an audit places image canaries or gradient canaries (--white-box), not both")
    if kwargs["eval_split"] not in EVAL_SPLITS:
        raise UserError(f"eval_split must be one of {', '.join(EVAL_SPLITS)}, got {kwargs['eval_split']!r}")
    if evaluators is not None:
        if isinstance(evaluators, str):
            evaluators = [e.strip() for e in evaluators.split(",") if e.strip()]
        kwargs["evaluators"] = tuple(evaluators)
    return RunConfig(**kwargs)
