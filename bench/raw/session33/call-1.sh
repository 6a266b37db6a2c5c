#!/usr/bin/env bash
# Session 33, call 1. "v20" = session 32's code (sequences walked in segments by the kernels,
# segments.rs) + v18's vector stores + the forward with its products kept in mma accumulator
# registers (forward_fragments.rs), with three experiment-only switches:
# LOGLINEAR_EXPERIMENT_STAGED_FORWARD=1 (the staged forward kernel, i.e. v19),
# LOGLINEAR_EXPERIMENT_SCALAR_STORES=1 (v18's stores off), LOGLINEAR_EXPERIMENT_PT=N.
# Correctness first (the kernel tests on CUDA: tensor-core forward in bf16 at T = 1 … 32,768,
# Mamba-2 on tensor cores, the segment walks, half precision), then `bench op` (which checks every
# form against the f64 parallel form before timing) against v17.
# bin-gpu/: loglinear-v17.xz, loglinear.xz (v20), tests/kernels.xz (v20).
set -u
export CUDA_PATH=/usr/local/cuda
export LD_LIBRARY_PATH=$CUDA_PATH/lib64:${LD_LIBRARY_PATH:-}
SECONDS=0
xz -dc bin-gpu/loglinear-v17.xz > /tmp/ll-v17 && chmod +x /tmp/ll-v17
xz -dc bin-gpu/loglinear.xz > /tmp/ll-v20 && chmod +x /tmp/ll-v20
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv | tee $OUT/op.txt
OUT=$OUT/t1 timeout 200 scripts/gpu-test.sh tensor_core mamba2 fused_over_segments fused_walks \
  fused_takes_half > $OUT/tests.txt 2>&1
rc=$?; echo "tests rc=$rc ($SECONDS s)"; grep -E "^test |test result|panicked|max_rel|off by" $OUT/tests.txt | head -40
# With a failing fragments forward, time the staged one as v20 (v19) rather than nothing.
v20env=()
grep -q "tensor_core_kernels_match_reference_in_bf16 ... ok" $OUT/tests.txt ||
  v20env=(LOGLINEAR_EXPERIMENT_STAGED_FORWARD=1)
echo "v20 env: ${v20env[*]:-}"
bench() { # version, T, runs, forms, [env...]
  local v=$1 t=$2 runs=$3 forms=$4; shift 4
  echo "== $v T=$t $forms $* ($SECONDS s)" >> $OUT/op.txt
  env "$@" LOGLINEAR_KERNEL_CACHE=/tmp/cache-$v timeout 110 /tmp/ll-$v bench op --device cuda \
    --dtype bf16 --runs $runs --forms $forms --t $t >> $OUT/op.txt 2>&1
  echo "$v T=$t $* rc=$? ($SECONDS s)"
}
bench v20 8192 7 fused "${v20env[@]}"
bench v20 8192 7 fused LOGLINEAR_EXPERIMENT_STAGED_FORWARD=1
bench v17 8192 7 fused
# The plan walks segments of 8,192 at T = 32,768 × 4 and 131,072 × 1; other lengths beside it.
bench v20 32768 5 fused,segmented:4096,segmented:16384 "${v20env[@]}"
bench v17 32768 5 fused
bench v20 131072 3 fused,segmented:4096,segmented:16384 "${v20env[@]}"
bench v17 131072 3 fused
(( SECONDS < 470 )) && bench v20 2048 7 fused "${v20env[@]}"
(( SECONDS < 470 )) && bench v17 2048 7 fused
(( SECONDS < 500 )) && bench v20 8192 7 fused LOGLINEAR_EXPERIMENT_SCALAR_STORES=1 "${v20env[@]}"
grep -E "^==|^\| (fused|segmented)|correctness|check|rror|NVIDIA" $OUT/op.txt
echo "done ($SECONDS s)"
