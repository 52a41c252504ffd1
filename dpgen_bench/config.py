"""Run configuration: a frozen ``RunConfig``; precedence CLI > ``--config`` file > preset >
the method's ``Hparams`` defaults.

Presets live on each method class (``Method.presets``): ``{preset: {dataset | "*": {...}}}``.
Besides the method's hyperparameters a preset may set the run-level keys in
``RUN_KEYS`` (e.g. which evaluators run, how many samples are drawn).
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import UserError
from .registry import suggest

DEFAULT_DELTA = 1e-5
DEFAULT_EVALUATORS = ("gen2real_cnn",)
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

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["evaluators"] = list(self.evaluators)
        d["epsilon"] = _json_float(self.epsilon)
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "RunConfig":
        d = dict(d)
        d["epsilon"] = float(d["epsilon"])
        d["evaluators"] = tuple(d.get("evaluators", DEFAULT_EVALUATORS))
        d.setdefault("eval_split", "test")  # records written before --eval-split existed
        return cls(**d)


def _json_float(x: float) -> float | str:
    return x if math.isfinite(x) else ("inf" if x > 0 else "-inf")


# ----------------------------------------------------------------------- presets


def preset_overrides(method_cls: type, preset: str, dataset: str) -> dict[str, Any]:
    presets = getattr(method_cls, "presets", {})
    if preset not in presets:
        raise UserError(f"unknown preset '{preset}' for method '{method_cls.name}'{suggest(preset, list(presets))}")
    per_dataset = presets[preset]
    if dataset in per_dataset:
        return dict(per_dataset[dataset])
    if "*" in per_dataset:
        return dict(per_dataset["*"])
    have = ", ".join(sorted(per_dataset))
    raise UserError(f"preset '{preset}' of method '{method_cls.name}' has no settings for dataset '{dataset}' (has: {have})")


def hparam_fields(hparams_cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(hparams_cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(hparams_cls)}


def coerce(key: str, value: Any, annotation: Any) -> Any:
    """Convert ``value`` (a string from ``--set`` or a JSON value) to the field's type."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null")):
            if type(None) in args:
                return None
        options = [a for a in args if a is not type(None)]
        if len(options) == 1:
            return coerce(key, value, options[0])
        for a in options:
            try:
                return coerce(key, value, a)
            except UserError:
                pass
        names = " or ".join(_type_name(a) for a in options)
        raise UserError(f"--set {key}: expected {names}, got {value!r}")
    if origin is typing.Literal:
        if value in args:
            return value
        raise UserError(f"--set {key}: {value!r} is not one of {list(args)}{suggest(str(value), [str(a) for a in args])}")
    if origin in (tuple, list):
        if isinstance(value, str):
            value = [v for v in value.split(",") if v]
        inner = args[0] if args else str
        return tuple(coerce(key, v, inner) for v in value)
    if annotation is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("1", "true", "yes", "on", "0", "false", "no", "off"):
            return value.lower() in ("1", "true", "yes", "on")
        raise UserError(f"--set {key}: expected true/false, got {value!r}")
    if annotation is int:
        if isinstance(value, bool):
            raise UserError(f"--set {key}: expected an integer, got {value!r}")
        try:
            f = float(value)
        except (TypeError, ValueError):
            raise UserError(f"--set {key}: expected an integer, got {value!r}") from None
        if not f.is_integer():
            raise UserError(f"--set {key}: expected an integer, got {value!r}")
        return int(f)
    if annotation is float:
        try:
            return float(value)
        except (TypeError, ValueError):
            raise UserError(f"--set {key}: expected a number, got {value!r}") from None
    if annotation is str:
        return str(value)
    return value


def _type_name(a: Any) -> str:
    if typing.get_origin(a) is typing.Literal:
        return " or ".join(repr(x) for x in typing.get_args(a))
    return {int: "an integer", float: "a number", bool: "true/false", str: "a string"}.get(a, str(a))


def resolve_hparams(method_cls: type, preset: str, dataset: str, overrides: dict[str, Any]):
    """Defaults < preset < overrides; unknown keys and wrong types are user errors."""
    fields = hparam_fields(method_cls.Hparams)
    values = preset_overrides(method_cls, preset, dataset)
    run_level = {k: values.pop(k) for k in list(values) if k in RUN_KEYS}
    for key, value in overrides.items():
        if key not in fields:
            raise UserError(f"--set: '{method_cls.name}' has no setting '{key}'{suggest(key, list(fields))}")
        values[key] = value
    coerced = {k: coerce(k, v, fields[k]) for k, v in values.items()}
    try:
        hp = method_cls.Hparams(**coerced)
    except (TypeError, ValueError) as e:
        raise UserError(f"invalid settings for '{method_cls.name}': {e}") from None
    return hp, run_level


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
