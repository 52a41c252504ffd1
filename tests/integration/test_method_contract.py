"""The Method contract from a plugin author's side: counting attached to the DPSGD
optimizer, a method without presets, generators saved and restored by the context, the
notebook entry points, and refusal of checkpoints of another format."""

from dataclasses import dataclass

import pytest
import torch
from click.testing import CliRunner

import dpgen_bench
from dpgen_bench import registry, store
from dpgen_bench.api import Budget, Method, PrivacyPart
from dpgen_bench.cli import cli
from dpgen_bench.config import DEFAULTS_PRESET, build_config
from dpgen_bench.context import RESUME_FILE, TrainingContext
from dpgen_bench.errors import PrivacyViolation
from dpgen_bench.privacy import PrivacyLedger, calibrate_noise
from dpgen_bench.privacy.dpsgd import make_private


def _ctx(steps=3, sigma=1.0):
    budget = Budget(1e6)
    return TrainingContext(torch.device("cpu"), 0, PrivacyLedger(budget, [PrivacyPart("d", sigma, 0.5, steps)]))


def test_every_dpsgd_step_is_counted_and_a_step_beyond_the_plan_changes_nothing():
    ctx = _ctx(steps=3)
    lin = torch.nn.Linear(4, 1)
    gsm, opt = make_private(lin, torch.optim.SGD(lin.parameters(), lr=0.1), ctx=ctx, part="d", max_grad_norm=1.0,
                            expected_batch_size=8)
    x = torch.randn(8, 4)
    for _ in range(3):
        opt.zero_grad()
        gsm(x).pow(2).mean().backward()
        opt.step()
    assert ctx.ledger.taken == {"d": 3}
    before = [p.detach().clone() for p in lin.parameters()]
    opt.zero_grad()
    gsm(x).pow(2).mean().backward()
    with pytest.raises(PrivacyViolation):
        opt.step()
    assert all(torch.equal(a, b) for a, b in zip(before, lin.parameters()))  # no update was applied
    assert ctx.ledger.taken == {"d": 3}


def test_make_private_takes_the_noise_of_the_planned_part():
    ctx = _ctx(sigma=2.5)
    lin = torch.nn.Linear(2, 1)
    _, opt = make_private(lin, torch.optim.SGD(lin.parameters(), lr=0.1), ctx=ctx, part="d", max_grad_norm=1.0,
                          expected_batch_size=4)
    assert opt.noise_multiplier == 2.5
    with pytest.raises(PrivacyViolation, match="not declared"):
        make_private(lin, torch.optim.SGD(lin.parameters(), lr=0.1), ctx=ctx, part="other", max_grad_norm=1.0,
                     expected_batch_size=4)


def test_generators_are_seeded_by_seed_settings_and_name_and_restored_on_resume(tmp_path):
    from dpgen_bench.context import stream_seed

    ctx = TrainingContext(torch.device("cpu"), 7, PrivacyLedger(Budget(1e6), [PrivacyPart("d", 1.0, 0.5, 5)]),
                          tmp_path, stream_key="k")
    g = ctx.generator("data", offset=1)
    want = torch.Generator().manual_seed(stream_seed(7, "data", "k"))
    assert torch.equal(torch.rand(3, generator=g), torch.rand(3, generator=want))
    with pytest.raises(ValueError):
        ctx.generator("data")
    ctx.spend("d", 2)
    ctx.checkpoint({"t": 2})
    expected = torch.rand(4, generator=g), torch.rand(2)
    ctx.close()

    state = torch.load(tmp_path / RESUME_FILE, weights_only=True)
    again = TrainingContext(torch.device("cpu"), 7, PrivacyLedger(Budget(1e6), [PrivacyPart("d", 1.0, 0.5, 5)]),
                            tmp_path, resume=state, stream_key="k")
    assert again.resuming and again.ledger.taken == {"d": 2}  # spent steps stay spent
    g2 = again.generator("data", offset=1)
    torch.rand(10)  # whatever happens before restore() is undone by it
    assert again.restore() == {"t": 2}
    assert torch.equal(torch.rand(4, generator=g2), expected[0]) and torch.equal(torch.rand(2), expected[1])
    again.close()


