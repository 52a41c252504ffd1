#!/usr/bin/env bash
# DPAF on mnist, one thing at a time (validation split, ε = 10, seed 0, the `long` preset): which
# part's noise makes the generator collapse, against the same pipeline without noise. Each arm is
# one `bench run` into results/dpaf_parts/ARM (resumed if interrupted, skipped if finished), JOBS
# at a time; then benchmarks/dpaf_gap.py reads every finished arm (within-class spread, D̂'s AUC)
# and the JSON records are copied to benchmarks/mnist_val_runs/dpaf-parts-ARM.
#
#     bash benchmarks/dpaf_parts.sh                  # every arm below
#     ARMS="clip2 clip2-noiseoff" bash benchmarks/dpaf_parts.sh
set -u
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
RUNS=${RUNS:-results/dpaf_parts}
CLIP2="--set max_grad_norm_conv2=0.02"  # conv2*'s measured median norm at initialisation: 0.015 (presets.md)
declare -A ARGS=(
    [base]=""
    [clip2]="$CLIP2"
    [clip2-noiseoff]="$CLIP2 --noise-off"
    [clip2-only-conv1]="$CLIP2 --noise-off-part conv2 --noise-off-part dpagg"
    [clip2-only-conv2]="$CLIP2 --noise-off-part conv1 --noise-off-part dpagg"
    [clip2-only-dpagg]="$CLIP2 --noise-off-part conv1 --noise-off-part conv2"
    [clip2-aggregate]="$CLIP2 --set g_loss=aggregate"
    [clip2-label002]="$CLIP2 --set d_label_std=0.02"
)
ARMS=${ARMS:-"clip2 clip2-noiseoff clip2-only-conv2 clip2-only-dpagg clip2-only-conv1"}
one() {
    local arm=$1 dir=$RUNS/$1
    if [ -f "$dir/eval.json" ]; then return 0; fi
    if [ -f "$dir/resume.pt" ]; then
        $PY -m dpgen_bench.cli run --resume "$dir" > /dev/null 2> "$dir.log"
    else
        mkdir -p "$RUNS"
        # shellcheck disable=SC2086
        $PY -m dpgen_bench.cli run -m dpaf -d mnist --preset long --eps 10 --seed 0 --eval-split val \
            --eval gen2real_cnn ${ARGS[$arm]} --out "$dir" > /dev/null 2> "$dir.log"
    fi
}
running=0
for arm in $ARMS; do
    one "$arm" &
    running=$((running + 1))
    if [ "$running" -ge "${JOBS:-2}" ]; then wait -n; running=$((running - 1)); fi
done
wait
for arm in $ARMS; do
    d=$RUNS/$arm
    [ -f "$d/eval.json" ] || continue
    dest=benchmarks/mnist_val_runs/dpaf-parts-$arm
    mkdir -p "$dest"
    cp "$d"/config.json "$d"/env.json "$d"/privacy.json "$d"/eval.json "$dest"/
    [ -f "$dest/gap.json" ] || $PY benchmarks/dpaf_gap.py "$d" > "$dest/gap.json"
done
