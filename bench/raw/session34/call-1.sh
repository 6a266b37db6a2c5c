#!/usr/bin/env bash
# Session 33, call 2. "v21" = session 32's code (sequences walked in segments by the kernels)
# + v18's vector stores + the forward with its products kept in mma accumulator registers
# (forward_fragments.rs) + the anticausal tensor-core kernel summing the levels it reads before
# one pair of products. Experiment-only switches (one binary, A/B on the same machine):
#   LOGLINEAR_EXPERIMENT_STAGED_FORWARD=1  the staged forward (v19's)
#   LOGLINEAR_EXPERIMENT_PER_LEVEL=1       one pair of anticausal products per level (v19's)
#   LOGLINEAR_EXPERIMENT_SCALAR_STORES=1   v18's vector stores off
# Correctness first (kernel tests on CUDA; if the tensor-core test fails, again with each new
# part switched off to tell which), then `bench op` (which checks every form against the f64
# parallel form before timing) against v17.
# bin-gpu/: loglinear-v17.xz, loglinear.xz (v21), tests/kernels.xz (v21).
set -u
export CUDA_PATH=/usr/local/cuda
export LD_LIBRARY_PATH=$CUDA_PATH/lib64:${LD_LIBRARY_PATH:-}
SECONDS=0
LIMIT=${LIMIT:-560}
xz -dc bin-gpu/loglinear-v17.xz > /tmp/ll-v17 && chmod +x /tmp/ll-v17
xz -dc bin-gpu/loglinear.xz > /tmp/ll-v21 && chmod +x /tmp/ll-v21
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv | tee $OUT/op.txt
OUT=$OUT/t1 timeout 100 scripts/gpu-test.sh tensor_core_kernels > $OUT/tests.txt 2>&1
echo "tensor-core test rc=$? ($SECONDS s)"
grep -E "^test |test result|panicked|max_rel|off by" $OUT/tests.txt | head -20
env21=()
if grep -q "tensor_core_kernels_match_reference_in_bf16 ... FAILED" $OUT/tests.txt; then
  for sw in LOGLINEAR_EXPERIMENT_STAGED_FORWARD LOGLINEAR_EXPERIMENT_PER_LEVEL; do
    env $sw=1 OUT=$OUT/t-$sw timeout 70 scripts/gpu-test.sh tensor_core_kernels > $OUT/tests-$sw.txt 2>&1
    echo "$sw=1: $(grep -E 'tensor_core_kernels_match' $OUT/tests-$sw.txt | head -1) ($SECONDS s)"
    grep -q "tensor_core_kernels_match_reference_in_bf16 ... ok" $OUT/tests-$sw.txt && env21=($sw=1)
  done
  (( ${#env21[@]} )) || env21=(LOGLINEAR_EXPERIMENT_STAGED_FORWARD=1 LOGLINEAR_EXPERIMENT_PER_LEVEL=1)
fi
OUT=$OUT/t2 timeout 80 env "${env21[@]}" scripts/gpu-test.sh mamba2 fused_over_segments fused_walks \
  fused_takes_half > $OUT/tests2.txt 2>&1
echo "other tests rc=$? ($SECONDS s)"
grep -E "^test |test result|panicked|max_rel|off by" $OUT/tests2.txt | head -20
echo "v21 env: ${env21[*]:-}"
bench() { # version, T, runs, forms, [env...]
  local v=$1 t=$2 runs=$3 forms=$4; shift 4
  local left=$(( LIMIT - SECONDS - 5 )); (( left > 80 )) && left=80
  echo "== $v T=$t $forms $* ($SECONDS s)" >> $OUT/op.txt
  env "$@" LOGLINEAR_KERNEL_CACHE=/tmp/cache-$v timeout $left /tmp/ll-$v bench op --device cuda \
    --dtype bf16 --runs $runs --forms $forms --t $t >> $OUT/op.txt 2>&1
  echo "$v T=$t $forms $* rc=$? ($SECONDS s)"
}
# In order of need, each only while LIMIT (the call's limit in seconds) leaves a minute.
go() { (( SECONDS < LIMIT - 60 )); }
go && bench v21 8192 7 fused "${env21[@]}"
go && bench v17 8192 7 fused
# The plan walks segments of 8,192 at T = 32,768 × 4 and 131,072 × 1; other lengths beside it.
go && bench v21 32768 5 fused,segmented:4096,segmented:16384 "${env21[@]}"
go && bench v21 131072 3 fused,segmented:4096,segmented:16384 "${env21[@]}"
go && bench v21 8192 7 fused LOGLINEAR_EXPERIMENT_PER_LEVEL=1 "${env21[@]}"
go && bench v21 8192 7 fused LOGLINEAR_EXPERIMENT_STAGED_FORWARD=1 "${env21[@]}"
go && bench v17 32768 5 fused
go && bench v17 131072 3 fused
grep -E "^==|^\| (fused|segmented)|correctness|check|rror|NVIDIA" $OUT/op.txt
echo "done ($SECONDS s)"