def test_no_two_runs_share_a_random_stream():
    """A run's streams are keyed by (seed, training settings, name): no stream of one run is
    a stream of another (dpmerf's released frequencies at seed s were, with seed + offset
    seeding, the noise of the run at seed s + 2), and runs of one seed at different ε, δ or
    settings draw independent noise (the same draw scaled by two σ gives the sum back). A
    resume (same config) and --noise-off (the noisy run's pipeline, σ = 0) keep the key."""
    from dpgen_bench.config import stream_key
    from dpgen_bench.context import stream_seed

    names = ["data", "noise", "features", "latent", "choice", "diffusion", "central-noise", "gc", "warmup"]
    configs = [build_config(m, "digits", epsilon=e, preset="tiny", seed=s)
               for m in ("dpmerf", "dpmean", "dpgan") for e in (1.0, 10.0) for s in range(4)]
    configs.append(build_config("dpgan", "digits", epsilon=1.0, preset="tiny", seed=0, sets=["steps=7"]))
    configs.append(build_config("dpgan", "digits", epsilon=1.0, preset="tiny", seed=0, delta=1e-6))
    draws = set()
    for c in configs:
        ctx = TrainingContext(torch.device("cpu"), c.seed, PrivacyLedger(Budget(1e6), []), stream_key=stream_key(c))
        draws |= {tuple(torch.rand(4, generator=ctx.generator(n)).tolist()) for n in names}
    assert len(draws) == len(configs) * len(names)
    assert stream_seed(0, "noise", "") != stream_seed(0, "noise", stream_key(configs[0]))
    noisy = build_config("dpgan", "digits", epsilon=1.0, preset="tiny", seed=0)
    off = build_config("dpgan", "digits", epsilon=1.0, preset="tiny", seed=0, noise_off=True)
    elsewhere = build_config("dpgan", "digits", epsilon=1.0, preset="tiny", seed=0, device="cuda",
                             evaluators="gen2real_mlp")
    assert stream_key(noisy) == stream_key(off) == stream_key(elsewhere)


def test_dpmerf_releases_no_other_runs_noise(tmp_path, monkeypatch):
    """End to end: the noise dpmerf's seed-2 run adds to its embedding sum is not the
    frequencies its seed-0 run releases in checkpoint.pt (with seed + offset seeding the
    two were one stream: correlation 1 over their common length)."""
    from dpgen_bench.privacy.release import GaussianRelease
    from dpgen_bench.runner import run

    noise = []
    real_call = GaussianRelease.__call__

    def spy(self, value):
        out = real_call(self, value)
        if value.numel() > 1:  # the embedding sum (the count is one number)
            noise.append((out - value).flatten())
        return out

    monkeypatch.setattr(GaussianRelease, "__call__", spy)
    freqs = {}
    for seed in (0, 2):
        cfg = build_config("dpmerf", "digits", epsilon=10, preset="tiny", seed=seed, evaluators="gen2real_mlp")
        run(cfg, out=str(tmp_path / f"s{seed}"))
        freqs[seed] = torch.load(tmp_path / f"s{seed}" / "checkpoint.pt", weights_only=True)["freqs"].flatten()
    n = min(len(noise[1]), len(freqs[0]))
    corr = torch.corrcoef(torch.stack([noise[1][:n], freqs[0][:n].to(noise[1].dtype)]))[0, 1].abs().item()
    assert corr < 0.1, corr


@dataclass(frozen=True)
class _PlainHparams:
    steps: int = 2


