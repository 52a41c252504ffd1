#!/usr/bin/env bash
# Issue 29 item 4: the seed methods on real MNIST (mnist-5k, test split, quick presets,
# 3 seeds): ε ∈ {1, 10, 100, 1000}, the same pipeline with the noise off, and the floor /
# ceiling around them (dpmean, dpmerf at every ε; gan at ε = ∞). Records go to
# results/claims (a second call skips complete cells; benchmarks/claims.py reads the same records); then the table and the figure:
#   bench report --results results/claims --layout a --dataset mnist-5k
#   bench report --results results/claims --figures benchmarks/figures
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
