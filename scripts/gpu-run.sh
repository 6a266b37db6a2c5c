#!/usr/bin/env bash
# Runs on the GPU machine: scripts/gpu-run.sh STEP... where STEP is one of
#   smoke | profile | profile-fwd | commands | kernels | op | op-check | train-fused | train-forms | commands-lm | op-long | op-chunked | train | train-short
#   | train-long | train-32k | decode
#   | mqar-timing | train-cold:LEVEL | train-modes:LEVEL:T:B | train-step:T:B | pack-alone | pack-grid:STEPS | grid:T[:STEPS]
#   | sweep:CONFIG:JOBS[:SET,SET...] | resume:CONFIG | lm-viz:NAME | none | lm-eval:NAME | op-gdn | gemm | cache-save | cold-compile | pack-profile
#   | dp-check:CONFIG:STEPS | dp-bench:T:B   (two GPUs: nvidia-h200-x2) | mps-probe | op-segments
# MPS=1 runs every step under CUDA's Multi-Process Service (see mps_start).
# bin-gpu/loglinear.xz is built by scripts/build-gpu.sh and carried over; results go to $OUT.
set -uo pipefail
export CUDA_PATH=${CUDA_PATH:-/usr/local/cuda}
export LD_LIBRARY_PATH=$CUDA_PATH/lib64:${LD_LIBRARY_PATH:-}
out=${OUT:-/tmp/out}
# Compiled kernels persist across the processes of this call (see src/kernel_cache.rs).
export LOGLINEAR_KERNEL_CACHE=${LOGLINEAR_KERNEL_CACHE:-/tmp/loglinear-kernel-cache}
mkdir -p "$out"
# A kernel cache carried in bin-gpu/kernel-cache.tar.xz (brought back by `cache-save` from an
# earlier machine, or the H200 archive kept in git history: scripts/kernel-cache.sh) spares a
# fresh machine its first-process compilation (≈ 30 s); the cold-start steps (train-cold:*) use
# their own empty cache folders. Without one, the first process compiles.
cache_archive=bin-gpu/kernel-cache.tar.xz
if [[ -f $cache_archive && ! -d $LOGLINEAR_KERNEL_CACHE ]]; then
    mkdir -p "$LOGLINEAR_KERNEL_CACHE" && tar xJf "$cache_archive" -C "$LOGLINEAR_KERNEL_CACHE"
    echo "kernel cache restored from $cache_archive: $(du -sh "$LOGLINEAR_KERNEL_CACHE" | cut -f1)"
fi
bin=/tmp/loglinear
[[ -x $bin ]] || { xz -dc bin-gpu/loglinear.xz > $bin && chmod +x $bin; }
step() { echo; echo "=== $* ($(date +%T)) ==="; }
# CUDA's Multi-Process Service: with its daemon running, the kernels of several processes share
# the GPU at once instead of taking turns by time slice (without it, 15 small LM runs together
# trained slower than one alone: session 11). `mps_start` is a no-op where the daemon is missing;
# its pipe and log folders are under /tmp so that no root-owned default is needed. The daemon
# leaves the GPU's settings alone and ends with this script (trap).
mps_start() {
    command -v nvidia-cuda-mps-control >/dev/null || { echo "MPS: nvidia-cuda-mps-control not found"; return 1; }
    export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
    mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
    nvidia-cuda-mps-control -d && sleep 1 && echo "MPS daemon started" && trap mps_stop EXIT
}
mps_stop() {
    [[ -n ${CUDA_MPS_PIPE_DIRECTORY:-} ]] || return 0
    echo quit | nvidia-cuda-mps-control 2>/dev/null; sleep 1
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
    echo "MPS daemon stopped"
}
[[ ${MPS:-0} == 1 ]] && mps_start
# A device call may run 10 minutes: every step's timeout is cut to what is left of
# $BUDGET seconds (default 560) from the script's start.
budget=${BUDGET:-560}
left() { local rem=$((budget - SECONDS)); (( rem < 5 )) && rem=5; echo $(( rem < $1 ? rem : $1 )); }
for s in "$@"; do
case "$s" in
smoke)
    step smoke
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    /usr/bin/time -f "%e s" timeout 300 $bin train experiments/mqar_tiny.toml --device cuda --out /tmp/tiny 2>&1 | tail -3
    ;;
kernels)
    step "fused kernel checks"
    timeout ${KERNELS_TIMEOUT:-240} $bin bench kernels --device cuda 2>&1 | tee "$out/bench_kernels.txt"
    ;;
train-short)
    step "bench train T=512 batch 64 (bf16, fused)"
    timeout 110 $bin bench train --device cuda --runs 3 --modes linear,mlp_softplus,ones 2>&1 | tee "$out/bench_train_fused.txt"
    ;;
