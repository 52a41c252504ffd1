"""The contracts between the harness and its plugins, and nothing else.

Images are float32 tensors in [-1, 1], NCHW; labels are int64.
"""

from __future__ import annotations

import abc
import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor

from .config import EVAL_SPLITS  # noqa: F401 - re-exported; defined there so that the CLI need not import torch
from .identity import BOOKKEEPING_HPARAMS


# --------------------------------------------------------------------------- data

VAL_FRACTION = 0.15  # share of the training split held out by --eval-split val (stratified)
VAL_SEED = 0  # the validation part is the same for every run of a dataset


@dataclass(frozen=True)
class Split:
    """One split of a dataset as cached tensors (never a per-item Python loop)."""

    images: Tensor  # float32, NCHW, [-1, 1]
    labels: Tensor  # int64, N

    def __post_init__(self) -> None:
        if len(self.images) != len(self.labels):
            raise ValueError("images and labels differ in length")

    def __len__(self) -> int:
        return len(self.labels)

    def subset(self, indices: np.ndarray | Tensor) -> "Split":
        """Rows ``indices`` (numpy or a tensor on any device; never via numpy, which cannot
        read a CUDA tensor), gathered on the split's own device."""
        dev = self.labels.device
        if isinstance(indices, Tensor):
            idx = indices.to(device=dev, dtype=torch.long)
        else:
            idx = torch.as_tensor(np.asarray(indices), dtype=torch.long, device=dev)
        return Split(self.images[idx], self.labels[idx])

    def to(self, device: torch.device | str) -> "Split":
        return Split(self.images.to(device), self.labels.to(device))


@dataclass(frozen=True)
class ImageData:
    """A labelled image dataset with fixed train / test splits.

    ``member_indices`` / ``nonmember_indices`` are set when the run trains on a member
    subset (``--members N``): indices into the train and held-out splits the run uses.

    ``eval_split`` names what ``test`` holds: the real test split ("test"), or a validation
    part carved out of the training split ("val", ``with_validation``) for choosing
    hyperparameters without looking at the test split.
    """

    name: str
    train: Split
    test: Split
    class_names: tuple[str, ...]
    member_indices: np.ndarray | None = None
    nonmember_indices: np.ndarray | None = None
    description: str = ""
    eval_split: str = "test"
    canaries: Split | None = None  # bench audit: every canary, included in train or not
    canary_included: np.ndarray | None = None  # bool per canary: in the training split

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return tuple(self.train.images.shape[1:])  # type: ignore[return-value]

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def with_members(self, n: int, seed: int) -> "ImageData":
        """Train on ``n`` training images only; the same number of test images are the
        non-members (GAN-Leaks protocol). Uniform random choice without replacement, seeded
        (not stratified: a class's share of the members varies around its share of the split)."""
        rng = np.random.default_rng(seed)
        members = np.sort(rng.choice(len(self.train), size=n, replace=False))
        nonmembers = np.sort(rng.choice(len(self.test), size=n, replace=False))
        return dataclasses.replace(
            self,
            train=self.train.subset(members),
            member_indices=members,
            nonmember_indices=nonmembers,
        )

    def with_canaries(self, m: int, seed: int, pool: Split | None = None) -> "ImageData":
        """Add ``m`` audit canaries (one-run auditing): each is an image of ``pool`` (default:
        the training split; the runner passes the whole training split under ``--members``)
        turned negative (x → −x) with a different label drawn at random, so that it is unlike
        any real record; each enters the training split independently with probability 1/2.
        The images are drawn without replacement, so ``m`` may not exceed the pool (a
        ValueError): two canaries never share an image, so none can stand in for another (with
        ``--members 16`` a member-only pool made ~8 canaries of each image, some of them equal
        in image and label, one included and one not). Seeded by ``seed``; the canaries and
        which were included are kept for scoring."""
        src = self.train if pool is None else pool
        if m > len(src):
            raise ValueError(f"{m} canaries need {m} distinct images; the pool has {len(src)}")
        rng = np.random.default_rng([seed, 0xCA9A])
        base = rng.choice(len(src), size=m, replace=False)
        labels = src.labels.cpu().numpy()[base]
        shift = rng.integers(1, self.num_classes, size=m)  # never the image's own label
        canaries = Split(-src.images[torch.as_tensor(base, device=src.images.device)].to(self.train.images.device),
                         torch.as_tensor((labels + shift) % self.num_classes, device=self.train.labels.device))
        included = rng.random(m) < 0.5
        keep = canaries.subset(np.flatnonzero(included))
        train = Split(torch.cat([self.train.images, keep.images]), torch.cat([self.train.labels, keep.labels]))
        return dataclasses.replace(self, train=train, canaries=canaries, canary_included=included)

    def with_validation(self, fraction: float = VAL_FRACTION, seed: int = VAL_SEED) -> "ImageData":
        """Train on the training split minus a stratified ``fraction`` of it, evaluate on that
        part (it becomes ``test``; the real test split is dropped). The part is fixed by
        ``seed``, not by the run's seed, so every run of a dataset sees the same one."""
        from sklearn.model_selection import train_test_split

        if self.eval_split != "test" or self.member_indices is not None:
            raise ValueError("with_validation applies to the full dataset, before --members")
        labels = self.train.labels.cpu().numpy()
        fit, val = train_test_split(np.arange(len(labels)), test_size=fraction, stratify=labels,
                                    random_state=seed)
        return dataclasses.replace(self, train=self.train.subset(np.sort(fit)), test=self.train.subset(np.sort(val)),
                                   eval_split="val")

    def to(self, device: torch.device | str) -> "ImageData":
        return dataclasses.replace(self, train=self.train.to(device), test=self.test.to(device))


