#!/usr/bin/env bash
# Session 41, call 3: v37 (v35 + v37x's three backward changes, switches gone) against v38x's
# two switches (`bench/raw/session41/v38x-experiment.diff` on v37):
#   LOGLINEAR_EXPERIMENT_WEIGHT_BLOCKS=1  the tensor-core weight loops visit only the 32-column
#                                         blocks the products and the dλ butterfly read
#   LOGLINEAR_EXPERIMENT_LEVEL_PAIRS=1    the anticausal backward sums its later chunks' level
#                                         states two at a time, both loads before the adds
# `bench op`'s check (o and every gradient against f64 at two shapes) gates each variant; the
# tensor-core and half-precision kernel tests with both switches run before the single switches.
# LIMIT: seconds.
set -u
export CUDA_PATH=/usr/local/cuda
export LD_LIBRARY_PATH=$CUDA_PATH/lib64:${LD_LIBRARY_PATH:-}
SECONDS=0
LIMIT=${LIMIT:-450}
xz -dc bin-gpu/loglinear-v38x.xz > /tmp/ll && chmod +x /tmp/ll
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv | tee $OUT/op.txt
bench() { # label, t list, env...
  local label=$1 ts=$2; shift 2
  local left=$(( LIMIT - SECONDS - 5 )); (( left > 150 )) && left=150
  (( left > 50 )) || return
  echo "== $label T=$ts ($SECONDS s)" >> $OUT/op.txt
  env "$@" LOGLINEAR_KERNEL_CACHE=/tmp/cache timeout $left /tmp/ll bench op \
    --device cuda --dtype bf16 --runs 3 --forms fused --t $ts >> $OUT/op.txt 2>&1
  echo "bench $label rc=$? ($SECONDS s)"
}
bench v37 2048,8192 X=1
bench both 2048,8192 LOGLINEAR_EXPERIMENT_WEIGHT_BLOCKS=1 LOGLINEAR_EXPERIMENT_LEVEL_PAIRS=1
left=$(( LIMIT - SECONDS - 5 )); (( left > 120 )) && left=120
if (( left > 60 )); then
  LOGLINEAR_EXPERIMENT_WEIGHT_BLOCKS=1 LOGLINEAR_EXPERIMENT_LEVEL_PAIRS=1 OUT=/tmp/t1 \
    timeout $left scripts/gpu-test.sh tensor_core_kernels_match fused_takes_half_precision \
    > $OUT/tests-both.txt 2>&1
  echo "tests (both) rc=$? ($SECONDS s)" | tee -a $OUT/tests.txt
  grep -E "^test |test result|panicked|FAILED" $OUT/tests-both.txt | head -20 | tee -a $OUT/tests.txt
fi
bench weight-blocks 2048 LOGLINEAR_EXPERIMENT_WEIGHT_BLOCKS=1
bench level-pairs 2048 LOGLINEAR_EXPERIMENT_LEVEL_PAIRS=1
grep -E "^==|^\| fused|correctness|rror" $OUT/op.txt
echo "done ($SECONDS s)"
