"""Every grad-sample mode gives the DPSGD update of the math: (Σ clip(g_i, C) + N(0, σ²C²)) / B_e,
with g_i example i's own gradient computed by a per-example autograd loop; book-keeping
(``bk``) also for losses that couple examples, where it must equal Opacus' hooks."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dpgen_bench.nets.dcgan import ConditionalDiscriminator
from dpgen_bench.numerics import exact_float32
from dpgen_bench.privacy.dpsgd import GRAD_SAMPLE_MODES, empty_batch, make_private, private_backward
from dpgen_bench.privacy.fastclip import BookKeepingModule
from fake_context import PartContext

MODES = [m for m in GRAD_SAMPLE_MODES if m != "ew"]  # ew: Opacus' Expanded Weights cannot run these nets


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def device(request):
    """The equivalence cases run on the CPU by default and on CUDA under ``-m gpu``, there in
    exact float32: TF32 convolutions and matmuls (cuDNN's default) move per-example norms by
    ~1e-3 relative, which ``test_tf32_changes_bk_and_hooks_alike`` measures separately."""
    if request.param == "cpu":
        yield torch.device("cpu")
        return
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    with exact_float32("cuda"):
        yield torch.device("cuda")


def _batch(shape, n=10, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, *shape, generator=g) * 2 - 1
    y = torch.randint(0, 10, (n,), generator=g)
    t = (torch.arange(n) % 2).float()
    return x.to(device), y.to(device), t.to(device)


def _expected_update(D, x, y, t, C, ebs):
    """Per-example autograd loop: clip each example's gradient to C, sum, divide by B_e."""
    grads = []
    for i in range(len(x)):
        D.zero_grad()
        F.binary_cross_entropy_with_logits(D(x[i:i + 1], y[i:i + 1]), t[i:i + 1]).backward()
        grads.append([p.grad.detach().clone() for p in D.parameters()])
    norms = torch.stack([torch.sqrt(sum((g ** 2).sum() for g in gs)) for gs in grads])
    coef = (C / (norms + 1e-6)).clamp(max=1.0)
    D.zero_grad()
    return [sum(c * gs[k] for c, gs in zip(coef, grads)) / ebs for k in range(len(grads[0]))], norms


def _dp_update(D, x, y, t, C, ebs, mode, sigma=0.0, gen=None):
    opt = torch.optim.SGD(D.parameters(), lr=0.0)
    gsm, dp_opt = make_private(D, opt, ctx=PartContext(sigma), part="d", max_grad_norm=C, expected_batch_size=ebs,
                               grad_sample_mode=mode, noise_generator=gen)
    dp_opt.zero_grad(set_to_none=True)
    private_backward(gsm, dp_opt, F.binary_cross_entropy_with_logits(gsm(x, y), t, reduction="none"))
    dp_opt.step()
    return [p.grad.detach().clone() for p in D.parameters()], gsm


@pytest.mark.parametrize("shape", [(1, 16, 16), (1, 28, 28), (3, 32, 32)])
@pytest.mark.parametrize("mode", MODES)
def test_every_mode_is_the_per_example_clipped_mean(mode, shape, device):
    torch.manual_seed(0)
    D = ConditionalDiscriminator(shape, 10, width=8).to(device)
    x, y, t = _batch(shape, device=device)
    ref = ConditionalDiscriminator(shape, 10, width=8).to(device)
    ref.load_state_dict(D.state_dict())
    _, norms = _expected_update(ref, x, y, t, 1.0, 1)
    C = norms.median().item()  # half the examples clipped, half not
    expected, _ = _expected_update(ref, x, y, t, C, 16)
    got, _ = _dp_update(D, x, y, t, C, 16, mode)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("norms", ["mixed", "ghost", "per_example"])
def test_bk_norms_are_exact_per_layer_rule(norms, device):
    torch.manual_seed(1)
    D = ConditionalDiscriminator((1, 28, 28), 10, width=16).to(device)
    x, y, t = _batch((1, 28, 28), n=6, seed=2, device=device)
    ref = ConditionalDiscriminator((1, 28, 28), 10, width=16).to(device)
    ref.load_state_dict(D.state_dict())
    _, expected = _expected_update(ref, x, y, t, 1.0, 1)
    bk = BookKeepingModule(D, max_grad_norm=1.0, norms=norms)
    bk.backward(F.binary_cross_entropy_with_logits(bk(x, y), t, reduction="none"))
    torch.testing.assert_close(bk.per_sample_norms, expected, rtol=1e-4, atol=1e-7)
    rules = set(bk.layer_rules.values())
    if norms == "mixed":  # at 28×28, width 16: per-example on the wide first layers, ghost deeper
        assert rules == {"conv2d ghost", "conv2d per-example"}, bk.layer_rules
    else:
        assert rules == {"conv2d ghost" if norms == "ghost" else "conv2d per-example"}


def norms_of(grads) -> torch.Tensor:
    """Per-example gradient norms from lists of per-parameter gradients."""
    return torch.stack([torch.sqrt(sum((g ** 2).sum() for g in gs)) for gs in grads])


class _Mixed(nn.Module):
    """Layers of every rule: conv, linear on vectors and on sequences, embedding, layer norm."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3, 1, 1)
        self.embed = nn.Embedding(10, 6)
        self.seq = nn.Linear(6, 5)
        self.norm = nn.LayerNorm(5)
        self.fc = nn.Linear(4 * 4 * 4 + 5, 1)

    def forward(self, x, y):
        h = F.relu(self.conv(x)).flatten(1)
        s = self.norm(self.seq(self.embed(torch.stack([y, (y + 1) % 10, (y + 3) % 10], 1)))).mean(1)
        return self.fc(torch.cat([h, s], 1)).flatten()


@pytest.mark.parametrize("norms", ["mixed", "ghost", "per_example"])
def test_bk_is_exact_for_linear_sequences_embeddings_and_norms(norms, device):
    """Every branch of the linear rule on sequences is reached: ``mixed`` takes the
    per-example one here (T(d+p) = 33 ≥ dp = 30), ``ghost`` the Gram-product one."""
    torch.manual_seed(0)
    net, ref = _Mixed().to(device), _Mixed().to(device)
    ref.load_state_dict(net.state_dict())
    x, y = torch.randn(7, 2, 4, 4).to(device), torch.randint(0, 10, (7,)).to(device)
    t = (torch.arange(7) % 2).float().to(device)
    grads = []
    for i in range(7):
        ref.zero_grad()
        F.binary_cross_entropy_with_logits(ref(x[i:i + 1], y[i:i + 1]), t[i:i + 1]).backward()
        grads.append([p.grad.clone() for p in ref.parameters()])
    sizes = norms_of(grads)
    C = sizes.median().item()
    coef = (C / (sizes + 1e-6)).clamp(max=1.0)
    bk = BookKeepingModule(net, max_grad_norm=C, norms=norms)
    bk.backward(F.binary_cross_entropy_with_logits(bk(x, y), t, reduction="none"))
    torch.testing.assert_close(bk.per_sample_norms, sizes, rtol=1e-4, atol=1e-7)
    for p, k in zip(net.parameters(), range(len(grads[0]))):
        torch.testing.assert_close(p.grad, sum(c * gs[k] for c, gs in zip(coef, grads)), rtol=1e-4, atol=1e-7)
    assert bk.layer_rules["seq"] == ("linear ghost" if norms == "ghost" else "linear per-example")
    assert bk.layer_rules["fc"] == "linear ghost"  # vectors: ‖g‖‖a‖ exactly, whatever the mode
    assert bk.layer_rules["embed"] == "opacus"


def test_bk_equals_hooks_on_a_loss_that_couples_examples(device):
    """DPAF's aggregate losses are not sums of per-example losses; Opacus defines example i's
    gradient as its output gradient × its input per layer, and bk must give that update."""
    shape = (1, 16, 16)
    x, y, _ = _batch(shape, n=8, device=device)

    def coupled(D):
        logits = D(x, y)
        return F.binary_cross_entropy_with_logits(torch.stack([logits[:4].mean(), logits[4:].mean()]),
                                                  torch.tensor([1.0, 0.0], device=device))

    updates = {}
    for mode in ("hooks", "bk"):
        torch.manual_seed(0)
        D = ConditionalDiscriminator(shape, 10, width=8).to(device)
        opt = torch.optim.SGD(D.parameters(), lr=0.0)
        gsm, dp_opt = make_private(D, opt, ctx=PartContext(0.0), part="d", max_grad_norm=0.01, expected_batch_size=8,
                                   grad_sample_mode=mode)
        private_backward(gsm, dp_opt, coupled(gsm))
        dp_opt.step()
        updates[mode] = [p.grad.clone() for p in D.parameters()]
    for a, b in zip(updates["hooks"], updates["bk"]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-8)


@pytest.mark.parametrize("mode", MODES)
def test_noise_std_is_sigma_C_over_expected_batch_size(mode):
    torch.manual_seed(0)
    D = ConditionalDiscriminator((1, 16, 16), 10, width=48)
    sigma, C, ebs = 1.3, 0.7, 64
    x, y, t = _batch((1, 16, 16))
    opt = torch.optim.SGD(D.parameters(), lr=0.0)
    ctx = PartContext(sigma)
    gsm, dp_opt = make_private(D, opt, ctx=ctx, part="d", max_grad_norm=C, expected_batch_size=ebs,
                               grad_sample_mode=mode, noise_generator=torch.Generator().manual_seed(5))
    private_backward(gsm, dp_opt, 0.0 * F.binary_cross_entropy_with_logits(gsm(x, y), t, reduction="none"))
    dp_opt.step()
    noise = torch.cat([p.grad.flatten() for p in D.parameters()])
    assert noise.std().item() == pytest.approx(sigma * C / ebs, rel=0.01)
    assert ctx.spent == 1


@pytest.mark.parametrize("mode", MODES)
def test_an_empty_batch_takes_a_pure_noise_step(mode):
    torch.manual_seed(0)
    D = ConditionalDiscriminator((1, 16, 16), 10, width=8)
    opt = torch.optim.SGD(D.parameters(), lr=0.0)
    ctx = PartContext(1.0)
    gsm, dp_opt = make_private(D, opt, ctx=ctx, part="d", max_grad_norm=0.7, expected_batch_size=8,
                               grad_sample_mode=mode, noise_generator=torch.Generator().manual_seed(5))
    empty_batch(gsm)
    dp_opt.step()
    noise = torch.cat([p.grad.flatten() for p in D.parameters()])
    assert ctx.spent == 1 and noise.std().item() == pytest.approx(1.0 * 0.7 / 8, rel=0.05)  # σ·C/B, C ≠ 1


def test_bk_refuses_what_it_cannot_do_exactly():
    class Own(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(3))

        def forward(self, x):
            return x * self.w

    with pytest.raises(ValueError, match="no per-example rule"):
        BookKeepingModule(nn.Sequential(nn.Linear(3, 3), Own()), max_grad_norm=1.0)
    lin = nn.Linear(3, 3)
    bk = BookKeepingModule(lin, max_grad_norm=1.0)
    with pytest.raises(NotImplementedError, match="more than once"):
        bk.backward(bk(bk(torch.randn(4, 3))).sum())
    out = bk(torch.randn(4, 3))
    out.mul_(2)
    with pytest.raises(RuntimeError, match="in place"):
        bk.backward(out.sum())
    with pytest.raises(RuntimeError, match="no forward"):
        bk.backward(torch.zeros((), requires_grad=True))


def test_ghost_needs_per_example_losses():
    D = ConditionalDiscriminator((1, 16, 16), 10, width=8)
    gsm, dp_opt = make_private(D, torch.optim.SGD(D.parameters(), lr=0.0), ctx=PartContext(0.0), part="d",
                               max_grad_norm=1.0, expected_batch_size=8, grad_sample_mode="ghost")
    x, y, t = _batch((1, 16, 16))
    with pytest.raises(ValueError, match=r"^grad_sample_mode 'ghost' needs the per-example losses \(a vector\)$"):
        private_backward(gsm, dp_opt, F.binary_cross_entropy_with_logits(gsm(x, y), t))


class _UNetBits(nn.Module):
    """The layer kinds of DPDM's U-Net: conv, GroupNorm (affine), SiLU, a linear on a
    sequence (attention's projections over H·W positions), an embedding for the label and a
    linear on a vector (the noise level's embedding)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3, 1, 1)
        self.norm = nn.GroupNorm(2, 4)
        self.qkv = nn.Linear(4, 6)
        self.embed = nn.Embedding(10, 4)
        self.sigma = nn.Linear(1, 4)
        self.out = nn.Conv2d(6, 2, 3, 1, 1)

    def forward(self, x, y, s):
        h = F.silu(self.norm(self.conv(x))) + (self.embed(y) + self.sigma(s[:, None]))[:, :, None, None]
        seq = self.qkv(h.flatten(2).transpose(1, 2))  # n, H·W, 6
        return self.out(seq.transpose(1, 2).reshape(len(x), 6, *x.shape[2:]))


def _grouped_case(device, n=5, k=3):
    """A U-Net-like net, n examples of K rows each (K noised copies, DPDM's noise
    multiplicity), its per-row losses, and each example's gradient by per-example autograd
    (the gradient of the mean of its K rows' losses)."""
    torch.manual_seed(0)
    net, ref = _UNetBits().to(device), _UNetBits().to(device)
    ref.load_state_dict(net.state_dict())
    x = torch.randn(n * k, 2, 4, 4).to(device)
    y = torch.randint(0, 10, (n,)).repeat_interleave(k).to(device)
    s = torch.rand(n * k).to(device)
    target = torch.randn(n * k, 2, 4, 4).to(device)

    def row_losses(model, rows):
        return ((model(x[rows], y[rows], s[rows]) - target[rows]) ** 2).flatten(1).mean(1)

    grads = []
    for i in range(n):
        ref.zero_grad()
        row_losses(ref, slice(i * k, (i + 1) * k)).mean().backward()
        grads.append([p.grad.clone() for p in ref.parameters()])
    return net, k, row_losses, grads


@pytest.mark.parametrize("norms", ["mixed", "ghost", "per_example"])
def test_bk_groups_of_rows_are_one_example(norms, device):
    """``group=K`` (DPDM's noise multiplicity): rows iK … iK+K−1 are K noised copies of example
    i, whose gradient is that of the mean of their K losses, clipped once. Against a
    per-example autograd loop, every layer kind of the U-Net, every norm rule."""
    net, k, row_losses, grads = _grouped_case(device)
    sizes = norms_of(grads)
    C = sizes.median().item()
    coef = (C / (sizes + 1e-6)).clamp(max=1.0)
    bk = BookKeepingModule(net, max_grad_norm=C, norms=norms)
    bk.backward(row_losses(bk, slice(None)), group=k)  # the mean over all n·K rows
    torch.testing.assert_close(bk.per_sample_norms, sizes, rtol=1e-4, atol=1e-6)
    for p, j in zip(net.parameters(), range(len(grads[0]))):
        torch.testing.assert_close(p.grad, sum(c * gs[j] for c, gs in zip(coef, grads)), rtol=1e-4, atol=1e-6)
    assert bk.layer_rules["norm"] == "opacus" and bk.layer_rules["embed"] == "opacus"
    with pytest.raises(ValueError, match="whole groups"):  # 7 rows are not groups of 3
        bk.backward(row_losses(bk, slice(0, 7)), group=k)


def test_private_backward_passes_groups_to_bk_and_refuses_them_elsewhere():
    torch.manual_seed(1)
    x, y, s = torch.randn(6, 2, 4, 4), torch.randint(0, 10, (6,)), torch.rand(6)
    for mode in ("bk", "hooks"):
        net = _UNetBits()
        opt = torch.optim.SGD(net.parameters(), lr=0.0)
        gsm, dp_opt = make_private(net, opt, ctx=PartContext(0.0), part="d", max_grad_norm=1.0,
                                   expected_batch_size=3, grad_sample_mode=mode)
        loss = gsm(x, y, s).pow(2).flatten(1).mean(1)
        if mode == "bk":
            private_backward(gsm, dp_opt, loss, group=2)
            assert gsm.per_sample_norms.shape == (3,)  # three examples of two rows
        else:
            with pytest.raises(ValueError, match="^rows grouped into examples \\(noise multiplicity\\) need "
                                                 "grad_sample_mode 'bk'$"):
                private_backward(gsm, dp_opt, loss, group=2)


def _paper_d_updates(device, n=32, modes=("hooks", "bk")):
    """dpgan's paper discriminator (MNIST, width 128, 1.72 M parameters) on one batch, one
    clipped step without noise per mode; C = the median per-example norm (half clipped)."""
    shape = (1, 28, 28)
    x, y, t = _batch(shape, n=n, seed=4, device=device)
    updates = {}
    for mode in modes:
        torch.manual_seed(0)
        D = ConditionalDiscriminator(shape, 10, width=128).to(device)
        if mode == modes[0]:
            probe = BookKeepingModule(D, max_grad_norm=1.0, norms="per_example")
            probe.backward(F.binary_cross_entropy_with_logits(probe(x, y), t, reduction="none"))
            C = probe.per_sample_norms.median().item()
            torch.manual_seed(0)
            D = ConditionalDiscriminator(shape, 10, width=128).to(device)
        got, _ = _dp_update(D, x, y, t, C, n, mode)
        updates[mode] = torch.cat([g.flatten() for g in got])
    return updates


def test_bk_equals_hooks_on_dpgans_paper_discriminator(device):
    """``bk`` (dpgan's default) against Opacus' hooks on the network the paper trains, on the
    run's device: the clipped update of a batch of 32 with half the examples clipped."""
    u = _paper_d_updates(device)
    torch.testing.assert_close(u["bk"], u["hooks"], rtol=1e-4, atol=1e-7)


@pytest.mark.gpu
def test_tf32_changes_bk_and_hooks_alike():
    """With TF32 on (cuDNN's default for convolutions) both modes move away from the float32
    update (H100, torch 2.11: by 1.1e-2 relative, both; bk and hooks then differ by 6e-4);
    this measures how far (printed for the README's GPU section) and checks that the two
    modes still agree to within TF32's precision."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    cuda = torch.device("cuda")
    with exact_float32(cuda):
        exact = _paper_d_updates(cuda)
    with exact_float32(cuda, allow_tf32=True):
        tf32 = _paper_d_updates(cuda)
    cpu = _paper_d_updates(torch.device("cpu"))
    rel = lambda a, b: ((a.cpu() - b.cpu()).norm() / b.cpu().norm()).item()  # noqa: E731
    print(f"\nTF32 off vs CPU: bk {rel(exact['bk'], cpu['bk']):.2e}, hooks {rel(exact['hooks'], cpu['hooks']):.2e}; "
          f"TF32 on vs off: bk {rel(tf32['bk'], exact['bk']):.2e}, hooks {rel(tf32['hooks'], exact['hooks']):.2e}; "
          f"TF32 on, bk vs hooks {rel(tf32['bk'], tf32['hooks']):.2e}")  # noqa: T201
    assert rel(exact["bk"], cpu["bk"]) < 1e-3  # H100, torch 2.11: 2.0e-4 (cuDNN's float32 algorithms)
    assert rel(tf32["bk"], tf32["hooks"]) < 2e-2


@pytest.mark.parametrize("mode", MODES)
def test_also_parameters_get_the_plain_gradient_of_the_mean_loss(mode):
    """``private_backward(..., also=...)``: parameters outside the private part trained on the
    same loss (DPAF's non-private conv2 / head of C) get the ordinary gradient of the mean
    loss, in every mode that can; ``ghost`` refuses them in one clear error."""
    torch.manual_seed(0)
    D = ConditionalDiscriminator((1, 16, 16), 10, width=8)
    x, y, t = _batch((1, 16, 16))
    scale = torch.tensor(1.7, requires_grad=True)
    with torch.no_grad():
        logits = D(x, y)
    expected, = torch.autograd.grad(
        F.binary_cross_entropy_with_logits(logits * scale, t, reduction="none").mean(), [scale])
    gsm, dp_opt = make_private(D, torch.optim.SGD(D.parameters(), lr=0.0), ctx=PartContext(0.0), part="d",
                               max_grad_norm=1.0, expected_batch_size=10, grad_sample_mode=mode)
    loss = F.binary_cross_entropy_with_logits(gsm(x, y) * scale, t, reduction="none")
    if mode == "ghost":
        with pytest.raises(ValueError, match="^grad_sample_mode 'ghost' cannot train other parameters on the same loss$"):
            private_backward(gsm, dp_opt, loss, also=[scale])
        return
    private_backward(gsm, dp_opt, loss, also=[scale])
    torch.testing.assert_close(scale.grad, expected, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("mode", MODES)
def test_private_backward_touches_nothing_outside_the_part(mode):
    """A tensor upstream of the private part (a generator's parameter, through the fakes) gets
    no gradient from the part's backward: only the part's parameters and ``also`` do. Opacus'
    ghost clipping cannot restrict its passes, so ``ghost`` refuses such a loss."""
    torch.manual_seed(0)
    D = ConditionalDiscriminator((1, 16, 16), 10, width=8)
    x, y, t = _batch((1, 16, 16))
    upstream = torch.tensor(0.9, requires_grad=True)  # stands for G's parameters
    gsm, dp_opt = make_private(D, torch.optim.SGD(D.parameters(), lr=0.0), ctx=PartContext(0.0), part="d",
                               max_grad_norm=1.0, expected_batch_size=10, grad_sample_mode=mode)
    loss = F.binary_cross_entropy_with_logits(gsm(x * upstream, y), t, reduction="none")
    if mode == "ghost":
        with pytest.raises(ValueError, match=r"^grad_sample_mode 'ghost' needs a loss that reaches no tensor outside"):
            private_backward(gsm, dp_opt, loss)
    else:
        private_backward(gsm, dp_opt, loss)
    assert upstream.grad is None


def test_make_private_refuses_what_dpsgd_cannot_clip_per_example():
    """BatchNorm mixes the examples of a batch (no per-example gradient exists): refused,
    as is an unknown grad-sample mode, each with its exact message."""
    net = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.Flatten(), nn.LazyLinear(1))
    kw = dict(ctx=PartContext(1.0), part="d", max_grad_norm=1.0, expected_batch_size=4)
    with pytest.raises(ValueError, match=r"^module is not DPSGD-compatible: \[.*BatchNorm"):
        make_private(net, torch.optim.SGD(net.parameters(), lr=0.1), **kw)
    D = ConditionalDiscriminator((1, 16, 16), 10, width=8)
    with pytest.raises(ValueError, match=r"^grad_sample_mode must be one of \("):
        make_private(D, torch.optim.SGD(D.parameters(), lr=0.1), grad_sample_mode="per-sample", **kw)


@pytest.mark.parametrize("mode", MODES)
def test_noise_comes_from_the_given_generator_and_the_part_is_watched(mode):
    """The noise is drawn from ``noise_generator`` (the run's seeded stream, so a run is
    reproducible whatever else draws from torch's global RNG), and the DP optimizer is handed
    to ``ctx.watch`` under its part's name (where a white-box audit places its canaries)."""

    def noise(global_seed):
        torch.manual_seed(0)
        D = ConditionalDiscriminator((1, 16, 16), 10, width=8)
        x, y, t = _batch((1, 16, 16))
        ctx = PartContext(1.0)
        gsm, dp_opt = make_private(D, torch.optim.SGD(D.parameters(), lr=0.0), ctx=ctx, part="d", max_grad_norm=0.5,
                                   expected_batch_size=8, grad_sample_mode=mode,
                                   noise_generator=torch.Generator().manual_seed(5))
        assert ctx.watched == [("d", dp_opt)]
        torch.manual_seed(global_seed)
        private_backward(gsm, dp_opt, 0.0 * F.binary_cross_entropy_with_logits(gsm(x, y), t, reduction="none"))
        dp_opt.step()
        return torch.cat([p.grad.flatten() for p in D.parameters()])

    torch.testing.assert_close(noise(1), noise(2), rtol=0, atol=0)


# ------------------------------------------------------------ per-example transforms (DPAF's GC)


def _transform(kind):
    """A per-example transform of each kind the harness uses: DPAF's gradient compression with
    an exact threshold, and with a threshold sampled at positions drawn once per step."""
    from methods.dpaf.compression import GradientCompression

    if kind == "exact":
        return GradientCompression(0.7)
    return GradientCompression(0.7, torch.Generator().manual_seed(5), exact_limit=0, sample_size=16)


def _transformed_reference(grads, transform, C):
    """Σᵢ clip(T(gᵢ), C) from per-example autograd gradients (lists per parameter), each
    example's gradient flattened over all parameters in ``parameters()`` order."""
    rows = torch.stack([torch.cat([g.flatten() for g in gs]) for gs in grads])
    apply = transform.plan(*rows.shape, rows.device)
    rows = rows if apply is None else apply(rows.clone())
    norms = torch.linalg.vector_norm(rows, dim=1)
    total = ((C / (norms + 1e-6)).clamp(max=1.0)[:, None] * rows).sum(0)
    return total.split([g.numel() for g in grads[0]]), norms


@pytest.mark.parametrize("kind", ["exact", "sampled"])
@pytest.mark.parametrize("mode", ["hooks", "functorch", "bk"])
def test_a_per_example_transform_is_applied_before_clipping_in_every_mode(mode, kind, device, monkeypatch):
    """``make_private(per_example_transform=T)`` gives Σᵢ clip(T(gᵢ), C) in every mode that can
    hold per-example gradients: Opacus' modes transform p.grad_sample, bk builds the
    per-example gradients of every layer rule (conv, linear on vectors and sequences, embedding,
    layer norm) three examples at a time (a chunk size that does not divide the batch), against
    a per-example autograd loop; most examples clipped."""
    import dpgen_bench.privacy.fastclip as fastclip

    torch.manual_seed(0)
    net, ref = _Mixed().to(device), _Mixed().to(device)
    ref.load_state_dict(net.state_dict())
    n = 7
    x, y = torch.randn(n, 2, 4, 4).to(device), torch.randint(0, 10, (n,)).to(device)
    t = (torch.arange(n) % 2).float().to(device)
    grads = []
    for i in range(n):
        ref.zero_grad()
        F.binary_cross_entropy_with_logits(ref(x[i:i + 1], y[i:i + 1]), t[i:i + 1]).backward()
        grads.append([p.grad.clone() for p in ref.parameters()])
    d = sum(p.numel() for p in net.parameters())
    monkeypatch.setattr(fastclip, "_TRANSFORM_CHUNK_VALUES", 3 * d)
    C = norms_of(grads).median().item() / 2
    want, want_norms = _transformed_reference(grads, _transform(kind), C)
    opt = torch.optim.SGD(net.parameters(), lr=0.0)
    gsm, dp_opt = make_private(net, opt, ctx=PartContext(0.0), part="d", max_grad_norm=C, expected_batch_size=n,
                               grad_sample_mode=mode, per_example_transform=_transform(kind))
    private_backward(gsm, dp_opt, F.binary_cross_entropy_with_logits(gsm(x, y), t, reduction="none"))
    dp_opt.step()
    for p, w in zip(net.parameters(), want):
        torch.testing.assert_close(p.grad, w.view_as(p) / n, rtol=1e-4, atol=1e-7)
    if mode == "bk":
        torch.testing.assert_close(gsm.per_sample_norms, want_norms, rtol=1e-4, atol=1e-7)
        assert set(gsm.layer_rules.values()) == {"materialised"}
    # the transform did something: without it the update differs
    plain, _ = _transformed_reference(grads, _transform(kind).__class__(1.0), C)
    assert not all(torch.allclose(a, b) for a, b in zip(want, plain))


@pytest.mark.parametrize("chunk_examples", [1, 2, 5])
def test_bk_transform_groups_of_rows_and_any_chunk_size(chunk_examples, device, monkeypatch):
    """Under a transform, bk's ``group=K`` examples (DPDM's K rows per example) are still one
    example each, and the result does not depend on how many examples a chunk holds."""
    import dpgen_bench.privacy.fastclip as fastclip

    net, k, row_losses, grads = _grouped_case(device)
    C = norms_of(grads).median().item()
    want, want_norms = _transformed_reference(grads, _transform("exact"), C)
    monkeypatch.setattr(fastclip, "_TRANSFORM_CHUNK_VALUES", chunk_examples * sum(p.numel() for p in net.parameters()))
    bk = BookKeepingModule(net, max_grad_norm=C, transform=_transform("exact"))
    bk.backward(row_losses(bk, slice(None)), group=k)
    torch.testing.assert_close(bk.per_sample_norms, want_norms, rtol=1e-4, atol=1e-6)
    for p, w in zip(net.parameters(), want):
        torch.testing.assert_close(p.grad, w.view_as(p), rtol=1e-4, atol=1e-6)


def test_ghost_refuses_a_per_example_transform():
    net = _Mixed()
    opt = torch.optim.SGD(net.parameters(), lr=0.0)
    with pytest.raises(ValueError, match="^grad_sample_mode 'ghost' never holds per-example gradients: a "
                                         "per-example transform needs 'bk' or 'hooks'$"):
        make_private(net, opt, ctx=PartContext(0.0), part="d", max_grad_norm=1.0, expected_batch_size=4,
                     grad_sample_mode="ghost", per_example_transform=_transform("exact"))


class _Odd(nn.Module):
    """Corners of the per-example builders: a dilated, strided conv; a frozen bias (no
    gradient, and not part of the clipped vector); a layer whose output never reaches the
    loss (a zero per-example gradient; Opacus' hooks refuse it: ``unused=False`` for them);
    a linear without bias."""

    def __init__(self, unused=True):
        super().__init__()
        self.use_unused = unused
        self.conv = nn.Conv2d(2, 3, 3, stride=2, padding=2, dilation=2)
        self.conv.bias.requires_grad_(False)
        self.unused = nn.Linear(4, 2).requires_grad_(unused)
        self.fc = nn.Linear(3 * 3 * 3, 1, bias=False)

    def forward(self, x, y):
        if self.use_unused:
            self.unused(x.flatten(1)[:, :4])  # computed, never used
        return self.fc(F.relu(self.conv(x)).flatten(1)).flatten()


@pytest.mark.parametrize("mode", ["hooks", "bk"])
@pytest.mark.parametrize("n", [1, 6])
def test_a_transform_on_frozen_unused_and_dilated_layers_and_over_two_backward_passes(mode, n):
    """Against per-example autograd, transformed then clipped: a frozen parameter gets no
    gradient and is not part of an example's vector, a layer outside the loss adds zeros,
    a dilated strided conv is unfolded as it is; a batch of one example is transformed too;
    two backward passes before one step add up (bk accumulates into ``.grad``, as without a
    transform)."""
    from methods.dpaf.compression import GradientCompression

    torch.manual_seed(0)
    net, ref = _Odd(unused=mode == "bk"), _Odd(unused=mode == "bk")
    ref.load_state_dict(net.state_dict())
    x, t = torch.randn(2 * n, 2, 5, 5), (torch.arange(2 * n) % 2).float()
    grads = []
    for i in range(2 * n):
        ref.zero_grad()
        F.binary_cross_entropy_with_logits(ref(x[i:i + 1], None), t[i:i + 1]).backward()
        grads.append([torch.zeros_like(p) if p.grad is None else p.grad.clone()
                      for p in ref.parameters() if p.requires_grad])
    C = norms_of(grads).median().item() / 2
    trainable = [p for p in net.parameters() if p.requires_grad]
    halves = [_transformed_reference(grads[:n], GradientCompression(0.4), C)[0],
              _transformed_reference(grads[n:], GradientCompression(0.4), C)[0]]
    untransformed = _transformed_reference(grads[:n], GradientCompression(1.0), C)[0]
    assert not all(torch.allclose(a, b) for a, b in zip(halves[0], untransformed))  # it bites here
    opt = torch.optim.SGD(trainable, lr=0.0)
    gsm, dp_opt = make_private(net, opt, ctx=PartContext(0.0), part="d", max_grad_norm=C, expected_batch_size=n,
                               grad_sample_mode=mode, per_example_transform=GradientCompression(0.4))
    if mode == "bk":  # two passes, one step
        for half in (slice(0, n), slice(n, 2 * n)):
            private_backward(gsm, dp_opt, F.binary_cross_entropy_with_logits(gsm(x[half], None), t[half],
                                                                            reduction="none"))
        want = [a + b for a, b in zip(*halves)]
    else:
        private_backward(gsm, dp_opt, F.binary_cross_entropy_with_logits(gsm(x[:n], None), t[:n], reduction="none"))
        want = halves[0]
    dp_opt.step()
    assert net.conv.bias.grad is None
    for p, w in zip(trainable, want):
        torch.testing.assert_close(p.grad, w.view_as(p) / n, rtol=1e-4, atol=1e-7)


def test_private_backward_on_a_plain_module_is_a_plain_backward():
    """What benchmarks/scaling.py's non-private rows rely on: a module ``make_private`` never
    wrapped gets the ordinary gradient of the mean loss (no clipping, no transform)."""
    torch.manual_seed(0)
    net, ref = _Mixed(), _Mixed()
    ref.load_state_dict(net.state_dict())
    x, y, t = torch.randn(5, 2, 4, 4), torch.randint(0, 10, (5,)), (torch.arange(5) % 2).float()
    private_backward(net, None, F.binary_cross_entropy_with_logits(net(x, y), t, reduction="none"))
    F.binary_cross_entropy_with_logits(ref(x, y), t).backward()
    for p, q in zip(net.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad)


@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("conv", [dict(kernel_size=3, padding=1), dict(kernel_size=4, stride=2, padding=1),
                                  dict(kernel_size=(3, 2), stride=(1, 2), padding=(2, 0), dilation=(2, 1)),
                                  dict(kernel_size=1)])
def test_unfold_examples_is_unfold_with_each_examples_rows_side_by_side(conv, k, device):
    """bk's im2col (a strided view and one copy) against ``F.unfold`` then ``_merge_rows``:
    the same values in the same order for every stride, dilation, padding and group size."""
    from dpgen_bench.privacy.fastclip import _merge_rows, _unfold_examples

    m = nn.Conv2d(3, 5, **conv).to(device)
    a = torch.randn(4 * k, 3, 9, 8, device=device)
    ref = _merge_rows(F.unfold(a, m.kernel_size, dilation=m.dilation, padding=m.padding, stride=m.stride), k)
    for i, j in ((0, 4), (1, 3), (3, 4)):
        torch.testing.assert_close(_unfold_examples(m, a, k, i, j), ref[i:j], rtol=0, atol=0)


def test_bk_unfolds_in_chunks_of_any_size_on_the_cpu_and_by_values_on_a_gpu(monkeypatch):
    """The conv rule's chunking changes nothing: many examples (and their K rows) at a time,
    as on a GPU, give the same norms and sums as one at a time; a GPU's chunk is sized in
    values (a ``meta`` tensor stands in for CUDA here)."""
    from dpgen_bench.privacy import fastclip

    net, k, row_losses, grads = _grouped_case(torch.device("cpu"))
    sizes = norms_of(grads)
    C = sizes.median().item()
    results = []
    for chunk_rows in (1, 7, 10_000):
        monkeypatch.setattr(fastclip, "_CHUNK", chunk_rows)
        net.zero_grad(set_to_none=True)
        bk = BookKeepingModule(net, max_grad_norm=C, norms="per_example")
        bk.backward(row_losses(bk, slice(None)), group=k)
        torch.testing.assert_close(bk.per_sample_norms, sizes, rtol=1e-4, atol=1e-6)
        results.append([p.grad.clone() for p in net.parameters()])
    for other in results[1:]:
        for x, y in zip(results[0], other):
            torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-7)
    meta = torch.empty(0, device="meta")
    assert fastclip._unfold_step(meta, 32, fastclip._CUDA_UNFOLD_VALUES // 5) == 5
    assert fastclip._unfold_step(meta, 32, 10 * fastclip._CUDA_UNFOLD_VALUES) == 1
    assert fastclip._unfold_step(torch.empty(0), 4, 1) == fastclip._CHUNK // 4
