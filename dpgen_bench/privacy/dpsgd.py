"""DPSGD building blocks on top of Opacus (no hand-written clipping or noise).

``make_private`` wraps a module for per-example gradients and its optimizer in Opacus'
``DPOptimizer`` with the noise of a planned privacy part, and counts each of the
optimizer's steps on that part (before the update is applied): a DPSGD step cannot be
taken without being counted, nor beyond the plan. Data sampling is done by the caller with
``poisson_batch`` on cached tensors (Opacus' ``DPDataLoader`` would iterate Python items).

Grad-sample modes (``GRAD_SAMPLE_MODES``), all giving the same update
``(Σ clip(g_i, C) + N(0, σ²C²)) / expected_batch_size`` (tests/unit/test_fastclip.py):

- ``hooks``, ``functorch``, ``ew``: Opacus materialises every per-example gradient, then
  clips;
- ``ghost``: Opacus' fast gradient clipping (norms in a first backward pass, a second
  backward pass of the clip-weighted per-example losses); needs per-example losses;
- ``bk``: ours, ``fastclip.BookKeepingModule``: one backward pass, mixed ghost /
  per-example norms per layer, the clipped sum by one weight-gradient kernel per layer.
A ``per_example_transform`` (DPAF's gradient compression: a function of each example's
gradient alone, applied before clipping) is applied by ``hooks``/``functorch``/``ew`` to
Opacus' materialised per-example gradients after the backward pass, and by ``bk`` to
per-example gradients it materialises a few examples at a time (never B × |θ| at once);
``ghost`` refuses it. Either way the update is ``(Σ clip(T(g_i), C) + N(0, σ²C²)) / B``.

Every backward of a private part goes through ``private_backward(module, optimizer,
loss)``, which does what the mode needs.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable
from typing import Protocol

import torch
from opacus.grad_sample import GradSampleModuleFastGradientClipping
from opacus.grad_sample.utils import wrap_model
from opacus.optimizers import DPOptimizer, DPOptimizerFastGradientClipping
from opacus.utils.fast_gradient_clipping_utils import DPTensorFastGradientClipping
from opacus.validators import ModuleValidator
from torch import nn

from ..api import RunContext
from .fastclip import BookKeepingModule
from .telemetry import instrument_dpsgd

GRAD_SAMPLE_MODES = ("hooks", "functorch", "ew", "ghost", "bk")
# modes that never hold per-example gradients (p.grad_sample): code that edits them refuses these
NORM_ONLY_MODES = ("ghost", "bk")


class PerExampleTransform(Protocol):
    """A map applied to each example's whole gradient (all of the part's parameters,
    flattened in ``module.parameters()`` order) before it is clipped. It must depend on
    that example's gradient alone (and on data-independent randomness), or clipping would
    no longer bound one example's contribution. ``plan(n, d, device)`` is called once per
    backward pass with its n examples of d values and returns the function that transforms
    any subset of those rows in place (or None: the identity), given either as one (rows, d)
    tensor or as a list of column blocks whose concatenation is the rows (the parameters'
    per-example gradients side by side, not concatenated)."""

    def plan(self, n: int, d: int, device: torch.device) -> Callable[[torch.Tensor | list[torch.Tensor]], object] | None: ...


def _grad_sample(p: nn.Parameter) -> torch.Tensor | None:
    gs = getattr(p, "grad_sample", None)
    if isinstance(gs, list):  # accumulated over several forward passes
        gs = torch.cat(gs, 0)
        p.grad_sample = gs
    return gs


def transform_grad_samples(params: Iterable[nn.Parameter], transform: PerExampleTransform) -> None:
    """Apply ``transform`` to Opacus' per-example gradients (``p.grad_sample``), jointly
    over ``params`` (each example's row is its gradient over all of them)."""
    samples = [(p, gs) for p in params if p.requires_grad and (gs := _grad_sample(p)) is not None]
    if not samples or samples[0][1].shape[0] == 0:
        return
    n = samples[0][1].shape[0]
    blocks = [g.reshape(n, -1) for _, g in samples]  # views where contiguous: edited in place
    apply = transform.plan(n, sum(b.shape[1] for b in blocks), blocks[0].device)
    if apply is None:
        return
    apply(blocks)
    for (p, g), block in zip(samples, blocks):
        p.grad_sample = block.reshape(g.shape)


def make_private(
    module: nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    ctx: RunContext,
    part: str,
    max_grad_norm: float,
    expected_batch_size: int,
    grad_sample_mode: str = "hooks",
    noise_generator: torch.Generator | None = None,
    per_example_transform: PerExampleTransform | None = None,
):
    """Return ``(grad_sample_module, dp_optimizer)`` for the planned part ``part``: noise
    multiplier ``ctx.part(part).noise_multiplier``; every step that adds noise (not one
    skipped by ``signal_skip_step``) calls ``ctx.spend(part)`` before the update.

    The loss must be a mean over the physical batch: Opacus rescales per-example
    gradients by the batch length, and the optimizer divides the noisy sum by
    ``expected_batch_size``: ``(Σ clip(g_i, C) + N(0, σ²C²)) / expected_batch_size``.
    ``per_example_transform``: applied to each example's gradient before it is clipped
    (``PerExampleTransform``; ``private_backward`` applies it in every mode but ``ghost``).
    """
    noise_multiplier = ctx.part(part).noise_multiplier
    if grad_sample_mode not in GRAD_SAMPLE_MODES:
        raise ValueError(f"grad_sample_mode must be one of {GRAD_SAMPLE_MODES}")
    errors = ModuleValidator.validate(module, strict=False)
    if errors:  # e.g. BatchNorm: fail early and clearly
        raise ValueError(f"module is not DPSGD-compatible: {errors}")
    # Opacus' hooks fire with respect to module outputs when the input needs no grad
    # (real images): expected and harmless; the secure-RNG note is about secure_mode.
    warnings.filterwarnings("ignore", message="Full backward hook is firing")
    warnings.filterwarnings("ignore", message=".*Secure RNG turned off.*")
    if per_example_transform is not None and grad_sample_mode == "ghost":
        raise ValueError("grad_sample_mode 'ghost' never holds per-example gradients: a per-example transform "
                         "needs 'bk' or 'hooks'")
    if grad_sample_mode == "bk":
        gsm = BookKeepingModule(module, max_grad_norm=max_grad_norm, loss_reduction="mean",
                                transform=per_example_transform)
    elif grad_sample_mode == "ghost":
        gsm = wrap_model(module, "ghost", batch_first=True, loss_reduction="mean", max_grad_norm=max_grad_norm,
                         use_ghost_clipping=True)
    else:
        gsm = wrap_model(module, grad_sample_mode, batch_first=True, loss_reduction="mean")
        gsm._dpgen_transform = per_example_transform
    opt_cls = DPOptimizerFastGradientClipping if grad_sample_mode in NORM_ONLY_MODES else DPOptimizer
    dp_opt = opt_cls(
        optimizer,
        noise_multiplier=noise_multiplier,
        max_grad_norm=max_grad_norm,
        expected_batch_size=expected_batch_size,
        loss_reduction="mean",
        generator=noise_generator,
    )
    dp_opt.attach_step_hook(lambda _opt: ctx.spend(part))
    ctx.watch(part, dp_opt)  # a white-box audit places its canaries in the optimizer's noise step
    observe = getattr(ctx, "observe", None)
    if observe is not None:  # measured norms before the noise (and before an audit's canaries): a diagnostic
        instrument_dpsgd(dp_opt, gsm, observe, part)
    return gsm, dp_opt


def private_backward(module: nn.Module, optimizer: DPOptimizer, loss: torch.Tensor, *,
                     also: list[torch.Tensor] | tuple = (), group: int = 1) -> None:
    """The backward pass of a private part wrapped by ``make_private``, for every mode:
    the part's parameters get what its DP optimizer expects, the tensors in ``also`` (other,
    non-private parameters trained on the same loss) their ordinary gradient, and nothing
    else is touched.

    ``loss``: a vector of per-example losses (averaged: ``loss_reduction="mean"``), or a
    scalar with the same mean semantics (any loss for ``hooks``/``functorch``/``bk``, which
    clip each example's output-gradient × input contribution, as Opacus defines the
    per-example gradient). ``ghost`` needs the vector: its second pass weights each
    example's loss by its clipping factor.

    ``group`` = K > 1: every K consecutive rows are one example (noise multiplicity), clipped
    as one; only ``bk`` does it (Opacus' modes clip each row)."""
    if isinstance(module, BookKeepingModule):
        module.backward(loss, also=also, group=group)
        return
    if group != 1:
        raise ValueError("rows grouped into examples (noise multiplicity) need grad_sample_mode 'bk'")
    if isinstance(module, GradSampleModuleFastGradientClipping):
        if loss.dim() != 1:
            raise ValueError("grad_sample_mode 'ghost' needs the per-example losses (a vector)")
        if also:
            raise ValueError("grad_sample_mode 'ghost' cannot train other parameters on the same loss")
        params = {id(p) for p in module.parameters() if p.requires_grad}
        if any(id(leaf) not in params for leaf in _graph_leaves(loss)):
            # Opacus' two passes (norms, then the loss reweighted by each example's clipping
            # factor) reach every leaf of the graph, and the second one sums instead of
            # averaging: a tensor outside the part (a generator's parameters behind the fakes)
            # would get a wrong gradient
            raise ValueError("grad_sample_mode 'ghost' needs a loss that reaches no tensor outside the private "
                             "part (detach its inputs, e.g. draw the fakes under torch.no_grad())")
        DPTensorFastGradientClipping(module, optimizer, loss, "mean").backward()
        return
    params = [p for p in module.parameters() if p.requires_grad]
    (loss.mean() if loss.dim() > 0 else loss).backward(inputs=params + list(also))
    transform = getattr(module, "_dpgen_transform", None)
    if transform is not None:
        transform_grad_samples(params, transform)


def _graph_leaves(t: torch.Tensor) -> list[torch.Tensor]:
    """The leaf tensors that ``t.backward()`` would write a gradient to."""
    leaves, seen, stack = [], set(), [t.grad_fn]
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        if hasattr(fn, "variable"):  # AccumulateGrad
            leaves.append(fn.variable)
        stack.extend(nxt for nxt, _ in fn.next_functions)
    return leaves


def private_chunk(module: nn.Module, optimizer: DPOptimizer, loss: torch.Tensor, *, last: bool,
                  group: int = 1) -> None:
    """One physical chunk of a logical DP-SGD step (a batch too large for one pass): its
    per-example gradients are clipped and added to the optimizer's running sum; a chunk
    that is not ``last`` skips the step (``signal_skip_step``: no noise, nothing counted)
    and frees its gradients, the ``last`` adds the noise once, steps and is counted. So
    Σ clip(g_i, C) + N(0, σ²C²) over the whole batch, however it was chunked."""
    private_backward(module, optimizer, loss, group=group)
    optimizer.signal_skip_step(do_skip=not last)
    optimizer.step()  # not last: clip and accumulate only
    if not last:
        optimizer.zero_grad(set_to_none=True)  # frees this chunk's gradients, keeps the clipped sum


def empty_batch(module: nn.Module) -> None:
    """An empty Poisson batch: every example's (clipped) gradient is absent, so the step
    that follows adds pure noise (and is counted like every other)."""
    params = [p for p in module.parameters() if p.requires_grad]
    if isinstance(module, BookKeepingModule):
        module.zero_contribution()
    elif isinstance(module, GradSampleModuleFastGradientClipping):
        for p in params:
            p.grad = torch.zeros_like(p)
    else:
        for p in params:
            p.grad_sample = torch.zeros((0, *p.shape), device=p.device, dtype=p.dtype)


def poisson_batch(n: int, sample_rate: float, generator: torch.Generator, device: torch.device) -> torch.Tensor:
    """Indices of a Poisson-sampled batch: each of the ``n`` examples independently with
    probability ``sample_rate`` (the sampling the RDP/PRV analysis assumes)."""
    mask = torch.rand(n, generator=generator, device=device) < sample_rate
    return mask.nonzero(as_tuple=True)[0]
