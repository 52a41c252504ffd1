#!/usr/bin/env bash
# Issue 29 item 4: the seed methods on real MNIST (mnist-5k, test split, quick presets,
# 3 seeds): ε ∈ {1, 10, 100, 1000}, the same pipeline with the noise off, and the floor /
# ceiling around them (dpmean, dpmerf at every ε; gan at ε = ∞). Records go to
# results/claims (a second call skips complete cells; benchmarks/claims.py reads the same records);
# then the table and the figures of these cells only (links to them in $OUT.curve: the claims'
# other arms in results/claims would crowd the figure):
#   bench report --results results/claims.curve --layout a --dataset mnist-5k
#   README's figure: results/claims.curve.figures/mnist-5k-gen2real_cnn-vs-eps.png
# JOBS=2 (default) runs two cells at a time.
set -euo pipefail
cd "$(dirname "$0")/.."
BENCH=${BENCH:-.venv/bin/bench}
OUT=${OUT:-results/claims}
JOBS=${JOBS:-2}
common=(--dataset mnist-5k --preset quick --seeds 0,1,2 --eval gen2real_cnn,real2gen_cnn --jobs "$JOBS"
        --results "$OUT" --no-report)
"$BENCH" sweep --method dpaf,gswgan,dpac,dpgan,dpmean,dpmerf,dpsinkhorn,gan --eps 10 "${common[@]}"
printf 'noise_off: true\nmethod: [dpaf, gswgan, dpac, dpgan]\neps: [10]\n' > "$OUT.noise_off.yaml"
"$BENCH" sweep "$OUT.noise_off.yaml" "${common[@]}"
"$BENCH" sweep --method dpaf,gswgan,dpac,dpmean,dpmerf --eps 1,100,1000 "${common[@]}"
# the figures from this script's cells alone
.venv/bin/python - "$OUT" <<'PY'
import os, sys
sys.path.insert(0, "benchmarks")
import claims
out = os.path.abspath(sys.argv[1]); links = out + ".curve"
base = dict(dataset="mnist-5k", preset="quick", seeds=[0, 1, 2], eval=["gen2real_cnn", "real2gen_cnn"])
grids = [dict(base, method=["dpaf", "gswgan", "dpac", "dpgan", "dpmean", "dpmerf", "dpsinkhorn", "gan"], eps=[10]),
         dict(base, method=["dpaf", "gswgan", "dpac", "dpgan"], eps=[10], noise_off=True),
         dict(base, method=["dpaf", "gswgan", "dpac", "dpmean", "dpmerf"], eps=[1, 100, 1000])]
os.makedirs(links, exist_ok=True)
for cell in (c for g in grids for c in claims.expand(g)):
    if not os.path.lexists(os.path.join(links, cell.run_name)):
        os.symlink(os.path.join(out, cell.run_name), os.path.join(links, cell.run_name))
PY
"$BENCH" report --results "$OUT.curve" --layout a --dataset mnist-5k --figures "$OUT.curve.figures"
