"""Per-example clipping without per-example gradients: book-keeping with mixed ghost norms.

DPSGD needs ``Σᵢ clip(gᵢ, C)`` where ``gᵢ`` is example i's gradient. Opacus' ``hooks``
mode materialises every ``gᵢ`` (a B × |θ| tensor) and then clips; its ``ghost`` mode
(fast gradient clipping, Li et al. 2022) computes only the norms ``‖gᵢ‖`` in a first
backward pass and gets ``Σᵢ cᵢ gᵢ`` from a second backward pass of ``Σᵢ cᵢ Lᵢ`` — but
Opacus 1.6 has ghost norms only for ``nn.Linear`` and ``nn.Embedding``, so on a
convolutional discriminator it still materialises every conv layer's per-example
gradient, and pays a second backward pass on top.

``BookKeepingModule`` (mode ``"bk"``) does the whole clipped step with ONE backward pass
of the activations only (Bu, Wang, Zha, Karypis, "Automatic clipping ..."/"Differentially
private optimization on large model at small cost" — book-keeping, ICML 2023), and per
layer the cheaper of two exact norm computations (Bu, Mao, Xu, "Scalable and efficient
training of large convolutional neural networks with differential privacy", NeurIPS 2022
— mixed ghost clipping):

1. forward hooks keep each trainable layer's input ``a`` and output ``s``;
2. ``torch.autograd.grad(L, [s for every layer])`` gives the output gradients ``∂L/∂s``
   without computing any weight gradient (autograd computes only what is asked for);
3. per layer and example, ‖gᵢ‖² from ``a`` and ``∂L/∂s``:
   - conv / linear with T output positions, unfolded input dimension d and p outputs:
     *ghost* ``Σ_{t,t'} (AᵢᵀAᵢ)_{tt'} (GᵢᵀGᵢ)_{tt'}`` costs B·T²·(d+p) and never forms a
     p × d matrix; *per-example* ``‖Gᵢ Aᵢᵀ‖²`` costs B·T·d·p and memory B·p·d. ``norms=
     "mixed"`` takes ghost where ``T·(d + p) < d·p`` (the arithmetic of the two; Bu et
     al.'s rule ``2T² < p·d`` is the memory version of the same trade-off);
   - any other layer Opacus has a per-example rule for (``GRAD_SAMPLERS``: embedding,
     layer/group norm, ...): Opacus' per-example gradient, then its norm;
4. ``cᵢ = min(1, C / (‖gᵢ‖ + 1e-6))`` (Opacus' own formula), then per layer the
   clipped sum ``Σᵢ cᵢ gᵢ`` in one weight-gradient computation with the output gradients
   scaled by ``cᵢ`` (the same native kernel autograd uses), or ``Σᵢ cᵢ gᵢ`` from the
   per-example matrices where step 3 built them anyway.

``p.grad`` then holds ``Σᵢ clip(gᵢ, C)``; Opacus' ``DPOptimizerFastGradientClipping``
adds ``N(0, σ²C²)`` and divides by the expected batch size, as ``DPOptimizer`` does.

The per-example gradients are exactly Opacus' hooks' (output gradient × input of each
layer, scaled by the batch length under ``loss_reduction="mean"``), so the update is the
same as ``hooks`` for ANY loss, including losses that couple examples (DPAF's aggregate
losses), and not only for a mean of per-example losses as the two-pass ghost mode
requires. ``tests/unit/test_fastclip.py`` compares both against per-example autograd.

Rows grouped into examples (``backward(..., group=K)``, DPDM's noise multiplicity: K noised
copies of one image, one clipped gradient): an example's K rows enter every rule as K·T
positions of one example (``_merge_rows``), so the norms and sums above are of the example's
gradient, not of its rows'; Opacus' per-row rules are summed over the K rows.

A per-example transform (``transform=``, DPAF's gradient compression: each example's whole
gradient edited before it is clipped, ``dpsgd.PerExampleTransform``) needs every entry of
every example's gradient, so no norm trick applies: ``backward`` then builds the per-example
gradients of all layers for a few examples at a time (the same per-layer products as the
per-example rule above; ``_materialised``), transforms, clips and adds them to the sum, so
memory stays O(chunk · |θ|) where Opacus' hooks hold all B × |θ| values. The chunk is
handed to the transform as column blocks, one per parameter (never concatenated), and the
products are written into buffers reused chunk after chunk (measured: 1.1× the
non-private step's memory and 2× its time at DPAF's paper width, benchmarks/README.md;
chunks of 2¹⁸ values were ~10 % slower than 2²⁰, 2²² ~35 %, on the CPU). On a GPU the chunks
hold up to 2²⁴ values: with 2²⁰ (and ``F.unfold``) DPAF's CelebA preset ran at 10.4 private
steps/s on an H200 in float32, against 51.7 with Opacus' hooks (and 25 GiB) on an H100 with
TF32 convolutions; the larger chunk is not yet timed there.

Conv inputs are unfolded (im2col) as a strided view and one copy (``_unfold_examples``), a
few examples at a time: 32 rows on the CPU (cache), up to 2²⁶ values on a GPU.
``F.unfold`` launches one kernel per row on CUDA: 60 % of DPDM's private step on an H200
(K = 32), which the one copy took from 7.2× to 2.5× the non-private step
(benchmarks/README.md, GPU).

Not supported (a clear error at wrap time or at backward): a layer called twice before one
backward (tied weights), a layer output changed in place after its forward, layers with
parameters and no per-example rule.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from opacus.grad_sample import GradSampleModule
from torch import nn

Norms = Literal["mixed", "ghost", "per_example"]
_CHUNK = 32  # rows unfolded at a time on the CPU (the unfolded chunk stays in cache)
_CUDA_UNFOLD_VALUES = 1 << 26  # unfolded values per chunk on a GPU (256 MiB of float32; ≥ 1 example)
_TRANSFORM_CHUNK_VALUES = 1 << 20  # per-example values per chunk under a transform (4 MiB of float32; ≥ 1 example)
_CUDA_TRANSFORM_CHUNK_VALUES = 1 << 24  # the same on a GPU (64 MiB: fewer, larger launches; not yet timed there)


def _merge_rows(x: torch.Tensor, k: int) -> torch.Tensor:
    """(n·K, c, T) → (n, c, K·T): each example's K rows side by side as K·T positions."""
    if k == 1:
        return x
    nk, c, t = x.shape
    return x.reshape(nk // k, k, c, t).permute(0, 2, 1, 3).reshape(nk // k, c, k * t)


def _conv_ok(m: nn.Module) -> bool:
    return (type(m) is nn.Conv2d and m.groups == 1 and m.padding_mode == "zeros"
            and not isinstance(m.padding, str))


def _rule(m: nn.Module) -> str | None:
    if _conv_ok(m):
        return "conv2d"
    if type(m) is nn.Linear:
        return "linear"
    if type(m) in GradSampleModule.GRAD_SAMPLERS:
        return "opacus"
    return None


class BookKeepingModule(nn.Module):
    """Wraps ``module`` for clipped per-example gradient sums (see the module docstring).

    Use: ``out = bk(x)``; ``bk.backward(loss)`` (a scalar: the mean of per-example
    losses, or any loss with ``loss_reduction="mean"`` semantics as Opacus' hooks; a
    vector is taken as per-example losses and averaged); then the DP optimizer's step.
    ``per_sample_norms`` holds the last batch's norms (diagnostics only: not private)."""

    def __init__(self, module: nn.Module, *, max_grad_norm: float, loss_reduction: str = "mean",
                 norms: Norms = "mixed", transform=None):
        super().__init__()
        if loss_reduction not in ("mean", "sum"):
            raise ValueError("loss_reduction must be 'mean' or 'sum'")
        if norms not in ("mixed", "ghost", "per_example"):
            raise ValueError("norms must be 'mixed', 'ghost' or 'per_example'")
        self._module = module
        self.max_grad_norm = float(max_grad_norm)
        self.loss_reduction = loss_reduction
        self.norms = norms
        self.transform = transform  # dpsgd.PerExampleTransform or None
        self.hooks_enabled = True
        self.per_sample_norms: torch.Tensor | None = None
        self.layer_rules: dict[str, str] = {}  # layer name -> rule used at the last backward
        self._records: list[tuple[str, nn.Module, torch.Tensor, torch.Tensor, int]] = []
        self._handles = []
        for name, m in module.named_modules():
            if not any(True for _ in m.parameters(recurse=False)):
                continue
            if _rule(m) is None:
                raise ValueError(f"grad_sample_mode 'bk' has no per-example rule for layer '{name}' "
                                 f"({type(m).__name__}); use 'hooks'")
            self._handles.append(m.register_forward_hook(self._capture(name)))

    # ------------------------------------------------------------------ plumbing

    def forward(self, *args, **kwargs):
        return self._module(*args, **kwargs)

    def disable_hooks(self) -> None:
        self.hooks_enabled = False

    def enable_hooks(self) -> None:
        self.hooks_enabled = True

    def _close(self) -> None:  # the name Opacus' grad-sample modules use
        for h in self._handles:
            h.remove()
        self._handles, self._records = [], []

    def _capture(self, name: str):
        def hook(m, inputs, output):
            if not (self.hooks_enabled and torch.is_grad_enabled() and m.training):
                return
            if not isinstance(output, torch.Tensor) or not output.requires_grad:
                return
            if not any(p.requires_grad for p in m.parameters(recurse=False)):
                return
            self._records.append((name, m, inputs[0].detach(), output, output._version))
        return hook

    # ------------------------------------------------------------------ the step

    def backward(self, loss: torch.Tensor, also: tuple[torch.Tensor, ...] | list = (), *, group: int = 1) -> None:
        """Set every trainable parameter's ``.grad`` (accumulated if already set) to
        ``Σᵢ clip(gᵢ, C)`` for the examples of the forward passes since the last call.
        ``also``: other leaf tensors that get the ordinary gradient of ``loss`` in the same
        pass (non-private parts trained on the same loss, e.g. DPAF's paper mode).

        ``group`` = K > 1: every K consecutive rows of the batch are one example (DPDM's
        noise multiplicity: K noised copies of one image), and example i's gradient is the
        gradient of the mean of its K rows' losses, Σ_k g_{iK+k} / K under
        ``loss_reduction="mean"`` (the loss a mean over all rows). It is clipped as one: the
        K rows enter every layer rule as K·T positions of one example, so K costs compute
        and no privacy."""
        records, self._records = self._records, []
        if not records:
            raise RuntimeError("bk backward: no forward pass with gradients was recorded")
        names = [r[0] for r in records]
        if len(set(names)) != len(names):
            twice = sorted({n for n in names if names.count(n) > 1})
            raise NotImplementedError(f"bk backward: layer(s) {twice} were called more than once before "
                                      "backward (tied weights or two forwards); use 'hooks'")
        for name, _, _, out, version in records:
            if out._version != version:
                raise RuntimeError(f"bk backward: the output of layer '{name}' was modified in place")
        if loss.dim() > 0:
            loss = loss.mean() if self.loss_reduction == "mean" else loss.sum()
        rows = records[0][2].shape[0]
        group = int(group)
        if group < 1 or rows % group:
            raise ValueError(f"bk backward: {rows} rows are not whole groups of {group}")
        n = rows // group  # examples
        # Opacus scales per-example gradients by the batch length under "mean": the backward
        # of n·loss gives every layer's output gradient scaled so, with no second copy of them
        scale = n if self.loss_reduction == "mean" else 1
        also = list(also)
        grads = torch.autograd.grad(loss * scale, [r[3] for r in records] + also, allow_unused=True)
        backprops = grads[:len(records)]
        for t, gt in zip(also, grads[len(records):]):
            if gt is not None:
                _accumulate(t, gt / scale)  # their ordinary gradient of loss (÷ 1 is exact)

        layers = self._layers(records, backprops, rows)
        if self.transform is not None:
            self._materialised(layers, n, group)
            self._zero_missing_grads()
            return
        sq = None
        finishers = []
        for name, m, a, g in layers:
            rule = {"conv2d": self._conv2d, "linear": self._linear, "opacus": self._opacus}[_rule(m)]
            layer_sq, finish, self.layer_rules[name] = rule(m, a, g, group)
            sq = layer_sq if sq is None else sq + layer_sq
            finishers.append(finish)

        norms = sq.clamp(min=0).sqrt()
        self.per_sample_norms = norms
        coef = (self.max_grad_norm / (norms + 1e-6)).clamp(max=1.0)
        for finish in finishers:
            for p, grad in finish(coef):
                _accumulate(p, grad)
        self._zero_missing_grads()  # unused in this forward: a zero per-example gradient

    def _layers(self, records, backprops, rows: int) -> list[tuple[str, nn.Module, torch.Tensor, torch.Tensor]]:
        """(name, layer, input, output gradient) per recorded layer (the output gradients
        already scaled as Opacus scales them: the gradient of example i's own loss, the mean
        of its rows')."""
        layers = []
        for (name, m, a, out, _), g in zip(records, backprops):
            if a.shape[0] != rows:
                raise ValueError(f"bk backward: layer '{name}' saw {a.shape[0]} rows, the first layer {rows}")
            layers.append((name, m, a, torch.zeros_like(out) if g is None else g.detach()))
        return layers

    def _materialised(self, layers, n: int, group: int) -> None:
        """``Σᵢ clip(T(gᵢ), C)`` with the per-example gradients built a chunk of examples at
        a time (``T`` = ``self.transform``): each example's gradient over all layers, in
        ``module.parameters()`` order (the order Opacus' hooks path concatenates them in, so
        a transform with sampled positions sees the same values)."""
        builders = {}  # parameter -> (chunk start, chunk end) -> (c, numel) per-example gradients
        for name, m, a, g in layers:
            builders.update(_per_example_builders(m, a, g, group))
            self.layer_rules[name] = "materialised"
        params = [p for p in self._module.parameters() if p in builders]
        sizes = [p.numel() for p in params]
        d = sum(sizes)
        device = params[0].device
        apply = self.transform.plan(n, d, device)
        budget = _TRANSFORM_CHUNK_VALUES if device.type == "cpu" else _CUDA_TRANSFORM_CHUNK_VALUES
        step = max(1, min(n, budget // max(1, d)))
        totals = [torch.zeros(size, device=device, dtype=params[0].dtype) for size in sizes]
        buffers = {p: torch.empty(step, p.numel(), device=device, dtype=params[0].dtype) for p in params}
        norms = []
        for i in range(0, n, step):
            j = min(n, i + step)
            # the chunk's rows as column blocks, one per parameter (never concatenated: a copy
            # of every value per step); the transform sees them as one row each
            blocks = [builders[p](i, j, buffers[p][:j - i]) for p in params]  # each (c, numel)
            if apply is not None:
                apply(blocks)
            norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(b, dim=1) for b in blocks]), dim=0)
            norms.append(norm)
            coef = (self.max_grad_norm / (norm + 1e-6)).clamp(max=1.0)
            for total, b in zip(totals, blocks):
                total.addmv_(b.t(), coef)
        self.per_sample_norms = torch.cat(norms)
        for p, grad in zip(params, totals):
            _accumulate(p, grad.view_as(p))

    def zero_contribution(self) -> None:
        """An empty (Poisson) batch: every clipped sum is 0; the step then adds pure noise."""
        self._records = []
        self._zero_missing_grads()

    def _zero_missing_grads(self) -> None:
        for p in self._module.parameters():
            if p.requires_grad and p.grad is None:
                p.grad = torch.zeros_like(p)

    # ------------------------------------------------------------------ per layer

    def _ghost(self, T: int, d: int, p: int) -> bool:
        if self.norms == "mixed":
            return T * (d + p) < d * p
        return self.norms == "ghost"

    def _conv2d(self, m: nn.Conv2d, a: torch.Tensor, g: torch.Tensor, group: int = 1):
        k = group
        n = a.shape[0] // k  # examples; rows iK … iK+K−1 are example i
        a = a.to(g.dtype)
        G = _merge_rows(g.flatten(2), k)  # n, p, K·T
        w, b = m.weight, m.bias
        want_w, want_b = w.requires_grad, b is not None and b.requires_grad
        sq = torch.zeros(n, device=g.device, dtype=g.dtype)
        d = w[0].numel()
        ghost = self._ghost(G.shape[2], d, G.shape[1])
        W = None
        if want_w:
            # unfold (im2col) a few examples at a time: memory stays O(chunk) instead of
            # n·d·T, and on the CPU the unfolded chunk stays in cache (measured:
            # benchmarks/README.md); a GPU takes chunks of up to 2²⁶ values
            parts = []
            step = _unfold_step(a, k, d * G.shape[2])
            for i in range(0, n, step):
                A = _unfold_examples(m, a, k, i, i + step)  # c, d, K·T
                Gc = G[i:i + step]
                if ghost:
                    parts.append((torch.bmm(A.transpose(1, 2), A) * torch.bmm(Gc.transpose(1, 2), Gc)).sum((1, 2)))
                else:
                    parts.append(torch.bmm(Gc, A.transpose(1, 2)))  # c, p, d: per-example gradients
            if ghost:
                sq = sq + torch.cat(parts)
            else:
                W = torch.cat(parts)
                sq = sq + W.pow(2).sum((1, 2))
        if want_b:
            gb = G.sum(2)  # n, p
            sq = sq + gb.pow(2).sum(1)

        def finish(coef):
            out = []
            if want_w:
                if W is not None:
                    gw = torch.einsum("n,npd->pd", coef, W).view_as(w)
                else:  # the native weight-gradient kernel on the rescaled output gradients
                    gw = torch.ops.aten.convolution_backward(
                        g * coef.repeat_interleave(k).view(-1, 1, 1, 1), a, w, None, m.stride, m.padding,
                        m.dilation, False, [0, 0], m.groups, [False, True, False])[1]
                out.append((w, gw))
            if want_b:
                out.append((b, coef @ gb))
            return out

        return sq, finish, ("conv2d ghost" if ghost and want_w else "conv2d per-example")

    def _linear(self, m: nn.Linear, a: torch.Tensor, g: torch.Tensor, group: int = 1):
        n = a.shape[0] // group  # examples; an example's K rows are K·T positions
        A = a.to(g.dtype).reshape(n, -1, a.shape[-1])  # n, K·T, d
        G = g.reshape(n, -1, g.shape[-1])  # n, K·T, p
        w, b = m.weight, m.bias
        want_w, want_b = w.requires_grad, b is not None and b.requires_grad
        sq = torch.zeros(n, device=g.device, dtype=g.dtype)
        T = A.shape[1]
        ghost = T == 1 or self._ghost(T, A.shape[2], G.shape[2])
        if want_w:
            if T == 1:  # ‖gᵢ aᵢᵀ‖ = ‖gᵢ‖ ‖aᵢ‖ exactly
                sq = sq + A.pow(2).sum((1, 2)) * G.pow(2).sum((1, 2))
            elif ghost:
                sq = sq + (torch.bmm(A, A.transpose(1, 2)) * torch.bmm(G, G.transpose(1, 2))).sum((1, 2))
            else:
                sq = sq + torch.bmm(G.transpose(1, 2), A).pow(2).sum((1, 2))
        if want_b:
            gb = G.sum(1)
            sq = sq + gb.pow(2).sum(1)

        def finish(coef):
            out = []
            if want_w:
                Gc = G * coef.view(-1, 1, 1)
                out.append((w, Gc.reshape(-1, G.shape[2]).t() @ A.reshape(-1, A.shape[2])))
            if want_b:
                out.append((b, coef @ gb))
            return out

        return sq, finish, ("linear ghost" if ghost else "linear per-example")

    def _opacus(self, m: nn.Module, a: torch.Tensor, g: torch.Tensor, group: int = 1):
        grads = _opacus_per_example(m, a, g, group)
        n = a.shape[0] // group
        sq = torch.zeros(n, device=g.device, dtype=g.dtype)
        for gs in grads.values():
            sq = sq + gs.reshape(n, -1).pow(2).sum(1)

        def finish(coef):
            return [(p, torch.einsum("n,n...->...", coef, gs)) for p, gs in grads.items()]

        return sq, finish, "opacus"


