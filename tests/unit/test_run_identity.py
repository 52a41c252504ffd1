"""One rule says what makes two runs the same (``dpgen_bench.identity``): the random streams'
key, the sweep cell's key and the report's configuration all follow it. A bookkeeping setting
changes none of them, a post-processing one the cell and the report only, a training setting
all three; and the committed records keep their cells and streams."""

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from dpgen_bench import identity as rule
from dpgen_bench import runner
from dpgen_bench.config import RunConfig, build_config, stream_key
from dpgen_bench.registry import methods
from dpgen_bench.report.table import identity
from dpgen_bench.sweep import Cell

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "benchmarks" / "mnist_runs"
# each method's stream key of its committed long runs on mnist, as the code before this rule hashed it
# (the seed is beside the key, so a method's three seeds share it)
RECORDED_STREAM_KEYS = {"dpac": "fcc656ac82a1d052", "dpaf": "1a0c1093c3abbc44", "dpdm": "1541c3d48e4ceff1",
                        "dpgan": "4b0a4c7840f44a04", "dpmerf": "f9b72505d220da61", "gan": "f4597a8522d1de4d",
                        "gswgan": "020b96fc3bc0c8fc"}
# records committed since the rule, each configuration's own key
LATER_STREAM_KEYS = {run: key for key, runs in {
    # dpaf long with conv2*'s own clip
    "333798306da3a18f": ["sweep-dpaf-mnist-eps10-s0-c742aa93e7", "sweep-dpaf-mnist-eps10-s1-deba0709f7",
                         "sweep-dpaf-mnist-eps10-s2-11508ea83c"],
    # then G's weight average (noise off: the same streams)
    "962516b601b7412c": ["sweep-dpaf-mnist-eps10-s0-403ef4dbc7", "sweep-dpaf-mnist-eps10-s1-98c77850ae",
                         "sweep-dpaf-mnist-eps10-s2-9a530a7601", "sweep-dpaf-mnist-eps10-noiseoff-s0-c6ffa7cdc5"],
    "f0f4bc1b5166d186": ["sweep-dpaf-mnist-eps1-s0-07068fb1d8"],
    "34ae4df9b10e3e67": ["sweep-dpaf-mnist-eps100-s0-52421eb816"],
    # the long preset without GC, and at μ = 8 (CLAIMS.md dpaf-ablations-long)
    "60a9c8d658b343cb": ["sweep-dpaf-mnist-eps10-s0-44eae6ec52", "sweep-dpaf-mnist-eps10-s1-16072d1af5",
                         "sweep-dpaf-mnist-eps10-s2-749ae01222"],
    "fa499d97d07aa094": ["sweep-dpaf-mnist-eps10-s0-d30ae2ddc2", "sweep-dpaf-mnist-eps10-s1-d0da903db4",
                         "sweep-dpaf-mnist-eps10-s2-9a5aa677b7"],
    # dpgan long at n_D = 5, G's last iterate (the preset before width 64; CLAIMS.md n-d-long's n_D = 5 arm)
    "9d69bd726589023b": ["sweep-dpgan-mnist-eps10-s0-212c41d82a", "sweep-dpgan-mnist-eps10-s1-eb375688ca",
                         "sweep-dpgan-mnist-eps10-s2-c4996532c9"],
    # its n_D = 1 arm (CLAIMS.md n-d-long)
    "def99fa73b15010b": ["sweep-dpgan-mnist-eps10-s0-f35e76564e", "sweep-dpgan-mnist-eps10-s1-2bcebd14f8",
                         "sweep-dpgan-mnist-eps10-s2-7c20f36d90"],
    # its adaptive arm
    "a4ae686f3ee234ca": ["sweep-dpgan-mnist-eps10-s0-910b22602c", "sweep-dpgan-mnist-eps10-s1-5006ca81fa",
                         "sweep-dpgan-mnist-eps10-s2-298522cda4"],
    # its adaptive arm at the paper's other floor, 0.7 (a diagnostic: benchmarks/presets.md, dpgan mnist)
    "54d62bc54c9bb184": ["sweep-dpgan-mnist-eps10-s0-bc46f75bc9", "sweep-dpgan-mnist-eps10-s1-dd0023d312",
                         "sweep-dpgan-mnist-eps10-s2-410e155f95"],
    # its n_D = 10 arm
    "8e61799d8729a57a": ["sweep-dpgan-mnist-eps10-s0-98e3e31782", "sweep-dpgan-mnist-eps10-s1-42747f9274",
                         "sweep-dpgan-mnist-eps10-s2-e7c934fac9"],
    # dpgan's former n_D = 2 long preset with --noise-off: the streams of the noisy records it ablates
    "4b0a4c7840f44a04": ["sweep-dpgan-mnist-eps10-noiseoff-s0-e4fa6843ba",
                         "sweep-dpgan-mnist-eps10-noiseoff-s1-a240779311"],
    # the width-64 ladder schedule from an hour of a core: the long preset now (CLAIMS.md dpgan-hour; its
    # --noise-off run on the same streams), and gan's twin
    "9a4d058c99bda209": ["sweep-dpgan-mnist-eps10-s0-f4c8aae9f0", "sweep-dpgan-mnist-eps10-s1-3bbf611a7b",
                         "sweep-dpgan-mnist-eps10-s2-7478dc767e", "sweep-dpgan-mnist-eps10-noiseoff-s0-4c0de1e259",
                         "sweep-dpgan-mnist-eps10-noiseoff-s1-7fd27c2844",
                         "sweep-dpgan-mnist-eps10-noiseoff-s2-6b2bb7c2a0"],
    "88901f4ac76ec1fa": ["sweep-gan-mnist-epsinf-s0-e995f295ce", "sweep-gan-mnist-epsinf-s1-191fd3788f",
                         "sweep-gan-mnist-epsinf-s2-23db40bb88"],
    # the GPU ladder's rung (widths 128, T = 12,000, n_D = 10) on test seeds, run on the CPU (CLAIMS.md
    # dpgan-ladder), and gan's twin
    "0271b846c5e76ce2": ["sweep-dpgan-mnist-eps10-s0-521d526237", "sweep-dpgan-mnist-eps10-s1-9508292152",
                         "sweep-dpgan-mnist-eps10-s2-289c036e66"],
    "b78dd82e69a450c3": ["sweep-gan-mnist-epsinf-s0-cd3da374de", "sweep-gan-mnist-epsinf-s1-93430c5b71",
                         "sweep-gan-mnist-epsinf-s2-1242c91c76"],
    # gswgan and dpac long at ε = 1 and 100 with the bias-corrected average (CLAIMS.md mnist-long;
    # their ε = 10 and noise-off records keep the recorded keys)
    "50ea22d037e89969": ["sweep-gswgan-mnist-eps1-s0-9572c69252"],
    "2f0c382a5e3dfc3f": ["sweep-gswgan-mnist-eps100-s0-9163b0b94e"],
    "824833bd1991352d": ["sweep-dpac-mnist-eps1-s0-f3a1fc6c69"],
    "4b1f62cff7ef201d": ["sweep-dpac-mnist-eps100-s0-aeba1c5fef"],
    # dpdm long at ε = 1 and 100 with the bias-corrected average (its ε = 10 seeds keep the recorded key)
    "a9e2417f48d25e81": ["sweep-dpdm-mnist-eps1-s0-d7af9e439d"],
    "426d4a113c54d35a": ["sweep-dpdm-mnist-eps100-s0-195998e621"],
    # gan long at dpgan's new preset (its non-private twin: n_D = 5, last iterate)
    "2a2b0afc60acd39a": ["sweep-gan-mnist-epsinf-s0-935444e3ea",
                         "sweep-gan-mnist-epsinf-s1-33b0946a70",
                         "sweep-gan-mnist-epsinf-s2-a59bc49346"],
}.items() for run in runs}