@dataclass(frozen=True)
class DataInfo:
    """What a method may know about the data before it sees any of it."""

    name: str
    image_shape: tuple[int, int, int]
    num_classes: int
    n_train: int


# ------------------------------------------------------------------------ privacy


@dataclass(frozen=True)
class Budget:
    """The shared privacy budget (ε, δ); ε = ∞ for a non-private method."""

    epsilon: float
    delta: float = 1e-5

    @property
    def private(self) -> bool:
        return math.isfinite(self.epsilon)


@dataclass(frozen=True)
class PrivacyPart:
    """One private mechanism of a method, repeated ``steps`` times.

    ``noise_multiplier`` is the noise std divided by the sensitivity; ``sample_rate`` is
    the Poisson sampling probability (1.0: the whole dataset every step).
    ``noise_to_signal`` (set by the runner from :meth:`Method.noise_to_signal`; None where
    the method does not say) is the norm of the noise on one step's released average in
    units of the largest signal a record can give it: σ·√d / B for DP-SGD on d parameters
    at expected batch B. Above ~1 the update is mostly noise, whatever ε says.
    """

    name: str
    noise_multiplier: float
    sample_rate: float
    steps: int
    mechanism: str = "subsampled_gaussian"
    epsilon: float = float("nan")  # this part alone, RDP, at the run's δ
    noise_to_signal: float | None = None

    def to_json(self) -> dict[str, Any]:
        out = {
            "name": self.name,
            "mechanism": self.mechanism,
            "noise_multiplier": self.noise_multiplier,
            "sample_rate": self.sample_rate,
            "steps": self.steps,
            "epsilon": self.epsilon,
        }
        if self.noise_to_signal is not None:  # records of methods that do not say keep their old form
            out["noise_to_signal"] = self.noise_to_signal
        return out


@dataclass(frozen=True)
class PrivacyReport:
    """The ε a run spent: its parts (with the steps taken) composed by RDP (the number
    compared with the target) and PRV (beside it), for the target ``budget``."""

    budget: Budget
    parts: tuple[PrivacyPart, ...] = ()
    epsilon_rdp: float = 0.0
    epsilon_prv: float = 0.0
    caveat: str | None = None  # set when the ε is not a DP guarantee of the run (Method.accounting_caveat)
    noise_off: bool = False  # a --noise-off diagnostic: ε = ∞, the parts keep the calibrated σ
    noise_off_parts: tuple[str, ...] = ()  # --noise-off-part: only these parts' noise was off (noise_off too)
    # measured per-part gradient norms and noise to signal (privacy.telemetry): computed on the
    # private data without noise, a diagnostic outside the guarantee
    telemetry: dict[str, Any] | None = None

    @property
    def private(self) -> bool:
        return self.budget.private

    def to_json(self) -> dict[str, Any]:
        return {
            "private": self.private,
            "target": {"epsilon": self.budget.epsilon, "delta": self.budget.delta},
            "parts": [p.to_json() for p in self.parts],
            "epsilon": {"rdp": self.epsilon_rdp, "prv": self.epsilon_prv},
            "caveat": self.caveat,
            **({"noise_off": True} if self.noise_off else {}),
            **({"noise_off_parts": list(self.noise_off_parts)} if self.noise_off_parts else {}),
            **({"telemetry": self.telemetry} if self.telemetry else {}),
        }


# ------------------------------------------------------------------------ methods