def _per_example_builders(m: nn.Module, a: torch.Tensor, g: torch.Tensor, group: int) -> dict:
    """For each trainable parameter of layer ``m``: a function (i, j, out=None) → the
    per-example gradients of examples i … j−1, flattened (j − i, numel): Opacus' per-example
    gradient (output gradient × input, over the example's K·T positions). ``out``: a
    contiguous (j − i, numel) buffer the weights' products are written into (reused chunk
    after chunk: a fresh 4 MiB tensor per chunk costs its page faults); others ignore it."""
    k, rule, out = group, _rule(m), {}
    w, b = getattr(m, "weight", None), getattr(m, "bias", None)
    if rule in ("conv2d", "linear"):
        a = a.to(g.dtype)
    if rule == "conv2d":
        G = _merge_rows(g.flatten(2), k)  # n, p, K·T
        if w is not None and w.requires_grad:
            out[w] = lambda i, j, out=None: _bmm(G[i:j], _unfold_examples(m, a, k, i, j).transpose(1, 2), out)
        if b is not None and b.requires_grad:
            out[b] = lambda i, j, out=None: G[i:j].sum(2)
    elif rule == "linear":
        n = a.shape[0] // k
        A = a.reshape(n, -1, a.shape[-1])  # n, K·T, d
        G = g.reshape(n, -1, g.shape[-1])  # n, K·T, p
        if w is not None and w.requires_grad:
            out[w] = lambda i, j, out=None: _bmm(G[i:j].transpose(1, 2), A[i:j], out)
        if b is not None and b.requires_grad:
            out[b] = lambda i, j, out=None: G[i:j].sum(1)
    else:  # Opacus' rule for the whole batch (norm and embedding layers: small), sliced
        for p, gs in _opacus_per_example(m, a, g, k).items():
            out[p] = lambda i, j, out=None, gs=gs.flatten(1): gs[i:j]
    return out


