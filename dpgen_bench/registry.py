"""A small generic registry per kind of plugin (methods, evaluators, datasets).

Built-ins are listed lazily as ``"module:attr"`` strings so that ``bench list`` does not
import torch-heavy modules; third-party plugins arrive through entry points in the groups
``dpgen_bench.methods``, ``dpgen_bench.evaluators`` and ``dpgen_bench.datasets``.

A name is never taken over silently: an entry point named like an already registered
(built-in) name, or like an entry point of another distribution seen earlier, is ignored
with one warning on the ``dpgen_bench`` logger. A plugin whose target cannot be imported
is still listed by ``names()``; ``get`` turns the failure into a one-line ``UserError``.
"""

from __future__ import annotations

import difflib
import importlib
import logging
from collections.abc import Iterator
from importlib.metadata import EntryPoint, entry_points
from typing import Generic, TypeVar

from .errors import UserError

T = TypeVar("T")

log = logging.getLogger("dpgen_bench")


def suggest(name: str, known: list[str]) -> str:
    """' (did you mean 'x'?)' or a list of the known names, for one-line errors."""
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.5)
    if close:
        return f" (did you mean '{close[0]}'?)"
    return f" (known: {', '.join(sorted(known))})" if known else ""


def _dist_name(ep: EntryPoint) -> str:
    """The name of the distribution that provides ``ep`` ('?' where it is not known)."""
    dist = getattr(ep, "dist", None)
    if dist is None:
        return "?"
    try:
        return dist.name or "?"
    except Exception:  # noqa: BLE001 - odd metadata: the name is only for a message
        return "?"


def _resolve(reference: str):
    """The object a lazy ``"module:attr"`` (or ``"module"``) reference names."""
    module, _, attr = reference.partition(":")
    loaded = importlib.import_module(module)
    return getattr(loaded, attr) if attr else loaded


