#!/usr/bin/env bash
# The utility-privacy curve of the quick presets on real MNIST, test split, gen2real CNN:
#
# - DATASET=mnist-5k (default): the seed methods, 3 seeds, ε ∈ {1, 10, 100, 1000}, the same
#   pipeline with the noise off, and the floor / ceiling around them (dpmean, dpmerf at every
#   ε; gan at ε = ∞), with real2gen CNN too.
# - DATASET=mnist: the methods that learn in a minute (dpmean, dpmerf, dpntk, dpkernel) and gan,
#   3 seeds, ε ∈ {1, 10, 100}; the seed methods, dpdm and dpsinkhorn at seed 0 only (at chance,
#   a diagnostic), with the noise off too. gen2real CNN only: the cells are CLAIMS.md's where
#   they coincide (about 15 minutes of 2 cores beyond the claims' cells).
#
# Records go to results/claims (a second call skips complete cells; bench claims reads the
# same records); then the table and the figures of these cells only (links to them in
# $OUT.curve-$DATASET: the claims' other arms in results/claims would crowd the figure):
#   bench report --results results/claims.curve-mnist-5k --layout eps-rows --dataset mnist-5k
#   results/claims.curve-$DATASET.figures/$DATASET-gen2real_cnn-vs-eps.png
# JOBS=2 (default) runs two cells at a time.
set -euo pipefail
cd "$(dirname "$0")/.."
BENCH=${BENCH:-.venv/bin/bench}
OUT=${OUT:-results/claims}
JOBS=${JOBS:-2}
DATASET=${DATASET:-mnist-5k}
# The grids, written once: the sweeps run them, and the figure's links are their cells.
grid() { printf 'dataset: %s\npreset: quick\n%s\n' "$DATASET" "$2" > "$OUT.$DATASET.$1.yaml"
         echo "$OUT.$DATASET.$1.yaml"; }
case "$DATASET" in
mnist-5k)
    three=$'seeds: [0, 1, 2]\neval: [gen2real_cnn, real2gen_cnn]'
    grids=("$(grid eps10 "$three"$'\nmethod: [dpaf, gswgan, dpac, dpgan, dpmean, dpmerf, dpsinkhorn, gan]\neps: [10]')"
           "$(grid noise_off "$three"$'\nnoise_off: true\nmethod: [dpaf, gswgan, dpac, dpgan]\neps: [10]')"
           "$(grid eps_more "$three"$'\nmethod: [dpaf, gswgan, dpac, dpmean, dpmerf]\neps: [1, 100, 1000]')") ;;
mnist)
    grids=("$(grid learners $'seeds: [0, 1, 2]\neval: [gen2real_cnn]\nmethod: [dpmean, dpmerf, dpntk, dpkernel, gan]\neps: [1, 10, 100]')"
           "$(grid chance $'seeds: [0]\neval: [gen2real_cnn]\nmethod: [dpgan, dpaf, gswgan, dpac, dpdm, dpsinkhorn]\neps: [1, 10, 100]')"
           "$(grid noise_off $'seeds: [0]\neval: [gen2real_cnn]\nnoise_off: true\nmethod: [dpgan, dpaf, gswgan, dpac, dpdm, dpsinkhorn]\neps: [10]')") ;;
*)
    echo "DATASET must be mnist-5k or mnist" >&2; exit 2 ;;
esac
for g in "${grids[@]}"; do
    "$BENCH" sweep "$g" --jobs "$JOBS" --results "$OUT" --no-report
done
# the figures from this script's cells alone
.venv/bin/python - "$OUT" "$DATASET" "${grids[@]}" <<'PY'
import os, sys
from dpgen_bench.config import load_config_file
from dpgen_bench.sweep import expand
out = os.path.abspath(sys.argv[1]); links = f"{out}.curve-{sys.argv[2]}"
os.makedirs(links, exist_ok=True)
for name in os.listdir(links):  # rebuilt: cells of earlier presets (run names hash the settings) leave
    if os.path.islink(os.path.join(links, name)):
        os.remove(os.path.join(links, name))
for name in {c.run_name for g in sys.argv[3:] for c in expand(load_config_file(g))}:
    os.symlink(os.path.join(out, name), os.path.join(links, name))
PY
"$BENCH" report --results "$OUT.curve-$DATASET" --layout eps-rows --dataset "$DATASET" \
    --figures "$OUT.curve-$DATASET.figures"