def _bmm(x: torch.Tensor, y: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    """``bmm(x, y)`` flattened to (batch, rows·cols), into ``out`` when given."""
    if out is None or out.dtype != x.dtype or out.device != x.device:
        return torch.bmm(x, y).flatten(1)
    torch.bmm(x, y, out=out.view(x.shape[0], x.shape[1], y.shape[2]))
    return out


def _accumulate(p: torch.Tensor, grad: torch.Tensor) -> None:
    p.grad = grad if p.grad is None else p.grad + grad


def _unfold_step(a: torch.Tensor, k: int, values_per_example: int) -> int:
    """Examples unfolded at a time: ``_CHUNK`` rows on the CPU, up to ``_CUDA_UNFOLD_VALUES``
    values on a GPU (one launch per chunk there; the CPU's cache favours small chunks)."""
    if a.device.type == "cpu":
        return max(1, _CHUNK // k)
    return max(1, _CUDA_UNFOLD_VALUES // max(1, values_per_example))


def _unfold_examples(m: nn.Conv2d, a: torch.Tensor, k: int, i: int, j: int) -> torch.Tensor:
    """Examples i … j−1 of the conv's input unfolded (im2col), each example's K rows side by
    side: (j − i, d, K·T), d in (channel, kernel row, kernel column) order and the positions
    in (row, output row, output column) order, as ``F.unfold`` and ``_merge_rows`` give.

    Built as a strided view of the padded input and ONE copy: ``F.unfold`` on CUDA launches
    an im2col kernel per row (measured on an H200: 60 % of DPDM's private step at K = 32,
    benchmarks/README.md), and ``_merge_rows`` would copy it again."""
    (kh, kw), (dh, dw), (sh, sw), (ph, pw) = m.kernel_size, m.dilation, m.stride, m.padding
    x = a[i * k:j * k]
    if ph or pw:
        x = F.pad(x, (pw, pw, ph, ph))
    v = x.unfold(2, dh * (kh - 1) + 1, sh).unfold(3, dw * (kw - 1) + 1, sw)  # r, c, Ho, Wo, eh, ew
    if dh > 1 or dw > 1:
        v = v[..., ::dh, ::dw]
    r, c, ho, wo = v.shape[:4]
    v = v.reshape(r // k, k, c, ho, wo, kh, kw).permute(0, 2, 5, 6, 1, 3, 4)  # n, c, kh, kw, K, Ho, Wo
    return v.reshape(r // k, c * kh * kw, k * ho * wo)


def _opacus_per_example(m: nn.Module, a: torch.Tensor, g: torch.Tensor, group: int) -> dict:
    """Opacus' per-row gradients of layer ``m``'s trainable parameters, summed over each
    example's K rows: {parameter: (n, *shape)}."""
    grads = {p: gs for p, gs in GradSampleModule.GRAD_SAMPLERS[type(m)](m, [a], g).items() if p.requires_grad}
    if group > 1:  # per-row gradients → per example: the sum over its K rows
        n = a.shape[0] // group
        grads = {p: gs.reshape(n, group, *gs.shape[1:]).sum(1) for p, gs in grads.items()}
    return grads
