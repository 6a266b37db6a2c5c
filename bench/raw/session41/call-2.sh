#!/usr/bin/env bash
# Session 41, call 2: v37x's three backward switches together — the kernel tests (tensor-core and
# half-precision), then the long anchors with them, then the forward's 64-column value tile at
# T = 32,768 × 4. Binary: bin-gpu/loglinear-v37x.xz (as call 1). LIMIT: seconds.
set -u
export CUDA_PATH=/usr/local/cuda
export LD_LIBRARY_PATH=$CUDA_PATH/lib64:${LD_LIBRARY_PATH:-}
SECONDS=0
LIMIT=${LIMIT:-560}
xz -dc bin-gpu/loglinear-v37x.xz > /tmp/ll && chmod +x /tmp/ll
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv | tee $OUT/op.txt
export LOGLINEAR_EXPERIMENT_DL_STAGED=1 LOGLINEAR_EXPERIMENT_DGAMMA_PREFETCH=1 LOGLINEAR_EXPERIMENT_ROW_VECTOR_STORES=1
OUT=/tmp/t1 timeout 200 scripts/gpu-test.sh tensor_core_kernels_match fused_takes_half_precision > $OUT/tests-all.txt 2>&1
echo "tests (all three) rc=$? ($SECONDS s)" | tee -a $OUT/tests.txt
grep -E "^test |test result|panicked|FAILED" $OUT/tests-all.txt | head -20 | tee -a $OUT/tests.txt
bench() { # label, t list, env...
  local label=$1 ts=$2; shift 2
  local left=$(( LIMIT - SECONDS - 5 )); (( left > 170 )) && left=170
  (( left > 50 )) || return
  echo "== $label T=$ts ($SECONDS s)" >> $OUT/op.txt
  env "$@" LOGLINEAR_KERNEL_CACHE=/tmp/cache timeout $left /tmp/ll bench op \
    --device cuda --dtype bf16 --runs 3 --forms fused --t $ts >> $OUT/op.txt 2>&1
  echo "bench $label rc=$? ($SECONDS s)"
}
bench all-three-long 32768,131072 X=1
bench all-three-pt64 32768 LOGLINEAR_EXPERIMENT_FORWARD_PT=64
grep -E "^==|^\| fused|correctness|rror" $OUT/op.txt
echo "done ($SECONDS s)"
