#!/usr/bin/env bash
# The `long` presets on full MNIST (ε = 10; gan at ε = ∞), 3 seeds, two cells at a time, then
# their JSON records (config, env, privacy, eval: no checkpoints or samples) copied into
# benchmarks/mnist_runs/, where `make demo`'s table reads them. bench sweep skips finished cells
# and resumes interrupted ones from their checkpoints, so the script can be stopped and rerun.
#
#     bash benchmarks/mnist_long.sh                     # every method with a long preset on mnist
#     METHODS=dpgan,dpdm SEEDS=0 bash benchmarks/mnist_long.sh
#     METHODS=dpaf EPS=1,100 SEEDS=0 bash benchmarks/mnist_long.sh     # other budgets
#     METHODS=dpaf SET="gc=false" bash benchmarks/mnist_long.sh        # an ablation arm (--set, space-separated)
#
# The command line as run lands in each record's env.json, so a record says which of these it was.
set -eu
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
RUNS=${RUNS:-results/mnist_long}
OUTDIR=${OUTDIR:-benchmarks/mnist_runs}
METHODS=${METHODS:-$($PY -c "
from dpgen_bench import registry
print(','.join(m for m in registry.methods.names() if 'mnist' in getattr(registry.methods.get(m), 'presets', {}).get('long', {})))")}
if [ -z "$METHODS" ]; then
    echo "no method has a long preset on mnist" >&2
    exit 2
fi
SETS=()
for kv in ${SET:-}; do SETS+=(--set "$kv"); done
$PY -m dpgen_bench.cli sweep --method "$METHODS" --dataset mnist --eps "${EPS:-10}" --preset long \
    --seeds "${SEEDS:-0,1,2}" --jobs "${JOBS:-2}" --eval gen2real_cnn --results "$RUNS" --no-report "${SETS[@]}"
for d in "$RUNS"/*/; do
    [ -f "$d/eval.json" ] || continue
    dest="$OUTDIR/$(basename "$d")"
    mkdir -p "$dest"
    cp "$d"/config.json "$d"/env.json "$d"/privacy.json "$d"/eval.json "$dest"/
done
[ -n "${SET:-}" ] || [ "${EPS:-10}" != 10 ] || \
    $PY -m dpgen_bench.cli report --layout tiers --dataset mnist --eps 10 --results "$OUTDIR" --with-references
