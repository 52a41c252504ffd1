"""Third-party plugins through entry points, with REAL installed distributions: tiny
packages are built into wheels, installed with pip into folders of their own, and the CLI
runs in a subprocess with those folders on PYTHONPATH (so ``importlib.metadata`` finds
their dist-info). Covers: a plugin method, evaluator and dataset listed and used end to end;
a plugin named like a built-in (the built-in is kept, one warning naming the distribution);
two distributions with one name (the first is kept, one warning); a plugin whose target
cannot be imported (listed, but using it is one ``error:`` line and exit code 2).
One wheel build for the module; three CLI subprocesses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dpgen_bench.errors import UserError
from dpgen_bench.registry import Registry

# its module fixtures build and install wheels once per process: keep the file on one xdist worker
pytestmark = pytest.mark.xdist_group("entry_points")

ROOT = Path(__file__).resolve().parents[2]
DEMO = "dpgb-plugin-demo"
RIVAL = "dpgb-plugin-rival"
BROKEN = "dpgb-plugin-broken"

# The plugin a third party would write: a Gaussian-mechanism method, an evaluator, a dataset.
# ``fit`` uses only the public RunContext (``ctx.part``, ``ctx.spend``, ``ctx.generator``).
DEMO_SOURCE = '''
"""dpgb_plugin_demo: a third-party dpgen_bench plugin (test fixture)."""

from dataclasses import dataclass

import torch

from dpgen_bench.api import Evaluator, ImageData, Method, PrivacyPart
from dpgen_bench.privacy import calibrate_noise

PART = "demo_means"


def _sigma(budget, steps):
    return calibrate_noise(epsilon=budget.epsilon, delta=budget.delta, sample_rate=1.0, steps=steps)


@dataclass(frozen=True)
class DemoHparams:
    steps: int = 3


class DemoMethod(Method):
    """Plugin demo: Gaussian-noised class means."""

    name = "demo-means"
    Hparams = DemoHparams
    presets = {"quick": {"*": {"samples_per_class": 4}}}

    def __init__(self, hparams, info):
        super().__init__(hparams, info)
        self.means = torch.zeros(info.num_classes, *info.image_shape)

    def plan(self, budget):
        return [PrivacyPart(PART, _sigma(budget, self.hparams.steps), 1.0, self.hparams.steps)]

    def fit(self, train, budget, ctx):
        sigma, noise = ctx.part(PART).noise_multiplier, ctx.generator("noise")
        x = train.images.detach().cpu().flatten(1)
        x = x / x.norm(dim=1, keepdim=True).clamp(min=1.0)  # sensitivity 1 per class sum
        y = train.labels.detach().cpu()
        for _ in range(self.hparams.steps):
            ctx.spend(PART)
            for c in range(self.info.num_classes):
                noisy = x[y == c].sum(0) + sigma * torch.randn(x.shape[1], generator=noise)
                self.means[c] = (noisy / max(1, int((y == c).sum()))).view(self.info.image_shape)

    def sample(self, n, labels, rng):
        if labels is None:
            labels = torch.randint(0, self.info.num_classes, (n,), generator=rng)
        noise = 0.1 * torch.randn(n, *self.info.image_shape, generator=rng)
        return (self.means[labels] + noise).clamp(-1, 1), labels

    def state_dict(self):
        return {"means": self.means}

    def load_state_dict(self, state):
        self.means = state["means"]


class DemoEvaluator(Evaluator):
    """Plugin demo: mean pixel value of the generated images."""

    name = "demo_mean_pixel"
    higher_is_better = True

    def evaluate(self, run):
        return {"metrics": {"demo_mean_pixel": float(run.images.mean())}, "protocol": {"n": len(run.images)}}


def load_demo_digits(**_):
    """Plugin demo: the first 200 train / 100 test images of digits."""
    from dpgen_bench.data.digits import load_digits_data

    d = load_digits_data()
    return ImageData(name="demo-digits", train=d.train.subset(torch.arange(200)), test=d.test.subset(torch.arange(100)),
                     class_names=d.class_names, description="a slice of digits (plugin demo)")
'''

# name -> (entry points per group, the package's source)
PACKAGES = {
    DEMO: ({"dpgen_bench.methods": {"demo-means": "dpgb_plugin_demo:DemoMethod"},
            "dpgen_bench.evaluators": {"demo_mean_pixel": "dpgb_plugin_demo:DemoEvaluator"},
            "dpgen_bench.datasets": {"demo-digits": "dpgb_plugin_demo:load_demo_digits"}},
           DEMO_SOURCE),
    # one entry point named like a built-in, one like the demo's method (this distribution
    # is found after the demo's); importing its module at all fails the test
    RIVAL: ({"dpgen_bench.methods": {"dpgan": "dpgb_plugin_rival:NotDPGAN", "demo-means": "dpgb_plugin_rival:Other"}},
            'raise RuntimeError("the rival plugin must never be imported")\n'),
    # its target cannot be imported
    BROKEN: ({"dpgen_bench.methods": {"demo-broken": "dpgb_plugin_broken:Broken"}},
             "import dpgb_no_such_dependency  # noqa: F401\n"),
}


def _pip(*args: str) -> None:
    cmd = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input", *args]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, (cmd, res.stdout, res.stderr)


@pytest.fixture(scope="module")
def sites(tmp_path_factory) -> dict[str, Path]:
    """Each distribution built into a wheel and installed into a folder of its own."""
    root = tmp_path_factory.mktemp("entry_points")
    src_dirs = []
    for dist, (groups, source) in PACKAGES.items():
        pkg = dist.replace("-", "_")
        src = root / "src" / dist
        (src / pkg).mkdir(parents=True)
        (src / pkg / "__init__.py").write_text(textwrap.dedent(source))
        eps = "".join(f'\n[project.entry-points."{group}"]\n' + "".join(f'"{n}" = "{v}"\n' for n, v in items.items())
                      for group, items in groups.items())
        (src / "pyproject.toml").write_text(
            '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n\n'
            f'[project]\nname = "{dist}"\nversion = "0.1"\n{eps}\n'
            f'[tool.setuptools]\npackages = ["{pkg}"]\n')
        src_dirs.append(str(src))
    wheels = root / "dist"
    _pip("wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(wheels), *src_dirs)
    out = {}
    for dist in PACKAGES:
        (wheel,) = wheels.glob(f"{dist.replace('-', '_')}-*.whl")
        out[dist] = root / "site" / dist
        _pip("install", "--no-deps", "--no-index", "--target", str(out[dist]), str(wheel))
    return out


def bench(sites: dict[str, Path], dists: list[str], *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """``python -m dpgen_bench.cli ARGS`` with the installed ``dists`` (in this order) on PYTHONPATH,
    then this checkout (the code under test, as in this process: see conftest.py)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPGEN_")}
    env["PYTHONPATH"] = os.pathsep.join([*(str(sites[d]) for d in dists), str(ROOT)])
    return subprocess.run([sys.executable, "-m", "dpgen_bench.cli", *args], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=300)


