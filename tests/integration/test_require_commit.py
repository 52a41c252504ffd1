"""Records made before a fix: ``bench sweep --require-commit REV`` runs again every complete
cell whose record (env.json's git commit) does not contain REV, and bench claims leaves such
records out of CLAIMS.md or runs them again. The checkout is a throw-away git repository
with three commits: old → fix → later."""

import os
import subprocess
from pathlib import Path

import pytest

from dpgen_bench import claims as claims_module
from dpgen_bench import store, sweep
from dpgen_bench.cli import cli
from dpgen_bench.errors import UserError
from dpgen_bench.sweep import expand

ROOT = Path(__file__).resolve().parents[2]


def _git(repo, *args, env=None):
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True,
                          env=env).stdout.strip()


@pytest.fixture
def checkout(tmp_path, monkeypatch):
    """A git repository standing in for this package's checkout: commits old, fix, later."""
    repo = tmp_path / "code"
    repo.mkdir()
    _git(repo, "init", "-q")
    commits = {}
    for day, name in enumerate(("old", "fix", "later"), start=1):
        (repo / "f.txt").write_text(name)
        _git(repo, "add", "f.txt")
        date = f"2026-11-0{day}T12:00:00+00:00"
        _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", name,
             env={**os.environ, "GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date})
        commits[name] = _git(repo, "rev-parse", "HEAD")
    monkeypatch.setattr(store, "CODE_ROOT", repo)
    return commits


def _made_at(run_dir: Path, commit: str | None) -> None:
    env = store.read_json(run_dir / "env.json")
    env["git"] = {"commit": commit, "dirty": False}
    store.write_json(run_dir / "env.json", env)


def test_made_after_follows_the_history(checkout, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    store.write_json(run / "env.json", {})
    assert not store.made_after(run, checkout["fix"])  # no commit recorded
    for made, expected in [("old", False), ("fix", True), ("later", True)]:
        _made_at(run, checkout[made])
        assert store.made_after(run, checkout["fix"]) is expected, made
    _made_at(run, "0123456789abcdef0123456789abcdef01234567")  # made from another clone
    assert not store.made_after(run, checkout["fix"])
    assert store.resolve_commit("HEAD~1") == checkout["fix"]
    assert store.resolve_commit(checkout["old"][:10]) == checkout["old"]
    with pytest.raises(UserError, match="no commit 'nope'"):
        store.resolve_commit("nope")
    assert store.commit_date(checkout["fix"])[:4].isdigit()
    assert store.commit_date("0123456789abcdef0123456789abcdef01234567") is None


def test_sweep_runs_a_record_made_before_the_fix_again(checkout, cli_runner, results):
    args = ["sweep", "--method", "dummy", "--eps", "1", "--seeds", "0,1", "--preset", "tiny", "--no-report"]
    res = cli_runner.invoke(cli, args)
    assert res.exit_code == 0, (res.stderr, res.exception)
    old, new = sorted(results.iterdir())
    assert store.record_commit(old) == checkout["later"]  # the runs record the checkout's HEAD
    _made_at(old, checkout["old"])
    stamp = (new / "eval.json").stat().st_mtime_ns

    res = cli_runner.invoke(cli, [*args, "--require-commit", "HEAD~1"])
    assert res.exit_code == 0, (res.stderr, res.exception)
    assert "2 cells, 1 already complete, 1 to run (0 interrupted: 0 resumed from a checkpoint; 1 stale" in res.stderr
    assert store.record_commit(old) == checkout["later"] and store.is_complete(old)  # ran again
    assert (new / "eval.json").stat().st_mtime_ns == stamp  # made after the fix: kept
    (kept,) = [p for p in results.iterdir() if p.name.startswith(".stale-")]
    assert store.record_commit(kept) == checkout["old"]  # the old record is kept, out of sight
    res = cli_runner.invoke(cli, [*args, "--require-commit", "HEAD~1"])
    assert "2 already complete, 0 to run" in res.stderr
    # without the flag nothing is looked at
    _made_at(old, checkout["old"])
    res = cli_runner.invoke(cli, args)
    assert "2 already complete, 0 to run" in res.stderr


def test_an_unknown_commit_is_one_line(checkout, cli_runner, results):
    res = cli_runner.invoke(cli, ["sweep", "--method", "dummy", "--eps", "1", "--preset", "tiny",
                                  "--require-commit", "v9.9"])
    assert res.exit_code != 0 and "no commit 'v9.9'" in res.stderr and "Traceback" not in res.stderr
    assert not results.exists() or not any(results.iterdir())


def test_a_checkpoint_of_code_without_the_fix_is_not_resumed(checkout, monkeypatch, tmp_path):
    (cell,) = expand({"method": "dummy", "eps": "1", "seeds": "0", "preset": "tiny"})
    root = tmp_path / "runs"
    partial = root / cell.run_name
    partial.mkdir(parents=True)
    store.write_json(partial / "env.json", {"git": {"commit": checkout["old"], "dirty": False}})
    monkeypatch.setattr(sweep, "_has_checkpoint", lambda run_dir: True)
    resumed = []
    monkeypatch.setattr(sweep, "run_cell", lambda cfg, d, data_root, threads, resume: resumed.append(resume) or {})
    counts = sweep.run_sweep([cell], root, require_commit=checkout["fix"])
    assert resumed == [False] and counts["resumed"] == 0
    assert any(p.name.startswith(".failed-") for p in root.iterdir())  # the evidence kept
    # the same checkpoint made after the fix is resumed
    partial.mkdir()
    store.write_json(partial / "env.json", {"git": {"commit": checkout["later"], "dirty": False}})
    counts = sweep.run_sweep([cell], root, require_commit=checkout["fix"])
    assert resumed == [False, True] and counts["resumed"] == 1


def _all_read(claims, spec, claim, root):
    arms = claims.build_arms(spec, claim, "digits")
    for a in arms.values():
        claims.read_arm(a, root)
    return arms


def test_claims_names_the_code_of_each_section_and_leaves_out_stale_records(checkout, tmp_path):
    claims = claims_module
    spec = claims.load_claims(ROOT / "benchmarks" / "claims.yaml")
    claim = next(c for c in spec["claims"] if c["id"] == "n-d-steps")
    arms = claims.build_arms(spec, claim, "digits")
    made = ["old", "fix", "later"]
    for a in arms.values():
        for i, cell in enumerate(a.cells):
            d = tmp_path / cell.run_name
            d.mkdir(parents=True, exist_ok=True)
            store.write_json(d / "config.json", cell.config.to_json())
            store.write_json(d / "privacy.json", {"target": {"epsilon": 10.0, "delta": 1e-5},
                                                     "epsilon": {"rdp": 9.9, "prv": 9.0}})
            store.write_json(d / "eval.json", {"metrics": {"gen2real_cnn": 0.5 + 0.01 * i}})
            store.write_json(d / "env.json", {"git": {"commit": checkout[made[i]], "dirty": False}})
    for a in arms.values():
        claims.read_arm(a, tmp_path, require_commit=checkout["fix"])
        assert a.stale == 1 and len(a.eps) == 2 and a.values["gen2real_cnn"] == [0.51, 0.52]
    block = claims.render_block(spec, "digits", [claim], {claim["id"]: arms}, None, require_commit=checkout["fix"])
    n = len(arms)
    later, fix = checkout["later"][:7], checkout["fix"][:7]
    assert f"- **Code:** {n} runs at {later} (2026-11-03); {n} runs at {fix} (2026-11-02) (" in block
    assert f"({n} older records left out: made without {fix})" in block
    assert f"| {next(iter(arms))} | 2/3 |" in block
    # a section rendered before from all three records is re-rendered, not kept: the records
    # left out are here, and stale
    before = claims.render_block(spec, "digits", [claim], {claim["id"]: _all_read(claims, spec, claim, tmp_path)}, None)
    assert f"| {next(iter(arms))} | 3/3 |" in before
    again = claims.render_block(spec, "digits", [claim], {claim["id"]: arms}, None, previous=before,
                                require_commit=checkout["fix"])
    assert again == block and claims.KEPT_NOTE not in again
    # without the requirement every record counts, and the oldest commit is named too
    fresh = _all_read(claims, spec, claim, tmp_path)
    assert all(a.stale == 0 and len(a.eps) == 3 for a in fresh.values())
    assert f"{n} runs at {checkout['old'][:7]}" in claims.code_text(fresh)


def test_report_leaves_out_the_runs_made_before_the_fix(checkout, cli_runner, results):
    res = cli_runner.invoke(cli, ["sweep", "--method", "dummy", "--eps", "1,10", "--preset", "tiny", "--no-report"])
    assert res.exit_code == 0, (res.stderr, res.exception)
    old, new = sorted(results.iterdir())
    _made_at(old, checkout["old"])
    res = cli_runner.invoke(cli, ["report", "--layout", "runs"])
    assert res.exit_code == 0 and res.stdout.count("| dummy") == 2
    res = cli_runner.invoke(cli, ["report", "--layout", "runs", "--require-commit", "HEAD~1"])
    assert res.exit_code == 0, (res.stderr, res.exception)
    assert "eps1-" in old.name and "eps10-" in new.name
    assert res.stdout.count("| dummy") == 1 and "| dummy | digits | tiny | 0 | 10 |" in res.stdout
    assert "left out 1 run(s) made by code without HEAD~1" in res.stderr
    _made_at(new, checkout["old"])
    res = cli_runner.invoke(cli, ["report", "--require-commit", "HEAD~1"])
    assert res.exit_code == 2 and "no completed runs under" in res.stderr and "made by code with HEAD~1" in res.stderr
