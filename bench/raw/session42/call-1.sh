#!/usr/bin/env bash
# Session 42, call 1: v39x's level planes and v40x's level 0 in registers, switches on v37
# (`bench/raw/session42/v40x-experiment.diff` = session 41's v39x diff + v40x; binary
# `bin-gpu/loglinear-v40x.xz`, kernel tests `bin-gpu/tests/kernels.xz` built with it). Switches
# (both unset: v37's kernels):
#   LOGLINEAR_EXPERIMENT_LEVEL_PLANES=1  the tensor-core forward keeps each level state as two
#                                        input-dtype planes hi = E(x), lo = E(x − hi): levels read
#                                        only for the product load hi, levels retired load both.
#   LOGLINEAR_EXPERIMENT_LEVEL0_HELD=1   the tensor-core forward keeps level 0 (an even chunk's
#                                        key state, read and retired by the next chunk) in the
#                                        carry's registers instead of writing and reading it.
#   LOGLINEAR_EXPERIMENT_LEVEL0_HELD_BWD=1  the same in the causal tensor-core backward.
# First the tensor-core and half-precision kernel tests with all three, then `bench op` (its
# check gates each variant) v37, all three, held, planes at T = 2048 and 8192, held with the
# backward's at 2048.
# LIMIT: seconds.
set -u
export CUDA_PATH=/usr/local/cuda
export LD_LIBRARY_PATH=$CUDA_PATH/lib64:${LD_LIBRARY_PATH:-}
SECONDS=0
LIMIT=${LIMIT:-560}
xz -dc bin-gpu/loglinear-v40x.xz > /tmp/ll && chmod +x /tmp/ll
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv | tee $OUT/op.txt
tests() { # label, env...
  local label=$1; shift
  env "$@" OUT=/tmp/t-$label timeout 130 scripts/gpu-test.sh \
    tensor_core_kernels_match fused_takes_half_precision > $OUT/tests-$label.txt 2>&1
  echo "tests ($label) rc=$? ($SECONDS s)" | tee -a $OUT/tests.txt
  grep -E "^test |test result|panicked|FAILED" $OUT/tests-$label.txt | head -20 | tee -a $OUT/tests.txt
}
ALL="LOGLINEAR_EXPERIMENT_LEVEL0_HELD=1 LOGLINEAR_EXPERIMENT_LEVEL_PLANES=1 LOGLINEAR_EXPERIMENT_LEVEL0_HELD_BWD=1"
tests all $ALL
bench() { # label, t list, env...
  local label=$1 ts=$2; shift 2
  local left=$(( LIMIT - SECONDS - 5 )); (( left > 150 )) && left=150
  (( left > 40 )) || return
  echo "== $label T=$ts ($SECONDS s)" >> $OUT/op.txt
  env "$@" LOGLINEAR_KERNEL_CACHE=/tmp/cache timeout $left /tmp/ll bench op \
    --device cuda --dtype bf16 --runs 3 --forms fused --t $ts >> $OUT/op.txt 2>&1
  echo "bench $label rc=$? ($SECONDS s)"
}
bench v37 2048,8192 X=1
bench all 2048,8192 $ALL
bench held 2048,8192 LOGLINEAR_EXPERIMENT_LEVEL0_HELD=1
bench planes 2048,8192 LOGLINEAR_EXPERIMENT_LEVEL_PLANES=1
bench held+bwd 2048 LOGLINEAR_EXPERIMENT_LEVEL0_HELD=1 LOGLINEAR_EXPERIMENT_LEVEL0_HELD_BWD=1
grep -E "^==|^\| fused|correctness|rror" $OUT/op.txt
echo "done ($SECONDS s)"