def _lines(text: str, *needles: str) -> list[str]:
    return [line for line in text.splitlines() if all(n in line for n in needles)]


# -------------------------------------------------------------------- through the CLI


@pytest.fixture(scope="module")
def listed(sites, tmp_path_factory) -> subprocess.CompletedProcess:
    """``bench list methods`` with the demo and then the rival distribution installed."""
    return bench(sites, [DEMO, RIVAL], "list", "methods", cwd=tmp_path_factory.mktemp("list"))


def test_list_shows_the_plugins(listed):
    assert listed.returncode == 0, listed.stderr  # the rival's module raises when imported: it never was
    assert "demo-means\tprivate\tPlugin demo: Gaussian-noised class means." in listed.stdout.splitlines()
    assert "dpgan\tprivate\t" in listed.stdout  # the built-ins are still there


def test_a_plugin_named_like_a_built_in_is_ignored_with_one_warning(listed):
    (warning,) = _lines(listed.stderr, "'dpgan'")
    assert RIVAL in warning and "dpgb_plugin_rival:NotDPGAN" in warning
    assert "built-in" in warning and "kept" in warning and "another name" in warning
    assert len(_lines(listed.stdout, "dpgan\t")) == 1


def test_two_distributions_with_one_name_keep_the_first(listed):
    (warning,) = _lines(listed.stderr, "'demo-means'")
    assert RIVAL in warning and DEMO in warning and "dpgb_plugin_rival:Other" in warning and "kept" in warning
    assert len(_lines(listed.stdout, "demo-means\t")) == 1
    assert len(_lines(listed.stderr, RIVAL)) == 2  # one warning per clash, each once


