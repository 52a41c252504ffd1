"""Each method setting's valid range, declared once beside its type and default, and the one
check of it.

A method's ``Hparams`` declares a range in a field's annotation, with ``typing.Annotated``::

    d_width: Annotated[int, Ge(1)] = 128  # or PositiveInt: the same declaration, named
    noise_multiplier: Annotated[float, Gt(0)] | None = None  # None is not checked
    ema_decay: Annotated[float, Interval(0, 1, "[)")] = 0.0
    ch_mult: tuple[Annotated[int, Ge(1)], ...] = (1, 2, 2)  # every element

``check_settings`` is the one validator: ``config.resolve_hparams`` calls it on every value a
run will use (the defaults, the preset, ``--config``, ``--set``) before anything runs, and a
value out of range is one line that says where it came from, the setting, the value and the
range (exit 2). A ``Hparams.__post_init__`` that calls ``check_declared(self)`` refuses the
same values where code builds the settings; the runner rebuilds a run's recorded settings
under ``as_recorded()``, so a record is never refused by a range declared after it was made.
``typing.get_type_hints`` without ``include_extras`` drops the annotation, so
``config.coerce`` sees the plain type; a setting without a declaration is type-checked only.
Every range is of finite numbers: NaN and ±∞ are outside all of them.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import math
import types
import typing
from collections.abc import Iterator, Mapping
from typing import Annotated, Any

from .errors import SettingOutOfRange


@dataclasses.dataclass(frozen=True)
class Interval:
    """The finite numbers from ``lo`` to ``hi`` (None: no bound on that side), each end closed
    or open as ``ends`` says: "[]", "[)", "(]" or "()"."""

    lo: float | None = None
    hi: float | None = None
    ends: str = "[]"

    def __post_init__(self):
        if self.ends not in ("[]", "[)", "(]", "()"):
            raise ValueError(f"ends must be one of [], [), (], (), got {self.ends!r}")

    def holds(self, x: float) -> bool:
        if not math.isfinite(x):
            return False
        if self.lo is not None and (x < self.lo or (x == self.lo and self.ends[0] == "(")):
            return False
        return self.hi is None or not (x > self.hi or (x == self.hi and self.ends[1] == ")"))

    def __str__(self) -> str:
        if self.lo is not None and self.hi is not None:
            return f"in {self.ends[0]}{_shown(self.lo)}, {_shown(self.hi)}{self.ends[1]}"
        if self.lo is not None:
            return f"{'≥' if self.ends[0] == '[' else '>'} {_shown(self.lo)}"
        if self.hi is not None:
            return f"{'≤' if self.ends[1] == ']' else '<'} {_shown(self.hi)}"
        return "finite"


def Ge(lo: float) -> Interval:  # noqa: N802 - read as a bound in an annotation
    """≥ ``lo``."""
    return Interval(lo, None, "[]")


def Gt(lo: float) -> Interval:  # noqa: N802
    """> ``lo``."""
    return Interval(lo, None, "(]")


def Le(hi: float) -> Interval:  # noqa: N802
    """≤ ``hi``."""
    return Interval(None, hi, "[]")


def Lt(hi: float) -> Interval:  # noqa: N802
    """< ``hi``."""
    return Interval(None, hi, "[)")


def Finite() -> Interval:  # noqa: N802
    """Any finite number (a float setting that may be negative, e.g. EDM's ``p_mean``)."""
    return Interval()


# The ranges most settings have, named (the declaration is the same written out in full):
PositiveInt = Annotated[int, Ge(1)]  # sizes, widths, steps, batch sizes, intervals
NonNegativeInt = Annotated[int, Ge(0)]  # counts where 0 means "none"
PositiveFloat = Annotated[float, Gt(0)]  # learning rates, clip bounds, noise multipliers
NonNegativeFloat = Annotated[float, Ge(0)]  # loss weights, where 0 switches a term off
Decay = Annotated[float, Interval(0, 1, "[)")]  # Adam's betas, EMA decays (0: none)


@functools.cache
def declared(hparams_cls: type) -> dict[str, tuple[Interval, ...]]:
    """The ranges ``hparams_cls`` declares, by setting (settings without one are left out)."""
    hints = typing.get_type_hints(hparams_cls, include_extras=True)
    out = {f.name: tuple(_bounds(hints[f.name])) for f in dataclasses.fields(hparams_cls)}
    return {k: v for k, v in out.items() if v}


def _bounds(hint: Any) -> list[Interval]:
    """The bounds in ``hint``: its own (``Annotated``), its union members' and its elements'."""
    if typing.get_origin(hint) is Annotated:
        base, *meta = typing.get_args(hint)
        return [*_bounds(base), *(m for m in meta if isinstance(m, Interval))]
    if typing.get_origin(hint) is typing.Literal:
        return []
    return [b for arg in typing.get_args(hint) for b in _bounds(arg)]


def _numbers(value: Any) -> list[float]:
    """The numbers a range applies to: the value itself, or each element of a tuple or list."""
    if isinstance(value, bool):
        return []
    if isinstance(value, (int, float)):
        return [value]
    if isinstance(value, (tuple, list)):
        return [x for v in value for x in _numbers(v)]
    return []


def check_settings(method_cls: type, values: Mapping[str, Any], where: Mapping[str, str] | None = None) -> None:
    """Each of ``values`` (setting → value) inside the range its ``Hparams`` declares, else
    ``SettingOutOfRange``: one line with where the value came from (``where``: setting →
    ``--set``, ``preset 'quick'``, …), the setting, the value and the range. ``method_cls``: a
    method class (its ``Hparams`` is read) or a ``Hparams`` class itself."""
    hparams_cls = getattr(method_cls, "Hparams", method_cls)
    ranges = declared(hparams_cls)
    for key, value in values.items():
        for bound in ranges.get(key, ()):
            if all(bound.holds(x) for x in _numbers(value)):
                continue
            source = f"{where[key]} " if where and key in where else ""
            each = "every value of " if isinstance(value, (tuple, list)) else ""
            name = getattr(method_cls, "name", None) if hparams_cls is not method_cls else None
            listing = f" (bench list settings {name})" if isinstance(name, str) else ""
            raise SettingOutOfRange(f"{source}{key}={_shown(value)} is out of range: {each}{key} must be {bound}"
                                    f"{listing}")


def defaults(hparams_cls: type) -> dict[str, Any]:
    """Every setting's default (fields without one are left out)."""
    out = {}
    for f in dataclasses.fields(hparams_cls):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out


_AS_RECORDED = contextvars.ContextVar("settings_as_recorded", default=False)


@contextlib.contextmanager
def as_recorded() -> Iterator[None]:
    """Settings built inside this block are not checked against their declared ranges: a
    run's recorded settings, accepted when it was made (``bench eval``, ``--resume``)."""
    token = _AS_RECORDED.set(True)
    try:
        yield
    finally:
        _AS_RECORDED.reset(token)


def check_declared(hparams: Any) -> None:
    """For a ``Hparams.__post_init__``: every value inside its declared range, else
    ``SettingOutOfRange`` (a ValueError); nothing is checked under ``as_recorded()``."""
    if not _AS_RECORDED.get():
        check_settings(type(hparams), {f.name: getattr(hparams, f.name) for f in dataclasses.fields(hparams)})


def describe(hparams_cls: type) -> list[tuple[str, str, str, str]]:
    """(setting, type, range, default) of every setting, as ``bench list settings`` prints them."""
    plain = typing.get_type_hints(hparams_cls)
    ranges, given = declared(hparams_cls), defaults(hparams_cls)
    rows = []
    for f in dataclasses.fields(hparams_cls):
        each = "each " if typing.get_origin(plain[f.name]) in (tuple, list) else ""
        bounds = " and ".join(map(str, ranges.get(f.name, ())))
        rows.append((f.name, _type_text(plain[f.name]), f"{each}{bounds}" if bounds else "-",
                     _shown(given[f.name]) if f.name in given else "(required)"))
    return rows


def _type_text(hint: Any) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Literal:
        return " | ".join(repr(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_text(a) for a in args)
    if origin in (tuple, list):
        return f"list of {_type_text(args[0]) if args else 'str'}"
    if hint is type(None):
        return "None"
    return getattr(hint, "__name__", str(hint))


def _shown(value: Any) -> str:
    """A value as ``--set`` takes it: 1e-05, -1, true, 1,2,2, None."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        text = repr(value)
        return text[:-2] if text.endswith(".0") else text
    if isinstance(value, (tuple, list)):
        return ",".join(_shown(v) for v in value)
    return str(value)
