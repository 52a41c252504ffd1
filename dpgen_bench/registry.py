"""A small generic registry per kind of plugin (methods, evaluators, datasets).

Built-ins are listed lazily as ``"module:attr"`` strings so that ``bench list`` does not
import torch-heavy modules; third-party plugins arrive through entry points in the groups
``dpgen_bench.methods``, ``dpgen_bench.evaluators`` and ``dpgen_bench.datasets``.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Iterator
from importlib.metadata import entry_points
from typing import Generic, TypeVar

from .errors import UserError

T = TypeVar("T")


def suggest(name: str, known: list[str]) -> str:
    """' (did you mean 'x'?)' or a list of the known names, for one-line errors."""
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.5)
    if close:
        return f" (did you mean '{close[0]}'?)"
    return f" (known: {', '.join(sorted(known))})" if known else ""


class Registry(Generic[T]):
    def __init__(self, kind: str, entry_point_group: str | None = None):
        self.kind = kind
        self.entry_point_group = entry_point_group
        self._items: dict[str, T | str] = {}
        self._hidden: set[str] = set()
        self._meta: dict[str, dict] = {}
        self._entry_points_loaded = False

    def register(self, name: str, obj: T | str, *, replace: bool = False, hidden: bool = False,
                 **meta) -> None:
        """Register ``obj`` (or a lazy ``"module:attr"`` reference) under ``name``. ``meta``
        holds cheap attributes (e.g. ``higher_is_better``) readable without importing."""
        if name in self._items and not replace:
            raise ValueError(f"{self.kind} '{name}' is already registered")
        self._items[name] = obj
        self._meta[name] = meta
        if hidden:
            self._hidden.add(name)
        else:
            self._hidden.discard(name)

    def decorator(self, name: str, **kw):
        def wrap(obj: T) -> T:
            self.register(name, obj, **kw)
            return obj

        return wrap

    def _load_entry_points(self) -> None:
        if self._entry_points_loaded or not self.entry_point_group:
            return
        self._entry_points_loaded = True
        for ep in entry_points(group=self.entry_point_group):
            if ep.name not in self._items:
                self._items[ep.name] = ep.value

    def attribute(self, name: str, attr: str):
        """An attribute of a registered object, from its registration metadata when given
        (no import), else from the object itself."""
        if attr in self._meta.get(name, {}):
            return self._meta[name][attr]
        return getattr(self.get(name), attr)

    def names(self, *, include_hidden: bool = False) -> list[str]:
        self._load_entry_points()
        return sorted(n for n in self._items if include_hidden or n not in self._hidden)

    def __contains__(self, name: str) -> bool:
        self._load_entry_points()
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def get(self, name: str) -> T:
        self._load_entry_points()
        if name not in self._items:
            raise UserError(f"unknown {self.kind} '{name}'{suggest(name, self.names())}")
        obj = self._items[name]
        if isinstance(obj, str):
            module, _, attr = obj.partition(":")
            loaded = importlib.import_module(module)
            obj = getattr(loaded, attr) if attr else loaded
            self._items[name] = obj
        return obj  # type: ignore[return-value]


methods: Registry = Registry("method", "dpgen_bench.methods")
evaluators: Registry = Registry("evaluator", "dpgen_bench.evaluators")
datasets: Registry = Registry("dataset", "dpgen_bench.datasets")

# Built-ins, imported only when asked for.
methods.register("dpgan", "methods.dpgan:DPGAN")
methods.register("gan", "methods.gan:GAN")
methods.register("dpaf", "methods.dpaf:DPAF")
methods.register("gswgan", "methods.gswgan:GSWGAN")
methods.register("dpac", "methods.dpac:DPAC")
methods.register("dummy", "methods.dummy:Dummy", hidden=True)
evaluators.register("fid", "evaluators.fid:FID", higher_is_better=False)
evaluators.register("kid", "evaluators.fid:KID", higher_is_better=False)
evaluators.register("gen2real_cnn", "evaluators.transfer:Gen2RealCNN", higher_is_better=True)
evaluators.register("gen2real_mlp", "evaluators.transfer:Gen2RealMLP", higher_is_better=True)
evaluators.register("real2gen_cnn", "evaluators.transfer:Real2GenCNN", higher_is_better=True)
evaluators.register("real2gen_mlp", "evaluators.transfer:Real2GenMLP", higher_is_better=True)
for _attack, _cls in (("full_black_box", "MIAFullBlackBox"), ("partial_black_box", "MIAPartialBlackBox"),
                      ("white_box", "MIAWhiteBox")):
    evaluators.register(f"mia_auc_{_attack}", f"evaluators.mia:{_cls}", higher_is_better=False)
    evaluators.register(f"mia_auc_{_attack}_calibrated", f"evaluators.mia:{_cls}Calibrated", higher_is_better=False)
datasets.register("digits", "dpgen_bench.data.digits:load_digits_data")
datasets.register("mnist", "dpgen_bench.data.mnist:load_mnist")
datasets.register("mnist-32", "dpgen_bench.data.mnist:load_mnist_32")
datasets.register("fashion-mnist", "dpgen_bench.data.mnist:load_fashion_mnist")
datasets.register("fashion-mnist-32", "dpgen_bench.data.mnist:load_fashion_mnist_32")
datasets.register("celeba-gender", "dpgen_bench.data.celeba:load_celeba_gender")
datasets.register("celeba-gender-32", "dpgen_bench.data.celeba:load_celeba_gender_32")
datasets.register("celeba-hair", "dpgen_bench.data.celeba:load_celeba_hair")
datasets.register("celeba-hair-32", "dpgen_bench.data.celeba:load_celeba_hair_32")
datasets.register("ffhq-gender", "dpgen_bench.data.ffhq:load_ffhq_gender")
datasets.register("ffhq-gender-64", "dpgen_bench.data.ffhq:load_ffhq_gender_64")