class RunContext(abc.ABC):
    """What the runner gives ``Method.fit``: the device, the seed, the calibrated privacy
    parts and the count of private steps, seeded generators of randomness, progress,
    training-curve records and checkpoints. Methods never print.

    Privacy: ``part(name)`` is the part ``plan`` declared, calibrated (its noise
    multiplier, sample rate and number of steps). ``spend(name, steps)`` counts private
    steps *before* their output is used; a step beyond the plan raises
    ``PrivacyViolation``. DPSGD parts need no call: the optimizer that
    ``dpgen_bench.privacy.dpsgd.make_private`` returns counts each of its steps.

    Randomness: ``generator(name)`` is a ``torch.Generator`` on the run's device seeded from
    the run's seed, its training settings and ``name`` (no two runs, and no two names, share
    a stream; ``offset`` is accepted and ignored). The context saves these and torch's
    global generator in every checkpoint and restores them on resume (``restore``); a
    method's own checkpoint state is its weights, optimisers and counters only.

    Resumable training: at the point where a fresh run would start its loop, a method calls
    ``restore()``: None on a fresh run, else the state it last passed to ``checkpoint``
    (and the generators are back where they were then); ``resuming`` says which, before. Whenever ``checkpoint_due()`` is
    true it calls ``checkpoint(state)``; the runner adds the privacy counts and the
    generators and writes it atomically; after SIGINT/SIGTERM ``checkpoint`` then stops
    the run cleanly.
    """

    device: torch.device
    seed: int
    resuming: bool = False

    @abc.abstractmethod
    def part(self, name: str) -> "PrivacyPart": ...

    @abc.abstractmethod
    def spend(self, name: str, steps: int = 1) -> None: ...

    @abc.abstractmethod
    def generator(self, name: str, offset: int = 0) -> torch.Generator: ...

    @abc.abstractmethod
    def progress(self, total: int, desc: str): ...  # returns a tqdm-like object on stderr

    @abc.abstractmethod
    def record(self, **values: Any) -> None: ...  # one line of train.jsonl

    @abc.abstractmethod
    def accumulate(self, **values: float) -> None:
        """Add one value each to running means that the next ``record`` line writes beside its
        own values (and then empties). Checkpoints carry them: a resumed run's ``train.jsonl``
        is the uninterrupted run's, line for line."""

    def watch(self, part: str, mechanism: Any) -> None:
        """Announce the object that releases part ``part``'s noisy sums (a DP optimizer,
        which ``make_private`` announces itself, or a ``GradientSanitizer``), so a white-box
        audit (``bench audit --white-box``) can place its canaries inside it. Call it once
        per part, before the first release; outside an audit it does nothing."""
        return None

    def observe(self, part: str, *, norms: Any, clip: float, clipped_sum_norm: float, noise_norm: float) -> None:
        """Measured gradient telemetry of one private step of ``part``, taken before the noise
        (``privacy.telemetry``; the mechanisms call it themselves): a diagnostic outside the
        guarantee, written to ``train.jsonl`` and the run record, never into the release."""
        return None

    def log(self, message: str) -> None:  # to stderr through logging
        import logging

        logging.getLogger("dpgen_bench").info(message)

    def restore(self) -> dict | None:
        return None

    def checkpoint_due(self) -> bool:
        return False

    def checkpoint(self, state: dict) -> None:
        return None