train-fused)
    step "bench train T=512 batch 64 (bf16, fused), λ linear"
    timeout 80 $bin bench train --device cuda --runs 3 --form fused --modes linear 2>&1 | tee "$out/bench_train_fused_512.txt"
    ;;
commands-lm)
    step "eval, viz and generate on --device cuda"
    d=/tmp/cmds; mkdir -p $d
    timeout 60 $bin train experiments/mqar_tiny.toml --device cuda --out $d/tiny --set train.steps=20 2>&1 | tail -1
    timeout 40 $bin eval $d/tiny --device cuda 2>&1 | tail -1
    timeout 40 $bin viz $d/tiny --out $d/viz --device cuda 2>&1 | tail -1
    timeout 60 $bin train experiments/lm_cpu.toml --device cuda --out $d/lm --set model.lambda=mlp_softplus --set seed=0 --set train.steps=20 --set eval.every=20 2>&1 | tail -1
    timeout 40 $bin generate --run $d/lm --prompt "The state of the union" --max-tokens 20 --device cuda 2>&1 | tail -2
    ;;
profile)
    # Where the fused kernels' time goes: Nsight Compute's speed-of-light, occupancy and warp
    # stall sections for one launch of each kernel at T = 8192 (skipped where ncu is missing).
    step "ncu profile of the fused kernels, bf16, T = 8192"
    ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
    if [[ -z $ncu ]]; then echo "ncu not found"; ls /usr/local/cuda/bin | head -50; else
        timeout 240 $ncu --target-processes all -k regex:ausal --launch-count 10 \
            --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats \
            --section MemoryWorkloadAnalysis \
            $bin bench op --device cuda --dtype bf16 --runs 1 --forms fused --t 8192 2>&1 \
            | grep -v "^==PROF==" | tee "$out/ncu_fused.txt" | tail -150
    fi
    ;;
profile-fwd)
    step "ncu, forward kernel only, bf16, T = 8192"
    ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -n 1)
    [[ -n $ncu ]] && timeout 120 $ncu -k regex:causal_tc --launch-skip 2 --launch-count 1 \
        --section SpeedOfLight --section WarpStateStats --section Occupancy \
        $bin bench op --device cuda --dtype bf16 --runs 1 --forms fused --t 8192 2>&1 \
        | grep -v "^==PROF==" | tee "$out/ncu_fwd.txt" | grep -E "Duration|Throughput|stalled|Warp Cycles|Achieved Occ"
    ;;
op-check)
    step "bench op bf16, fused (tensor cores fwd and bwd)"
    timeout 200 $bin bench op --device cuda --dtype bf16 --runs 5 --forms fused,chunked --t 2048,8192,32768 2>&1 | tee "$out/bench_op_fused_split.txt"
    ;;
train-forms)
    for f in chunked fused; do
        step "bench train T=512 batch 64 (bf16, $f)"
        timeout 120 $bin bench train --device cuda --runs 5 --form $f --modes linear,mlp_softplus 2>&1 | tee "$out/bench_train_512_$f.txt"
    done
    ;;
op-segments)
    # The sequence-parallel form (Form::Segmented: segments as batch rows for the kernels, one
    # state per segment for the pairs across them) against one launch over the whole sequence
    # (fused), bf16, the anchors' H = 48, N = 128, P = 64 at B·T = 131,072 ($OP_LENGTHS, default
    # T = 8192 (B = 16), 32,768 (4), 131,072 (1)), segments of $SEGMENTS tokens.
    step "bench op bf16 over segments: $(echo ${SEGMENTS:-2048 8192})"
    forms=fused
    for sg in ${SEGMENTS:-2048 8192}; do forms+=,segmented:$sg; done
    timeout $(left ${OP_TIMEOUT:-300}) $bin bench op --device cuda --dtype bf16 --runs 5 --forms $forms \
        --t ${OP_LENGTHS:-8192,32768,131072} 2>&1 | grep -v "Fastest result" | tee "$out/bench_op_segments.txt"
    ;;
op-long)
    step "bench op bf16, fused, T = 32768 (B = 4) and 131072 (B = 1), λ learned and ≡ 1"
    timeout 300 $bin bench op --device cuda --dtype bf16 --runs 5 --forms fused --t 32768,131072 --lambda-one 2>&1 | tee "$out/bench_op_fused_long.txt"
    ;;
op-chunked)
    step "bench op bf16, chunked tensor form"
    timeout 150 $bin bench op --device cuda --dtype bf16 --runs 5 --forms chunked --t 2048,8192,32768 2>&1 | tee "$out/bench_op_chunked_bf16.txt"
    ;;