def _three(cfg: RunConfig) -> tuple[str, str, str]:
    priv = {"target": {"delta": cfg.delta}, "private": methods.get(cfg.method).private}
    return stream_key(cfg), Cell(cfg).key, json.dumps(identity(cfg.to_json(), priv))


def _quick(method: str, *sets: str) -> RunConfig:
    eps = 10.0 if methods.get(method).private else None
    return build_config(method, "digits", epsilon=eps, preset="quick", sets=list(sets))


def test_every_run_setting_has_its_place_in_the_rule():
    fields = {f.name for f in dataclasses.fields(RunConfig)} - {"hparams"}
    assert set(rule.RUN_SETTINGS) == fields
    assert all(counts <= rule.ALL for counts in rule.RUN_SETTINGS.values())


@pytest.mark.parametrize("method,setting", [("dpgan", "log_every=7"), ("dpaf", "torch_threads=3"),
                                            ("dpgan", "max_physical_batch=16"), ("dpgan", "grad_sample_mode=hooks"),
                                            ("dpdm", "max_physical_batch=8"), ("dpntk", "chunk=7"),
                                            ("dpaf", "grad_sample_mode=hooks"), ("dpmerf", "log_every=3")])
def test_a_bookkeeping_setting_changes_neither_streams_nor_cell_nor_report_row(method, setting):
    plain, logged = _quick(method), _quick(method, setting)
    key = setting.split("=")[0]
    assert key in rule.bookkeeping(method) and plain.hparams[key] != logged.hparams[key]
    assert _three(logged) == _three(plain)