class Method(abc.ABC):
    """A (private) image generator. One file plus one registry line adds a new one.

    ``Hparams`` is a dataclass; ``presets`` maps a preset name to per-dataset overrides
    of it (key ``"*"``: any dataset).
    """

    name: ClassVar[str]
    private: ClassVar[bool] = True
    conditional: ClassVar[bool] = True
    Hparams: ClassVar[type]
    presets: ClassVar[dict[str, dict[str, dict[str, Any]]]] = {}
    # Hparams that change how a run is computed but not what it trains (logging, threads,
    # memory chunking): they change neither its random streams, its sweep cell nor its `bench
    # report` row (``dpgen_bench.identity``); every other hparam that differs makes two runs differ.
    bookkeeping_hparams: ClassVar[frozenset[str]] = BOOKKEEPING_HPARAMS  # log_every, torch_threads
    # Hparams added after runs of the method were recorded, each with the value that means
    # "as before" (e.g. dpdm's warmup="none"): at that value a sweep cell's key and `bench
    # report`'s configuration identity leave them out, so the runs recorded without them
    # stay the same configuration (``identity.stable_hparams``).
    late_hparams: ClassVar[dict[str, Any]] = {}
    # Hparams renamed after runs were recorded, old name -> current name: records, --set and
    # config files with the old name still load, and a sweep cell's key and the random
    # streams' key hash the old name, so renaming changes no run (``identity.hashed_hparams``).
    renamed_hparams: ClassVar[dict[str, str]] = {}
    # Measured wall seconds of one run with a preset, ``{preset: {dataset: seconds}}`` (fit,
    # sampling and gen2real CNN, one CPU thread, two runs sharing two cores): a parallel `bench
    # sweep` starts its longest cells first so that no long cell starts last. Only the order of
    # cells depends on it; tests/test_readme.py holds `make demo`'s schedule to its budget with them.
    preset_seconds: ClassVar[dict[str, dict[str, float]]] = {}
    # A floor (e.g. dpmean's DP class means): the utility–privacy figures draw it as a band
    # across the ε axis, never as a line.
    is_floor: ClassVar[bool] = False

    def __init__(self, hparams: Any, info: DataInfo):
        self.hparams = hparams
        self.info = info

    @property
    def sample_rate(self) -> float:
        """The expected fraction of the training split in one step's Poisson batch,
        ``batch_size / N`` (at most 1); a method that samples otherwise overrides it."""
        return min(1.0, self.hparams.batch_size / self.info.n_train)

    def accounting_caveat(self) -> str | None:
        """None when the ε the ledger composes is a DP guarantee of what ``fit`` does.
        Otherwise one line saying whose accounting it is: a mode that follows a paper's
        own (unsound) privacy argument to reproduce its numbers. The line is written to
        privacy.json and `bench report` marks that run's ε."""
        return None

    def noise_to_signal(self, part: PrivacyPart) -> float | None:
        """The norm of the noise on one step of ``part``'s released average, in units of the
        largest signal one record can give it (the clip bound): σ·√d / B for DP-SGD on d
        parameters at expected batch B (``dpgen_bench.privacy.dpsgd_noise_to_signal``).
        Known before training, it predicts a noise-bound plan: `bench privacy` and
        `--dry-run` print it and privacy.json records it. None: not stated."""
        return None

    @abc.abstractmethod
    def plan(self, budget: Budget) -> list[PrivacyPart]:
        """Calibrate every private part for ``budget`` without touching data (noise from
        the target, or steps from a fixed noise). Non-private methods return []."""

    @abc.abstractmethod
    def fit(self, train: Split, budget: Budget, ctx: RunContext) -> None:
        """Train on ``train``. Every private step goes through ``ctx.spend`` (or a DPSGD
        optimizer from ``make_private``); the runner composes ε from that count."""

    @abc.abstractmethod
    def sample(self, n: int, labels: Tensor | None, rng: torch.Generator) -> tuple[Tensor, Tensor]: ...

    @abc.abstractmethod
    def state_dict(self) -> dict: ...

    @abc.abstractmethod
    def load_state_dict(self, state: dict) -> None: ...

    # Optional: latent access for white-box / partial black-box membership attacks.
    latent_dim: int | None = None

    def generate(self, z: Tensor, labels: Tensor | None) -> Tensor:
        """The generator as a differentiable function of its latent input (CPU)."""
        raise NotImplementedError(f"method '{self.name}' does not expose its generator's input")

    # Optional: the privacy audit (bench audit) may score records only with what the DP
    # guarantee covers. G (its samples and weights) always is; a method whose other trained
    # part is also an output of its DP mechanism (a discriminator trained by DPSGD) names it
    # here and scores with it. GS-WGAN's discriminators, never released, are not named.
    released_parts: tuple[str, ...] = ()
    # Optional: None when every private part releases through a mechanism that announces itself
    # (``RunContext.watch``: the DP optimizers, sanitisers and one-shot releases do), else one
    # line of why not; ``bench audit --white-box`` then refuses before training.
    white_box_unsupported: str | None = None

    def released_scores(self, images: Tensor, labels: Tensor) -> dict[str, Tensor]:
        """Per-record scores (CPU, higher: more like a training record) from each part in
        ``released_parts``, e.g. ``{"D": logits}``."""
        return {}


# --------------------------------------------------------------------- evaluators


@dataclass
class EvalInput:
    """Everything an evaluator may read. It never selects anything on ``data.test``."""

    data: ImageData
    images: Tensor  # generated, float32 NCHW [-1, 1] (CPU)
    labels: Tensor | None  # None for unconditional generators
    method: Method | None
    device: torch.device
    seed: int
    options: dict[str, Any] = field(default_factory=dict)


class Evaluator(abc.ABC):
    name: ClassVar[str]
    higher_is_better: ClassVar[bool]

    @abc.abstractmethod
    def evaluate(self, run: EvalInput) -> dict[str, Any]:
        """Return ``{"metrics": {key: value}, "protocol": {...}}``; keys name the protocol."""

    # Optional: work that depends only on the real data, the seed and the device, never on a
    # run's samples (the real2gen CNN, trained once and cached). ``bench sweep`` calls it
    # once per (dataset, split, seed, device) in a worker of its own before the cells, so
    # that parallel cells do not wait on each other for it; ``evaluate`` must still work
    # (and give the same result) when it was never called.
    has_prepare: ClassVar[bool] = False

    def prepare(self, data: ImageData, *, seed: int, device: torch.device) -> dict[str, Any]:
        """Build what ``evaluate`` would build for ``data`` and cache it; returns a short
        protocol (e.g. ``{"classifier_cache": "built"}``)."""
        return {}