train-32k)
    step "bench train T=32768 batch 1 (bf16, fused), λ modes"
    timeout 200 $bin bench train --device cuda --runs 3 --seq-len 32768 --batch 1 --form fused --modes linear,mlp_softplus,ones 2>&1 | tee "$out/bench_train_32k.txt"
    step "bench train T=32768 batch 1, softmax Transformer"
    timeout 120 $bin bench train --device cuda --runs 3 --seq-len 32768 --batch 1 --modes transformer 2>&1 | tail -5 | tee "$out/bench_train_32k_transformer.txt"
    ;;
commands)
    step "every command on --device cuda"
    d=/tmp/cmds; rm -rf $d; mkdir -p $d
    timeout 120 $bin train experiments/mqar_tiny.toml --device cuda --out $d/tiny --set train.steps=40 2>&1 | tail -1
    timeout 60 $bin eval $d/tiny --device cuda 2>&1 | tail -1
    timeout 60 $bin viz $d/tiny --out $d/viz --device cuda 2>&1 | tail -1; ls $d/viz | head -3
    timeout 200 $bin sweep experiments/demo.toml --device cuda --jobs 2 --out $d/sweep --set train.steps=20 2>&1 | tail -3
    timeout 120 $bin train experiments/lm_cpu.toml --device cuda --out $d/lm --set model.lambda=mlp_softplus --set seed=0 --set train.steps=20 --set eval.every=20 2>&1 | tail -1
    timeout 60 $bin generate --run $d/lm --prompt "The state of the union" --max-tokens 20 --device cuda 2>&1 | tail -2
    timeout 60 $bin bench decode --device cuda --contexts 1024 --steps 5 2>&1 | tail -2
    timeout 100 $bin demo --device cuda --out $d/demo 2>&1 | tail -4
    ;;
train-long)
    step "bench train T=8192 batch 4"
    timeout 250 $bin bench train --device cuda --runs 3 --seq-len 8192 --batch 4 2>&1 | tee "$out/bench_train_8k.txt"
    ;;
op)
    step "bench op bf16 (anchors' dtype), fused and chunked"
    timeout 240 $bin bench op --device cuda --dtype bf16 --runs 10 --forms fused,chunked 2>&1 | tee "$out/bench_op_bf16.txt"
    step "bench op f32, fused, λ learned and ≡ 1"
    timeout 120 $bin bench op --device cuda --dtype f32 --runs 10 --forms fused --lambda-one 2>&1 | tee "$out/bench_op_f32.txt"
    ;;
train)
    step "bench train"
    timeout 250 $bin bench train --device cuda --runs 3 2>&1 | tee "$out/bench_train.txt"
    ;;
decode)
    step "bench decode"
    timeout 150 $bin bench decode --device cuda --contexts 1024,16384,65536 --steps 10 2>&1 | tee "$out/bench_decode.txt"
    ;;
mqar-timing)
    step "MQAR T=256 K=32 timing, 300 steps"
    /usr/bin/time -f "%e s" timeout 300 $bin train experiments/mqar_paper_sweep.toml --device cuda --out /tmp/mt \
        --set model.lambda=mlp_softplus --set task.seq_len=256 --set task.num_kv_pairs=32 --set seed=0 \
        --set train.steps=300 --set eval.every=100 2>&1 | tail -2
    grep -h tokens_per_s /tmp/mt/metrics.jsonl | tail -2
    ;;
sweep:*)
    IFS=: read -r _ config jobs sets <<< "$s"
    name=$(basename "$config" .toml)
    args=()
    IFS=, read -ra kv <<< "${sets:-}"
    for x in "${kv[@]}"; do [[ -n $x ]] && args+=(--set "$x"); done
    step "sweep $config, $jobs jobs ${args[*]}"
    timeout "${SWEEP_TIMEOUT:-540}" $bin sweep "$config" --device cuda --jobs "$jobs" --out "/tmp/sweeps/$name" "${args[@]}" 2>&1 | tail -40
    (cd /tmp/sweeps && tar czf "$out/$name.tgz" --exclude='*.safetensors' --exclude='*.bpk' "$name")
    ;;
