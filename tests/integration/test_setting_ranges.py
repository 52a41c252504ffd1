"""Every method setting is checked against the range its ``Hparams`` declares
(``dpgen_bench.settings``) before anything runs: −1, 0, NaN and ∞ in each numeric setting of
each method are refused in one line, or accepted where the declaration allows them; the
planner refuses a noise multiplier, step count or rate that no search can use instead of
searching forever; a method without declarations is type-checked as before."""

from __future__ import annotations

import dataclasses
import json
import sys
import time
import typing
from pathlib import Path

import pytest

from dpgen_bench import registry, settings
from dpgen_bench.api import Budget, DataInfo
from dpgen_bench.config import RunConfig, build_config, hparam_fields
from dpgen_bench.errors import SettingOutOfRange, UserError
from dpgen_bench.privacy.accounting import calibrate_noise, steps_and_noise, steps_for_budget
from dpgen_bench.runner import build_method

sys.path.insert(0, str(Path(__file__).parent))
from cli_process import CliProcess  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PROBES = ("-1", "0", "nan", "inf")
INFO = DataInfo("digits", (1, 16, 16), 10, 1437)
# the only numeric setting of a built-in method whose range holds −1: EDM's mean log noise level
NEGATIVE_ALLOWED = {("dpdm", "p_mean")}


def _methods() -> list[str]:
    return [*registry.methods.names(), "dummy"]


def _numeric(hint) -> bool:
    return hint in (int, float) or any(_numeric(a) for a in typing.get_args(hint))


def _cases() -> list[tuple[str, str]]:
    return [(m, key) for m in _methods() for key, hint in hparam_fields(registry.methods.get(m).Hparams).items()
            if _numeric(hint)]


def _config(method: str, key: str, value: str) -> RunConfig:
    cls = registry.methods.get(method)
    return build_config(method, "digits", epsilon=10.0 if cls.private else None, preset="tiny",
                        sets=[f"{key}={value}"])


def test_every_numeric_setting_of_every_method_declares_its_range():
    undeclared = [(m, k) for m, k in _cases() if k not in settings.declared(registry.methods.get(m).Hparams)]
    assert len(_cases()) > 150 and not undeclared


def test_minus_one_zero_nan_and_inf_are_refused_in_one_line_or_planned_at_once():
    accepted, started = [], time.perf_counter()
    for method, key in _cases():
        ranges = settings.declared(registry.methods.get(method).Hparams)[key]
        for value in PROBES:
            allowed = all(r.holds(float(value)) for r in ranges)
            try:
                cfg = _config(method, key, value)
            except UserError as e:
                assert "\n" not in str(e) and key in str(e), (method, key, value, str(e))
                if not allowed:
                    continue
                # in range, refused by a rule between settings: said in one line all the same
                assert not isinstance(e, SettingOutOfRange), (method, key, value, str(e))
                continue
            assert allowed, f"{method} accepted {key}={value} outside {[str(r) for r in ranges]}"
            accepted.append((method, key, value))
            t = time.perf_counter()
            try:  # the plan of an accepted value: calibrated, or refused in one line, never a search without end
                cls = registry.methods.get(cfg.method)
                build_method(cfg, cls, INFO).plan(Budget(cfg.epsilon) if cls.private else Budget(float("inf")))
            except UserError as e:
                assert "\n" not in str(e)
            assert time.perf_counter() - t < 5, (method, key, value)
    assert {(m, k) for m, k, v in accepted if v == "-1"} == NEGATIVE_ALLOWED
    assert not [a for a in accepted if a[2] in ("nan", "inf")]
    assert time.perf_counter() - started < 20


def test_a_range_names_the_setting_the_value_the_range_and_where_it_came_from(tmp_path):
    with pytest.raises(SettingOutOfRange) as e:
        _config("dpgan", "d_width", "-1")
    assert str(e.value) == "--set d_width=-1 is out of range: d_width must be ≥ 1 (bench list settings dpgan)"
    config = tmp_path / "hp.json"
    config.write_text(json.dumps({"hparams": {"ema_decay": 1.0}}))
    with pytest.raises(SettingOutOfRange, match=r"^--config .*hp.json \(hparams\) ema_decay=1 is out of range: "
                                                r"ema_decay must be in \[0, 1\)"):
        build_config("dpgan", "digits", epsilon=1.0, config_file=config)
    with pytest.raises(SettingOutOfRange, match=r"every value of ch_mult must be ≥ 1"):
        _config("dpdm", "ch_mult", "1,0")
    bad_preset = type("BadPreset", (registry.methods.get("dummy"),), {"presets": {"tiny": {"*": {"steps": 0}}}})
    registry.methods.register("bad-preset", bad_preset, hidden=True, replace=True)
    with pytest.raises(SettingOutOfRange, match=r"^preset 'tiny' steps=0 is out of range: steps must be ≥ 1"):
        build_config("bad-preset", "digits", epsilon=1.0, preset="tiny")


def test_hparams_built_in_code_are_checked_but_a_record_is_never_refused():
    from methods.dpgan import DPGANHparams

    with pytest.raises(ValueError, match="lr_d=0 is out of range"):
        DPGANHparams(lr_d=0.0)
    cfg = _config("dpgan", "steps", "10")
    cfg = dataclasses.replace(cfg, hparams={**cfg.hparams, "lr_d": 0.0})  # a record from before lr_d's range
    record = RunConfig.from_json(json.loads(json.dumps(cfg.to_json())))  # as bench eval and --resume read it
    assert build_method(record, registry.methods.get("dpgan"), INFO).hparams.lr_d == 0.0