class _NoPresets(Method):
    """Test-only: a private method without presets."""

    name = "test-no-presets"
    Hparams = _PlainHparams

    def plan(self, budget):
        sigma = calibrate_noise(epsilon=budget.epsilon, delta=budget.delta, sample_rate=1.0, steps=self.hparams.steps)
        return [PrivacyPart("p", sigma, 1.0, self.hparams.steps)]

    def fit(self, train, budget, ctx):
        for _ in range(self.hparams.steps):
            ctx.spend("p")

    def sample(self, n, labels, rng):
        labels = torch.zeros(n, dtype=torch.long) if labels is None else labels
        return torch.rand(n, *self.info.image_shape, generator=rng) * 2 - 1, labels

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass


@pytest.fixture
def no_presets_method():
    registry.methods.register(_NoPresets.name, _NoPresets)
    try:
        yield _NoPresets.name
    finally:
        registry.methods._items.pop(_NoPresets.name, None)
        registry.methods._meta.pop(_NoPresets.name, None)


def test_a_method_without_presets_runs_on_its_defaults(no_presets_method, tmp_path):
    cfg = build_config(no_presets_method, "digits", epsilon=1.0)
    assert cfg.preset == DEFAULTS_PRESET and cfg.hparams == {"steps": 2}
    res = CliRunner().invoke(cli, ["run", "-m", no_presets_method, "--eps", "1", "--eval", "gen2real_mlp",
                                   "--results", str(tmp_path), "--device", "cpu"])
    assert res.exit_code == 0, res.output
    (run,) = [d for d in tmp_path.iterdir() if d.is_dir()]
    priv = store.read_json(run / "privacy.json")
    assert priv["parts"][0]["steps"] == 2 and priv["epsilon"]["rdp"] <= 1.0


def test_notebook_entry_points(tmp_path):
    record = dpgen_bench.run("dummy", "digits", epsilon=2.0, preset="tiny", evaluators=["gen2real_mlp"],
                             results=str(tmp_path), device="cpu")
    assert record["privacy"]["epsilon"]["rdp"] <= 2.0 and "gen2real_mlp" in record["metrics"]
    merged = dpgen_bench.evaluate(record["run_dir"], ["real2gen_mlp"])
    assert {"gen2real_mlp", "real2gen_mlp"} <= set(merged["metrics"])


def test_a_checkpoint_of_another_format_is_refused_in_one_line(tmp_path):
    runs = tmp_path / "runs"
    res = CliRunner().invoke(cli, ["run", "-m", "dummy", "--eps", "1", "--preset", "tiny", "--eval", "gen2real_mlp",
                                   "--out", str(runs / "r"), "--device", "cpu"])
    assert res.exit_code == 0, res.output
    run = runs / "r"
    (run / "eval.json").unlink()  # make it look interrupted
    torch.save({"method": {}, "ledger": {}, "time": 0, "device": "cpu"}, run / RESUME_FILE)  # format 1
    res = CliRunner().invoke(cli, ["run", "--resume", str(run)])
    assert res.exit_code == 2 and "checkpoint format 1" in res.output and "Traceback" not in res.output


def test_every_paper_preset_draws_60000_samples():
    """A table compares FIDs and accuracies across methods, and FID depends on the sample
    count: every ``paper`` preset draws the 60,000 samples the papers' protocol uses
    (GS-WGAN, DataLens, Private GANs; DPAF follows their classifier protocol), whatever its
    number of classes. (DPAF's and GS-WGAN's CelebA presets drew 200 until 2026-11-28.)"""
    from dpgen_bench.config import preset_names
    from dpgen_bench.data.standard import STANDARD_SPLITS

    classes = {name: s.num_classes for name, s in STANDARD_SPLITS.items()} | {"celeba-hair": 3}
    seen = 0
    for method in registry.methods.names():
        cls = registry.methods.get(method)
        if "paper" not in preset_names(cls):
            continue
        for dataset in cls.presets["paper"]:
            cfg = build_config(method, dataset, epsilon=10, preset="paper")
            assert cfg.samples_per_class * classes[dataset] == 60_000, (method, dataset, cfg.samples_per_class)
            seen += 1
    assert seen >= 20