def test_run_with_plugin_method_dataset_and_evaluator(sites, tmp_path):
    runs = tmp_path / "runs"
    res = bench(sites, [DEMO], "run", "--method", "demo-means", "--dataset", "demo-digits", "--eps", "1",
                "--eval", "demo_mean_pixel", "--results", str(runs), "--device", "cpu", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "ignored" not in res.stderr
    (run_dir,) = [p for p in runs.iterdir() if p.is_dir()]
    ev = json.loads((run_dir / "eval.json").read_text())
    assert set(ev["metrics"]) == {"demo_mean_pixel"}
    assert -1 <= ev["metrics"]["demo_mean_pixel"] <= 1
    priv = json.loads((run_dir / "privacy.json").read_text())
    (part,) = priv["parts"]
    assert part["name"] == "demo_means" and part["steps"] == 3
    assert 0 < priv["epsilon"]["rdp"] <= 1.0
    cfg = json.loads((run_dir / "config.json").read_text())
    assert cfg["method"] == "demo-means" and cfg["dataset"] == "demo-digits"


def test_a_broken_plugin_is_one_error_line_when_used(sites, tmp_path):
    res = bench(sites, [DEMO, BROKEN], "run", "--method", "demo-broken", "--dataset", "demo-digits", "--eps", "1",
                "--results", str(tmp_path / "runs"), "--device", "cpu", cwd=tmp_path)
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr
    (error,) = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    for needle in ("'demo-broken'", BROKEN, "dpgb_plugin_broken:Broken", "ModuleNotFoundError",
                   "dpgb_no_such_dependency"):
        assert needle in error
    assert not (tmp_path / "runs").exists()


# ---------------------------------------------------- the registry itself, in process


@pytest.fixture
def on_path(sites, monkeypatch):
    """Put installed distributions on sys.path for this test; forget their modules after."""

    def put(*dists: str) -> None:
        for d in reversed(dists):
            monkeypatch.syspath_prepend(str(sites[d]))

    yield put
    for mod in [m for m in sys.modules if m.startswith("dpgb_")]:
        del sys.modules[mod]


def _methods() -> Registry:
    reg = Registry("method", "dpgen_bench.methods")
    reg.register("dpgan", "builtins:object")  # a stand-in built-in: cheap to import
    return reg


def test_names_lists_a_broken_plugin_and_get_fails_in_one_line(on_path, warnings_seen):
    on_path(BROKEN)
    reg = _methods()
    assert reg.names() == ["demo-broken", "dpgan"]
    assert "dpgb_plugin_broken" not in sys.modules  # names() imports nothing
    with pytest.raises(UserError) as e:
        reg.get("demo-broken")
    msg = str(e.value)
    assert "\n" not in msg and BROKEN in msg and "ModuleNotFoundError" in msg
    assert warnings_seen == []


def test_clash_and_duplicate_warn_once_each(on_path, warnings_seen):
    on_path(DEMO, RIVAL)
    reg = _methods()
    for _ in range(3):
        assert reg.names() == ["demo-means", "dpgan"]
    assert len(warnings_seen) == 2, warnings_seen
    assert all("\n" not in w for w in warnings_seen)
    assert reg.get("demo-means").__module__ == "dpgb_plugin_demo"
    assert reg.get("dpgan") is object
    assert "dpgb_plugin_rival" not in sys.modules