def test_a_post_processing_setting_keeps_the_streams_only():
    plain, moved = _quick("dpgan", "ema_decay=0.99"), _quick("dpgan", "ema_decay=0.99", "ema_warmup=uniform")
    assert plain.hparams["ema_warmup"] != "uniform" and "ema_warmup" in rule.POST_PROCESSING_HPARAMS
    (s0, c0, r0), (s1, c1, r1) = _three(plain), _three(moved)
    assert s1 == s0 and c1 != c0 and r1 != r0


@pytest.mark.parametrize("change", [dict(sets=["lr_d=0.005"]), dict(delta=1e-6), dict(epsilon=5.0)])
def test_a_training_setting_changes_the_streams_and_the_cell(change):
    kwargs = dict(epsilon=10.0, preset="quick", sets=[])
    plain, moved = build_config("dpgan", "digits", **kwargs), build_config("dpgan", "digits", **{**kwargs, **change})
    (s0, c0, r0), (s1, c1, r1) = _three(plain), _three(moved)
    assert s1 != s0 and c1 != c0 and (r1 != r0 or "epsilon" in change)  # ε: the report's own column


def test_what_counts_for_the_cell_only_keeps_the_streams_and_the_report_row():
    plain = _quick("dpgan")
    for moved in (dataclasses.replace(plain, seed=1), dataclasses.replace(plain, device="cpu"),
                  dataclasses.replace(plain, evaluators=("gen2real_mlp",))):
        (s0, c0, r0), (s1, c1, r1) = _three(plain), _three(moved)
        assert s1 == s0 and c1 != c0 and r1 == r0


@pytest.mark.parametrize("record", sorted(COMMITTED.glob("sweep-*")), ids=lambda p: p.name)
def test_the_committed_records_keep_their_cells_and_streams(record):
    """The rule moved the bookkeeping settings out of the keys without moving a record: its cell
    is the suffix of its directory's name, and its streams' key is the one it was trained with."""
    cfg = runner.recorded_config(record)
    assert Cell(cfg).key == record.name.rsplit("-", 1)[1]
    assert stream_key(cfg) == LATER_STREAM_KEYS.get(record.name, RECORDED_STREAM_KEYS[cfg.method])


def test_a_run_at_another_bookkeeping_value_finds_the_recorded_cell():
    """A sweep with ``set: {log_every: …}`` finds the committed run of that cell finished."""
    record = COMMITTED / "sweep-dpgan-mnist-eps10-s0-fc5dc9e8a5"
    cfg = runner.recorded_config(record)
    logged = dataclasses.replace(cfg, hparams={**cfg.hparams, "log_every": cfg.hparams["log_every"] + 1})
    assert Cell(logged).run_name == Cell(cfg).run_name and stream_key(logged) == stream_key(cfg)


class _Recorder:
    """A stand-in method whose images are its sample stream's next draws (and which remembers
    the labels it was asked for)."""

    def __init__(self, conditional: bool):
        self.conditional, self.asked = conditional, []

    def sample(self, n, labels, rng):
        self.asked.append(labels)
        return torch.rand(n, 1, 2, 2, generator=rng, dtype=torch.float64), (
            labels if labels is not None else torch.zeros(n, dtype=torch.long))


@pytest.mark.parametrize("conditional", [True, False])
def test_samples_come_from_the_run_s_own_stream(conditional):
    """``runner.draw_samples``, the one place a run's samples are drawn (the runner and the
    scripts that re-sample a run): every class ``samples_per_class`` times, in class order, from
    the seed's sample stream whatever the global one did, as float32 on the CPU."""
    cfg = dataclasses.replace(build_config(method="dpmean", dataset="digits", epsilon=10, seed=3), samples_per_class=4)
    m = _Recorder(conditional)
    first, labels = runner.draw_samples(cfg, 10, m, torch.device("cpu"))
    torch.manual_seed(12345)
    torch.rand(7)
    again, _ = runner.draw_samples(cfg, 10, m, torch.device("cpu"))
    assert first.dtype == torch.float32 and first.device.type == "cpu" and first.shape == (40, 1, 2, 2)
    assert torch.equal(first, again)
    if conditional:
        assert torch.equal(m.asked[0], torch.arange(10).repeat_interleave(4)) and torch.equal(labels, m.asked[0])
    else:
        assert m.asked == [None, None]
    other, _ = runner.draw_samples(dataclasses.replace(cfg, seed=4), 10, m, torch.device("cpu"))
    assert not torch.equal(first, other)
