"""benchmarks/n_d.py: the n_D sweep's table reads the right records and keeps the reading."""

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _module():
    spec = importlib.util.spec_from_file_location("n_d_script", ROOT / "benchmarks" / "n_d.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _run(root, name, n_d, steps, split, seed, acc, beta=0.95, **extra):
    d = root / name
    d.mkdir(parents=True)
    cfg = {"method": "dpgan", "dataset": "digits", "epsilon": 10.0, "preset": "quick", "seed": seed,
           "members": None, "eval_split": split,
           "hparams": {"n_d": n_d, "steps": steps, "batch_size": 64, "adaptive_beta": beta}, **extra}
    (d / "config.json").write_text(json.dumps(cfg))
    (d / "eval.json").write_text(json.dumps({"metrics": {"gen2real_cnn": acc, "real2gen_cnn": acc}}))
    rows = [{"d_step": s, "g_step": s // (n_d if isinstance(n_d, int) else 5), "n_d_next": 2,
             "d_fake_acc_ema": 0.5} for s in (10, steps)]
    (d / "train.jsonl").write_text("\n".join(json.dumps(r) for r in rows))


def test_table_groups_by_arm_budget_and_split(tmp_path):
    mod = _module()
    for seed, acc in enumerate([0.6, 0.7, 0.8]):
        _run(tmp_path, f"a{seed}", 1, 1500, "val", seed, acc)
    _run(tmp_path, "b", "adaptive", 6000, "test", 0, 0.3, beta=0.99)
    _run(tmp_path, "c", 1, 1500, "val", 0, 0.1, epsilon=1.0)  # another ε: not this sweep
    _run(tmp_path, "d", 1, 1500, "val", 1, 0.1, members=64)  # a membership run: not this sweep
    mod.RESULTS = [tmp_path]
    recs = mod.records()
    assert sorted(recs) == [("1", 1500, "val"), (mod.BETA_ARM, 6000, "test")]
    table = mod.table(recs)
    assert "| 1 | 1,500 | 0.700 ± 0.100 |" in table
    assert "0.300 (n=1)" in table and table.count("\n") == 1 + len(mod.ARMS) * len(mod.STEPS)
    mod.figure(recs, tmp_path / "f.png")
    assert (tmp_path / "f.png").stat().st_size > 0
