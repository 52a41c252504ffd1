#!/usr/bin/env bash
# The seed methods on real MNIST (mnist-5k, test split, quick presets,
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
# The three grids, written once: the sweeps run them, and the figure's links are their cells.
grid() { printf 'dataset: mnist-5k\npreset: quick\nseeds: [0, 1, 2]\neval: [gen2real_cnn, real2gen_cnn]\n%s\n' "$2" \
           > "$OUT.$1.yaml"; echo "$OUT.$1.yaml"; }
grids=("$(grid eps10 $'method: [dpaf, gswgan, dpac, dpgan, dpmean, dpmerf, dpsinkhorn, gan]\neps: [10]')"
       "$(grid noise_off $'noise_off: true\nmethod: [dpaf, gswgan, dpac, dpgan]\neps: [10]')"
       "$(grid eps_more $'method: [dpaf, gswgan, dpac, dpmean, dpmerf]\neps: [1, 100, 1000]')")
for g in "${grids[@]}"; do
    "$BENCH" sweep "$g" --jobs "$JOBS" --results "$OUT" --no-report
done
# the figures from this script's cells alone
.venv/bin/python - "$OUT" "${grids[@]}" <<'PY'
import os, sys
from dpgen_bench.config import load_config_file
from dpgen_bench.sweep import expand
out = os.path.abspath(sys.argv[1]); links = out + ".curve"
os.makedirs(links, exist_ok=True)
for name in os.listdir(links):  # rebuilt: cells of earlier presets (run names hash the settings) leave
    if os.path.islink(os.path.join(links, name)):
        os.remove(os.path.join(links, name))
for name in {c.run_name for g in sys.argv[2:] for c in expand(load_config_file(g))}:
    os.symlink(os.path.join(out, name), os.path.join(links, name))
PY
"$BENCH" report --results "$OUT.curve" --layout a --dataset mnist-5k --figures "$OUT.curve.figures"