lm-eval:*)
    # Whole-split validation perplexity of every run of a sweep directory.
    dir=/tmp/sweeps/${s#lm-eval:}
    step "whole-split evaluation of $dir"
    for r in "$dir"/*/; do
        timeout 60 $bin eval "$r" --device cuda --set task.max_eval_windows=1000000 2>&1 | tail -1
    done | tee "$out/$(basename "$dir")_eval.txt"
    ;;
train-cold:*)
    # A cold process (empty kernel and autotune cache) at one autotune level: wall time to the
    # first step, then the step time, with the CPU loss-curve check first.
    level=${s#train-cold:}
    step "bench train T=512 batch 64, λ linear, cold cache, autotune $level"
    rm -rf /tmp/cache-$level
    /usr/bin/time -f "process wall %e s" env LOGLINEAR_AUTOTUNE_LEVEL=$level LOGLINEAR_KERNEL_CACHE=/tmp/cache-$level \
        LOGLINEAR_COMPILE_LOG=/tmp/compile-$level.log \
        timeout $(left ${COLD_TIMEOUT:-420}) $bin bench train --device cuda --runs 10 --modes linear --profile 3 \
        ${NO_CHECK:+--no-check} 2>&1 \
        | tee "$out/train_cold_$level.txt" | grep -v "Fastest result" | grep -E "^check|^\| (log|trans|\*\*)|^profiled|rror|panic|wall"
    echo "autotune decisions printed: $(grep -c "Fastest result" "$out/train_cold_$level.txt")"
    if [[ -f /tmp/compile-$level.log ]]; then
        echo "kernels compiled: $(grep -c 'Compiling kernel' /tmp/compile-$level.log); most compiled:"
        grep -o 'Compiling kernel.*' /tmp/compile-$level.log | sort | uniq -c | sort -rn | head -12
        cp /tmp/compile-$level.log "$out/"
    fi
    # The default level's cache serves the later steps of this call (and cache-save).
    [[ $level == minimal ]] && mkdir -p "$LOGLINEAR_KERNEL_CACHE" && cp -r /tmp/cache-$level/. "$LOGLINEAR_KERNEL_CACHE"/
    ;;
train-step:*)
    # The LM step (D = 512, 6 layers, bf16) at T × B for the λ modes in $MODES (default linear,
    # mlp_softplus), warm cache: the loss-curve check against the CPU first, then 10 timed steps
    # and a kernel profile of 3 more. $FORM: the op's form (default auto; e.g. segmented:1024).
    IFS=: read -r _ len batch <<< "$s"
    form=${FORM:-auto}
    step "bench train T=$len batch $batch, ${MODES:-linear,mlp_softplus}, form $form, with the check and a profile"
    timeout $(left ${STEP_TIMEOUT:-300}) $bin bench train --device cuda --runs 10 --seq-len $len --batch $batch \
        --modes ${MODES:-linear,mlp_softplus} --form $form --profile 3 2>&1 | grep -v "Fastest result" \
        | tee "$out/train_step_${len}x${batch}_$(tr , _ <<< "${MODES:-linear,mlp_softplus}")_${form/:/}.txt" \
        | grep -E "^check|^\| (log|trans)|^profiled|rror|panic"
    ;;
train-modes:*)
    # Every λ mode and the Transformer at one setting, warm cache of the given autotune level.
    IFS=: read -r _ level len batch <<< "$s"
    step "bench train T=$len batch $batch, all modes, autotune $level"
    cache=/tmp/cache-$level; [[ $level == minimal ]] && cache=$LOGLINEAR_KERNEL_CACHE
    LOGLINEAR_AUTOTUNE_LEVEL=$level LOGLINEAR_KERNEL_CACHE=$cache \
        timeout $(left ${MODES_TIMEOUT:-400}) $bin bench train --device cuda --runs 10 --seq-len $len --batch $batch --no-check \
        --modes ${MODES:-linear,mlp_softplus,ones,transformer} 2>&1 \
        | grep -v "Fastest result" | tee "$out/train_${len}x${batch}_${level}_$(tr , _ <<< "${MODES:-all}").txt" | grep -E "^\| (log|trans)|rror|panic"
    ;;
pack-alone)
    # One MQAR run alone vs 24 runs of the same shape as one pack (T = 256, K ∈ {4..32}, 3 seeds,
    # both MLP λ modes), no early stop, core op $FORM (default auto = the chunked form in f32).
    # A short run of each first fills the kernel cache (a cold process compiles for minutes);
    # the figures are the steady tokens/s of the metrics' last lines and the wall times.
    form=${FORM:-auto}
    sed 's/^early_stop_acc = .*/early_stop_acc = false/' experiments/mqar_paper_sweep.toml > /tmp/grid.toml
    sed 's/^"model.lambda" = .*/"model.lambda" = ["mlp_softplus", "mlp_softmax"]/' /tmp/grid.toml > /tmp/mlp.toml
    one=(--set task.seq_len=256 --set model.lambda=mlp_softplus --set task.num_kv_pairs=32 --set seed=0)
    # WARM=0 skips the short warm-up runs where the carried kernel cache already holds these shapes.
    phases="warm timed"; [[ ${WARM:-1} == 0 ]] && phases=timed
    for w in $phases; do
        steps=$([[ $w == warm ]] && echo 20 || echo 300)
        rm -rf /tmp/alone /tmp/pack24
        step "$w: one run alone, T=256, K=32, $steps steps, form $form"
        /usr/bin/time -f "alone wall %e s" timeout $(left 200) $bin sweep /tmp/grid.toml --device cuda --out /tmp/alone \
            --set train.steps=$steps --set model.form=$form "${one[@]}" 2>&1 | grep -E "wall|error" | tee -a "$out/pack_alone.txt"
        step "$w: 24 runs as one pack, T=256, $steps steps, form $form"
        /usr/bin/time -f "pack of 24 wall %e s" timeout $(left 300) $bin sweep /tmp/mlp.toml --device cuda --out /tmp/pack24 \
            --set train.steps=$steps --set task.seq_len=256 --set model.form=$form 2>&1 \
            | grep -iE "wall|error|pack 1|packing" | cut -c1-200 | tee -a "$out/pack_alone.txt"
    done
    echo "steady tokens/s (last log line) — alone: $(tail -n 3 /tmp/alone/*/metrics.jsonl | grep -o '"tokens_per_s":[0-9.]*' | tail -1)"
    echo "per replica in the pack: $(cat /tmp/pack24/*/metrics.jsonl | grep '"step":300' | grep -o '"tokens_per_s":[0-9.]*' | head -3 | tr '\n' ' ')"
    (cd /tmp && tar czf "$out/pack24.tgz" --exclude='*.safetensors' pack24 alone)
    ;;
pack-grid:*)
    # The published MQAR grid (72 runs, T ∈ {256, 512}) as packs, STEPS steps, no early stop.
    steps=${s#pack-grid:}
    sed 's/^early_stop_acc = .*/early_stop_acc = false/' experiments/mqar_paper_sweep.toml > /tmp/grid.toml
    step "the published MQAR grid, 72 runs, $steps steps each, packed"
    rm -rf /tmp/grid
    /usr/bin/time -f "grid wall %e s" timeout $(left 540) $bin sweep /tmp/grid.toml --device cuda --out /tmp/grid \
        --set train.steps=$steps 2>&1 | grep -E "wall|error|pack|FAILED" | tee "$out/pack_grid.txt"
    (cd /tmp && tar czf "$out/grid.tgz" --exclude='*.safetensors' grid)
    ;;
grid:*)
    # The published MQAR grid (T ∈ {256, 512} × 3 λ modes × K ∈ {4..32} × 3 seeds, 5,000 steps,
    # no early stop) one sequence length per call: `grid:T[:STEPS]` trains the 36 runs of T as
    # packs (λ linear / MLP), $JOBS (default 2) at a time. A call cut short resumes in the next:
    # the runs' folders come back as grid-T-*.tar parts (checkpoints included, best models of
    # K = 32 only) and, put in bin-gpu/ and carried, are restored before the sweep (finished
    # runs are skipped, the others resume from their last checkpoint).
    # SEEDS="3, 4, 5" replaces the seed axis (more seeds of the same 72-run grid).
    IFS=: read -r _ len steps <<< "$s"
    steps=${steps:-5000}
    sed 's/^early_stop_acc = .*/early_stop_acc = false/' experiments/mqar_paper_sweep.toml |
        sed "s/^seed = \[.*\]/seed = [${SEEDS:-0, 1, 2}]/" > /tmp/grid.toml
    grep '^seed = \[' /tmp/grid.toml
    dir=/tmp/grid/T$len; mkdir -p /tmp/grid
    shopt -s nullglob
    parts=(bin-gpu/grid-$len-*.tar)
    if (( ${#parts[@]} )); then
        cat "${parts[@]}" | tar xf - -C /tmp/grid
        echo "restored $(ls -d $dir/*/ | wc -l) runs of T = $len from ${#parts[@]} carried parts"
    fi
    step "the published MQAR grid at T = $len: 36 runs, $steps steps, packed, ${JOBS:-2} packs at a time"
    /usr/bin/time -f "grid T=$len wall %e s" timeout $(left ${GRID_TIMEOUT:-540}) $bin sweep /tmp/grid.toml \
        --device cuda --out "$dir" --jobs "${JOBS:-2}" --set train.steps=$steps --set task.seq_len=$len \
        --set train.checkpoint_every=250 2>&1 | grep -v "holds no run yet" | cut -c1-220 \
        | grep -vE "^\s*$" | tail -60 | tee "$out/grid_T$len.txt"
    # Metrics of every run (small) and the state to resume from, in parts of ≤ 15 MiB.
    (cd /tmp/grid && tar czf "$out/grid-T$len-metrics.tgz" --exclude='*.safetensors' --exclude='*.bpk' "T$len")
    (cd /tmp/grid && find "T$len" -type f ! -path '*/best/*' -o -type f -path '*num_kv_pairs=32*/best/*' \
        | tar cf - -T - | split -b 15m -d - "$out/grid-$len-" --additional-suffix=.tar)
    ls -la "$out"/grid-$len-*.tar
    ;;
resume:*)
    # A sweep that may outlast one call: `resume:CONFIG`, with $JOBS packs at a time (default 2),
    # $PACK runs per pack (default: the sweep's own choice) and $SETS (`;`-separated --set
    # values). Runs carried in bin-gpu/parts/NAME-state-*.tar (this step's parts from an earlier
    # call) are restored first: finished runs are skipped, the others resume from their last
    # checkpoint. Back: NAME-metrics.tgz (every run without its model files) and the state to
    # resume from in parts NAME-state-NN.tar.xz (each unfinished run's last checkpoint, no
    # best/: ≈ 0.75 MB a run of the paper's MQAR model, ≈ 60 % of it after xz; pieces of 15 MiB
    # before compression), ready to carry into the next call as they come back: compressed here,
    # on the GPU machine's cores, since the next call must start within the warm machine's idle
    # time. The step takes uncompressed NAME-state-NN.tar alike. $OUT also gets NAME.txt (the
    # log's tail).
    config=${s#resume:}
    name=$(basename "$config" .toml)
    dir=/tmp/sweeps/$name; mkdir -p /tmp/sweeps
    shopt -s nullglob
    # NAME-state-NN.tar or, compressed to fit a call's carry, NAME-state-NN.tar.xz: the pieces
    # of one tar stream, in the order of NN.
    parts=(bin-gpu/parts/$name-state-*.tar bin-gpu/parts/$name-state-*.tar.xz)
    # A warm machine that ran this sweep in an earlier call still has its newest state in
    # $dir; the carried parts are older (the call's files come back after it), so they are
    # not restored over it.
    if [[ -d $dir ]] && (( ${#parts[@]} )); then
        echo "$dir exists (a warm machine): its state is newer than the ${#parts[@]} carried parts, which are left unused"
        parts=()
    fi
    if (( ${#parts[@]} )); then
        for p in $(printf '%s\n' "${parts[@]}" | sort); do
            if [[ $p == *.xz ]]; then xz -dc "$p"; else cat "$p"; fi
        done | tar xf - -C /tmp/sweeps
        echo "restored $(ls -d "$dir"/*/ | wc -l) runs of $name from ${#parts[@]} carried parts"
    fi
    args=(--jobs "${JOBS:-2}")
    [[ -n ${PACK:-} ]] && args+=(--pack "$PACK")
    IFS=';' read -ra kv <<< "${SETS:-}"
    for x in "${kv[@]}"; do [[ -n $x ]] && args+=(--set "$x"); done
    step "sweep $config, resumable, ${args[*]}"
    /usr/bin/time -f "sweep $name wall %e s" timeout $(left ${RESUME_TIMEOUT:-540}) $bin sweep "$config" \
        --device cuda --out "$dir" "${args[@]}" 2>&1 | grep -v "holds no run yet" | cut -c1-220 \
        | grep -vE "^\s*$" | tail -60 | tee "$out/$name.txt"
    (cd /tmp/sweeps && tar czf "$out/$name-metrics.tgz" --exclude='*.safetensors' --exclude='*.bpk' \
        --exclude='checkpoints' --exclude='best' "$name")
    # Per run: everything but best/ and the checkpoints, and for a run that has not finished the
    # checkpoint `latest` names (a finished run is skipped by the next call: its summary is all
    # it needs). With RESUME_STATE=finished (language models: a checkpoint is ≈ 370 MB at
    # D = 256), only the finished runs: the next call starts the others anew. A device call
    # returns at most 8 files of 16 MiB: the parts are 15 MiB.
    (cd /tmp/sweeps && for r in "$name"/*/; do
        r=${r%/}
        if [[ ${RESUME_STATE:-open} == finished ]]; then
            [[ -f $r/summary.json ]] && find "$r" -path "$r/best" -prune -o -path "$r/checkpoints" -prune -o -type f -print
            continue
        fi
        find "$r" -path "$r/best" -prune -o -path "$r/checkpoints" -prune -o -type f -print
        if [[ ! -f $r/summary.json && -f $r/checkpoints/latest ]]; then
            echo "$r/checkpoints/latest"
            find "$r/checkpoints/$(cat "$r/checkpoints/latest")" -type f
        fi
    done | tar cf - -T - | split -b 15m -d - "$out/$name-state-" --additional-suffix=.tar)
    for p in "$out/$name"-state-*.tar; do xz -T0 -6 "$p"; done
    ls -la "$out"/$name-*
    ;;
cold-compile)
    # What a cold process spends before its first step: a small LM (D = 128, 2 layers,
    # T = 256 × 8) from an empty cache; wall time, kernels compiled, the step time. (Session 7
    # measured NVRTC's precompiled headers and keeping its CUBIN here too: no gain; the patch's
    # switches for them were deleted, their figures are in bench/RESULTS.md.)
    rm -rf /tmp/cold-small /tmp/compile-small.log
    step "cold small LM"
    /usr/bin/time -f "process wall %e s" env LOGLINEAR_KERNEL_CACHE=/tmp/cold-small \
        LOGLINEAR_COMPILE_LOG=/tmp/compile-small.log LOGLINEAR_AUTOTUNE_LOG=0 \
        timeout $(left ${COLD_TIMEOUT:-300}) $bin bench train --device cuda --d-model 128 --layers 2 \
        --seq-len 256 --batch 8 --runs 3 --modes linear --no-check > "$out/cold_compile.log" 2>&1
    grep -E "^\| log|wall|rror|panic" "$out/cold_compile.log"
    echo "kernels compiled: $(grep -c 'Compiling kernel' /tmp/compile-small.log 2>/dev/null)"
    ;;
pack-profile)
    # Where a pack step's time goes: 24 MQAR runs (T = 256, both MLP λ modes × K × 3 seeds) as
    # one pack, kernel by kernel over pack steps 100..110 (host work of the step included).
    form=${FORM:-auto}
    sed 's/^early_stop_acc = .*/early_stop_acc = false/' experiments/mqar_paper_sweep.toml |
        sed 's/^"model.lambda" = .*/"model.lambda" = ["mlp_softplus", "mlp_softmax"]/' > /tmp/mlp.toml
    rm -rf /tmp/packprof
    step "profile of a pack of 24, T=256, form $form"
    LOGLINEAR_PROFILE_PACK=100:10 timeout $(left 300) $bin sweep /tmp/mlp.toml --device cuda --out /tmp/packprof \
        --set train.steps=111 --set task.seq_len=256 --set model.form=$form --set eval.every=1000 2>&1 \
        | grep -v "Fastest result" | grep -E "^\||profile|pack|error" | tee "$out/pack_profile_$form.txt"
    ;;
gemm)
    # The LM's products (layers, tied head, their backward shapes) through linalg::matmul
    # (cuBLAS) and Burn's matmul (CubeCL, autotuned on first use), bf16.
    step "bench gemm, the LM's products, bf16"
    timeout $(left ${GEMM_TIMEOUT:-240}) $bin bench gemm --device cuda 2>&1 \
        | grep -v "Fastest result\|Tuning:\|^ - \|Short circ" | tee "$out/bench_gemm.txt"
    ;;
op-gdn)
    # The Gated DeltaNet op (chunked tensor form, bf16 inputs computed in f32) at the published
    # H-GDN head shape (H = 6, N = 192, P = 384), beside the Mamba-2 op's anchors.
    step "bench op --variant gdn, H=6 N=192 P=384, bf16"
    timeout $(left ${GDN_TIMEOUT:-200}) $bin bench op --variant gdn --device cuda --dtype bf16 --runs 5 \
        --heads 6 --n 192 --p 384 --t 2048,8192 --tokens 32768 2>&1 | tee "$out/bench_op_gdn.txt"
    ;;
cache-save)
    # The kernel and autotune cache of this machine, compressed, for the next fresh machine.
    step "kernel cache: $(du -sh "$LOGLINEAR_KERNEL_CACHE" 2>/dev/null | cut -f1)"
    tar cf - -C "$LOGLINEAR_KERNEL_CACHE" . | xz -T0 -6 > "$out/kernel-cache.tar.xz"
    ls -la "$out/kernel-cache.tar.xz"
    ;;
none) ;;  # only the set-up above: the binary unpacked, the kernel cache restored
lm-viz:*)
    # λ of the seed-$VIZ_SEED (default 0) run of every λ mode of a language-model sweep folder,
    # and the λ statistics of every run that has its model here, one archive:
    # lm-viz:NAME, from /tmp/sweeps/NAME. Two held-out sequences (a D = 256 model's lambda.csv
    # holds samples × T × layers × heads × levels rows) and PNGs only: session 11's archive of
    # every file (57 a run) exceeded the 16 MiB a returned file may have.
    name=${s#lm-viz:}
    step "λ of the seed-${VIZ_SEED:-0} runs of $name"
    rm -rf "/tmp/viz-$name"; mkdir -p "/tmp/viz-$name"
    for r in /tmp/sweeps/$name/*seed=${VIZ_SEED:-0}/; do
        [[ -d $r/best ]] || continue
        r=${r%/}
        timeout $(left 60) $bin viz "$r" --samples 2 --out "/tmp/viz-$name/$(basename "$r")" \
            --device cuda 2>&1 | tail -1
    done
    # The λ statistics (lambda_per_level.csv: mean and quantiles per layer and level) of every run.
    for r in /tmp/sweeps/$name/*/; do
        r=${r%/}
        [[ -f $r/config.toml && -d $r/best ]] || continue
        timeout $(left 30) $bin viz "$r" --stats-only --out "/tmp/viz-$name/stats/$(basename "$r")" \
            --device cuda 2>&1 | tail -1
    done
    find "/tmp/viz-$name" -name '*.svg' -delete
    (cd /tmp && tar czf "$out/viz-$name.tgz" "viz-$name")
    ls -la "$out/viz-$name.tgz"
    ;;
dp-check:*)
    # Data-parallel training (issue 18) against one device: CONFIG for STEPS steps on cuda:0,
    # then on cuda:0,cuda:1 with the same global batch and seed; the loss and gradient norm of
    # every step compared (bf16 tolerance 2e-2); the two-device run itself checks its replicas'
    # weights bit for bit after its first step and at its checkpoints. LM configs need the
    # prepared corpus carried (data/sotu/prepared).
    IFS=: read -r _ config steps <<< "$s"
    step "data-parallel check: $config, $steps steps, cuda:0 against cuda:0,cuda:1"
    source scripts/nccl-env.sh
    for devs in cuda:0 cuda:0,cuda:1; do
        timeout $(left 300) $bin train "$config" --device $devs --out "/tmp/dp-$devs" --overwrite \
            --set train.steps=$steps --set train.log_every=1 --set train.checkpoint_every=$steps \
            --set eval.every=$steps 2>&1 | tail -2
    done
    python3 - /tmp/dp-cuda:0/metrics.jsonl /tmp/dp-cuda:0,cuda:1/metrics.jsonl <<'PY' | tee "$out/dp_check.txt"
import json, sys
def rows(path):
    return {m["step"]: m for m in map(json.loads, open(path)) if "loss" in m}
one, two = rows(sys.argv[1]), rows(sys.argv[2])
worst = max((abs(one[s][k] - two[s][k]) / max(abs(one[s][k]), 1e-6), s, k)
            for s in one if s in two for k in ("loss", "grad_norm"))
print(f"steps: {len(one)} on one device, {len(two)} on two; worst relative difference "
      f"{worst[0]:.2e} ({worst[2]} at step {worst[1]}); tolerance 2e-2: "
      f"{'PASS' if worst[0] <= 2e-2 and len(one) == len(two) else 'FAIL'}")
PY
    ;;
dp-bench:*)
    # The data-parallel step (issue 18) on cuda:0 alone and on cuda:0,cuda:1, T × B per device,
    # for the λ modes in $MODES (default linear).
    IFS=: read -r _ len batch <<< "$s"
    step "data-parallel bench train T=$len, $batch rows per device, ${MODES:-linear}"
    source scripts/nccl-env.sh
    timeout $(left 300) $bin bench train --device cuda:0,cuda:1 --seq-len $len --batch $batch \
        --modes ${MODES:-linear} --runs 10 2>&1 | grep -v "Fastest result" \
        | tee "$out/dp_bench_${len}x${batch}.txt" | grep -E "^\| |identical|rror|panic"
    ;;
mps-probe)
    # Unpacked runs (language models) side by side: N processes of the D = 256 LM step (the
    # lm_sotu_d256 recipe's shape: T = 512 × 8, λ linear) at once, first by time slice, then
    # under MPS; each process's tokens/s and their sum against one process alone.
    probe() {
        local n=$1 tag=$2 i
        for i in $(seq "$n"); do
            timeout $(left 120) $bin bench train --device cuda --d-model 256 --layers 6 --seq-len 512 \
                --batch 8 --runs ${PROBE_RUNS:-40} --no-check --modes linear > "/tmp/probe-$tag-$n-$i.txt" 2>&1 &
        done
        wait
        local rates
        rates=$(grep -h "^| log-linear" /tmp/probe-$tag-$n-*.txt | awk -F'|' '{gsub(/ /,"",$4); print $4}')
        echo "$tag, $n processes: tokens/s each: $(echo $rates | tr '\n' ' '); total $(echo "$rates" | awk '{s+=$1} END {print s}')"
        cat /tmp/probe-$tag-$n-*.txt >> "$out/mps_probe.txt"
    }
    step "unpacked LM runs side by side: time slices, then MPS"
    for n in ${PROBE_COUNTS:-1 4}; do probe "$n" slices; done
    if mps_start; then
        for n in ${PROBE_COUNTS_MPS:-1 4 8 13}; do probe "$n" mps; done
        mps_stop
    fi
    ;;
*) echo "unknown step $s" ;;
esac
done