class Registry(Generic[T]):
    def __init__(self, kind: str, entry_point_group: str | None = None):
        self.kind = kind
        self.entry_point_group = entry_point_group
        self._items: dict[str, T | str | EntryPoint] = {}
        self._plugins: dict[str, EntryPoint] = {}  # names taken by entry points, in load order
        self._hidden: set[str] = set()
        self._meta: dict[str, dict] = {}
        # what each name was registered as, when another process can find it too: a lazy
        # "module:attr" reference or an entry point (None: an object handed over in this process)
        self._sources: dict[str, str | EntryPoint | None] = {}
        self._entry_points_loaded = False

    def register(self, name: str, obj: T | str, *, replace: bool = False, hidden: bool = False,
                 **meta) -> None:
        """Register ``obj`` (or a lazy ``"module:attr"`` reference) under ``name``. ``meta``
        holds cheap attributes (e.g. ``higher_is_better``) readable without importing."""
        if name in self._items and not replace:
            raise ValueError(f"{self.kind} '{name}' is already registered")
        self._items[name] = obj
        self._sources[name] = obj if isinstance(obj, (str, EntryPoint)) else None
        self._meta[name] = meta
        if hidden:
            self._hidden.add(name)
        else:
            self._hidden.discard(name)

    def _load_entry_points(self) -> None:
        if self._entry_points_loaded or not self.entry_point_group:
            return
        self._entry_points_loaded = True
        group = self.entry_point_group
        for ep in entry_points(group=group):
            where = f"'{ep.name}' = {ep.value} (distribution '{_dist_name(ep)}')"
            if ep.name in self._plugins:
                first = self._plugins[ep.name]
                log.warning("%s plugin %s is ignored: distribution '%s' also provides %s '%s' (%s), which is kept; "
                            "to use both, one of them must name its entry point in group %s differently",
                            self.kind, where, _dist_name(first), self.kind, ep.name, first.value, group)
            elif ep.name in self._items:
                log.warning("%s plugin %s is ignored: the built-in %s '%s' is kept; to use the plugin, register "
                            "it under another name (rename its entry point in group %s, or call "
                            "dpgen_bench.registry.%ss.register('<new name>', '%s'))",
                            self.kind, where, self.kind, ep.name, group, self.kind, ep.value)
            else:
                self._items[ep.name] = ep
                self._sources[ep.name] = ep
                self._plugins[ep.name] = ep

    def attribute(self, name: str, attr: str):
        """An attribute of a registered object, from its registration metadata when given
        (no import), else from the object itself."""
        if attr in self._meta.get(name, {}):
            return self._meta[name][attr]
        return getattr(self.get(name), attr)

    def only_in_this_process(self, name: str) -> bool:
        """Whether ``name`` stands for an object given to this process only (``register(name,
        obj)`` at run time, or an entry replaced in place), not one a new process finds from a
        ``"module:attr"`` reference or an entry point: a sweep's worker processes and Ray tasks
        import the registry afresh and would run something else, or nothing."""
        self._load_entry_points()
        if name not in self._items:
            return False
        source, obj = self._sources.get(name), self._items[name]
        if source is None:
            return True
        if obj is source:
            return False
        return obj is not (source.load() if isinstance(source, EntryPoint) else _resolve(source))

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
        if isinstance(obj, EntryPoint):
            try:
                obj = obj.load()
            except Exception as e:  # noqa: BLE001 - any failure of a third-party import: one line
                msg = " ".join(f"{type(e).__name__}: {e}".split())
                raise UserError(f"{self.kind} plugin '{name}' from distribution '{_dist_name(self._items[name])}' "
                                f"cannot be loaded ({self._items[name].value}): {msg}") from None
            self._items[name] = obj
        elif isinstance(obj, str):
            obj = _resolve(obj)
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
methods.register("dpmean", "methods.dpmean:DPMean")
methods.register("dpmerf", "methods.dpmerf:DPMERF")
methods.register("dpkernel", "methods.dpkernel:DPKernel")
methods.register("dpntk", "methods.dpntk:DPNTK")
methods.register("dpsinkhorn", "methods.dpsinkhorn:DPSinkhorn")
methods.register("dpdm", "methods.dpdm:DPDM")
methods.register("dummy", "methods.dummy:Dummy", hidden=True)
evaluators.register("fid", "evaluators.fid:FID", higher_is_better=False)
evaluators.register("fid_train", "evaluators.fid:FIDTrain", higher_is_better=False)
evaluators.register("kid", "evaluators.fid:KID", higher_is_better=False)
evaluators.register("prc", "evaluators.fid:PRC", higher_is_better=True,
                    metric_names=("precision", "recall", "density", "coverage"))
evaluators.register("gen2real_cnn", "evaluators.transfer:Gen2RealCNN", higher_is_better=True)
evaluators.register("gen2real_resnet", "evaluators.transfer:Gen2RealResNet", higher_is_better=True)
evaluators.register("gen2real_mlp", "evaluators.transfer:Gen2RealMLP", higher_is_better=True)
evaluators.register("gen2real_all", "evaluators.transfer:Gen2RealAll", higher_is_better=True)
evaluators.register("real2gen_cnn", "evaluators.transfer:Real2GenCNN", higher_is_better=True)
evaluators.register("real2gen_mlp", "evaluators.transfer:Real2GenMLP", higher_is_better=True)
for _attack, _cls in (("full_black_box", "MIAFullBlackBox"), ("partial_black_box", "MIAPartialBlackBox"),
                      ("white_box", "MIAWhiteBox")):
    evaluators.register(f"mia_auc_{_attack}", f"evaluators.mia:{_cls}", higher_is_better=False)
    evaluators.register(f"mia_auc_{_attack}_calibrated", f"evaluators.mia:{_cls}Calibrated", higher_is_better=False)
datasets.register("digits", "dpgen_bench.data.digits:load_digits_data")
datasets.register("mnist-5k", "dpgen_bench.data.mnist5k:load_mnist_5k")
datasets.register("mnist-5k-32", "dpgen_bench.data.mnist5k:load_mnist_5k_32")
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