def test_a_method_without_declarations_is_type_checked_as_before():
    @dataclasses.dataclass(frozen=True)
    class Plain:
        steps: int = 5
        max_grad_norm: float = 1.0

    plain = type("Plain", (registry.methods.get("dummy"),), {"Hparams": Plain})
    registry.methods.register("plain-example", plain, hidden=True, replace=True)
    assert settings.declared(Plain) == {}
    cfg = build_config("plain-example", "digits", epsilon=1.0, sets=["max_grad_norm=-1"])
    assert cfg.hparams["max_grad_norm"] == -1
    with pytest.raises(UserError, match="expected an integer"):
        build_config("plain-example", "digits", epsilon=1.0, sets=["steps=abc"])
    with pytest.raises(UserError, match="expected a finite number"):
        build_config("plain-example", "digits", epsilon=1.0, sets=["max_grad_norm=nan"])
    with pytest.raises(UserError, match="number of steps must be ≥ 1"):  # its own plan: refused, not searched
        build_method(build_config("plain-example", "digits", epsilon=1.0, sets=["steps=-1"]), plain, INFO).plan(
            Budget(1.0))


@pytest.mark.parametrize("given", [dict(noise_multiplier=-1.0), dict(noise_multiplier=0.0),
                                   dict(noise_multiplier=float("nan")), dict(noise_multiplier=float("inf")),
                                   dict(steps=0), dict(steps=-1), dict(sample_rate=0.0), dict(sample_rate=-0.5),
                                   dict(sample_rate=1.5), dict(sample_rate=float("nan"))])
def test_the_planner_refuses_what_no_search_can_use(given):
    kw = dict(method="m", epsilon=10.0, delta=1e-5, sample_rate=0.05, steps=None, noise_multiplier=None)
    if "steps" in given:
        kw["noise_multiplier"] = 1.0
    kw.update(given)
    t = time.perf_counter()
    with pytest.raises(UserError, match="must be"):
        steps_and_noise(**kw)
    with pytest.raises(UserError, match="must be"):
        if "noise_multiplier" in given:
            steps_for_budget(epsilon=10.0, delta=1e-5, sample_rate=0.05, noise_multiplier=given["noise_multiplier"])
        else:
            calibrate_noise(epsilon=10.0, delta=1e-5, sample_rate=kw["sample_rate"], steps=given.get("steps", 10))
    assert time.perf_counter() - t < 1


@pytest.mark.parametrize("args, line", [
    # used to search forever: σ < 0 sent the RDP series past any number of terms
    (["privacy", "--method", "dpgan", "--dataset", "digits", "--eps", "10", "--set", "noise_multiplier=-1"],
     "error: --set noise_multiplier=-1 is out of range: noise_multiplier must be > 0 (bench list settings dpgan)"),
    # used to end in PyTorch's traceback, after the run directory existed
    (["run", "--method", "dpgan", "--eps", "10", "--preset", "tiny", "--set", "d_width=-1", "--dry-run"],
     "error: --set d_width=-1 is out of range: d_width must be ≥ 1 (bench list settings dpgan)"),
    (["run", "--method", "dpdm", "--eps", "10", "--preset", "tiny", "--set", "lr=-1"],
     "error: --set lr=-1 is out of range: lr must be > 0 (bench list settings dpdm)"),
], ids=["dpgan-negative-noise", "dpgan-negative-width", "dpdm-negative-lr"])
def test_the_cli_refuses_a_value_out_of_range_in_one_line_before_a_run_directory(args, line, tmp_path):
    proc = CliProcess(args, env={"DPGEN_RESULTS": str(tmp_path / "runs")}, cwd=tmp_path)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2 and err.strip() == line
    assert not (tmp_path / "runs").exists()


def test_bench_list_settings_shows_type_range_and_default(cli_runner):
    from dpgen_bench.cli import cli

    rows = [line.split("\t") for line in cli_runner.invoke(cli, ["list", "settings", "dpgan"]).output.splitlines()]
    assert ["dpgan", "d_width", "int", "≥ 1", "128"] in rows
    assert ["dpgan", "noise_multiplier", "float | None", "> 0", "None"] in rows
    assert ["dpgan", "ema_decay", "float", "in [0, 1)", "0"] in rows
    assert {r[1] for r in rows} == set(hparam_fields(registry.methods.get("dpgan").Hparams))
    every = cli_runner.invoke(cli, ["list", "settings"]).output
    assert "dpdm\tp_mean\tfloat\tfinite\t-1.2" in every and "dummy" not in every


def test_the_bounded_noise_search_finds_opacus_sigma():
    """``calibrate_noise`` searches as Opacus' ``get_noise_multiplier`` does, its bisection bounded: the same σ."""
    import warnings

    from opacus.accountants.utils import get_noise_multiplier

    from dpgen_bench.privacy.accounting import _ORDERS

    for eps, q, steps in ((1.0, 64 / 1437, 1500), (10.0, 0.05, 200), (0.2, 0.3, 30)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            theirs = get_noise_multiplier(target_epsilon=eps, target_delta=1e-5, sample_rate=q, steps=steps,
                                          accountant="rdp", epsilon_tolerance=max(1e-4, 0.005 * eps), alphas=_ORDERS)
        assert calibrate_noise(epsilon=eps, delta=1e-5, sample_rate=q, steps=steps) == theirs


@pytest.mark.parametrize("q, sigma", [(0.1, -1.0), (0.1, float("nan")), (-0.1, 1.0), (1.5, 1.0)])
def test_the_rdp_series_refuses_at_once_what_it_cannot_sum(q, sigma):
    from dpgen_bench.privacy.rdp_orders import rdp_orders

    t = time.perf_counter()
    with pytest.raises(ValueError, match="needs q in"):
        rdp_orders(q, sigma, [1.5, 2.0, 32.0])
    assert time.perf_counter() - t < 1
