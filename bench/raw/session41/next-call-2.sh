#!/usr/bin/env bash
# For the next GPU session (written in session 41), call 2: v39x's level planes
# (`bench/raw/session41/v39x-experiment.diff` on v37; binary `bin-gpu/loglinear-v39x.xz`, kernel
# tests `bin-gpu/tests/kernels.xz` built with it). Switch (unset: v37's kernels):
#   LOGLINEAR_EXPERIMENT_LEVEL_PLANES=1  the tensor-core forward keeps each level state as two
#                                        input-dtype planes hi = E(x), lo = E(x − hi): levels read
#                                        only for the product load hi (half the bytes, stored to
#                                        shared as loaded), levels the chunk retires load both.
# First the kernel tests with the switch (tensor-core bf16 at T = 1 … 4096 in whole walks, and
# half precision), then `bench op` (its check gates each variant) v37 against the switch at the
# anchors where the forward walks whole sequences (T = 2048, 8192, 32,768), v37 again.
# LIMIT: seconds.
set -u
export CUDA_PATH=/usr/local/cuda
export LD_LIBRARY_PATH=$CUDA_PATH/lib64:${LD_LIBRARY_PATH:-}
SECONDS=0
LIMIT=${LIMIT:-560}
xz -dc bin-gpu/loglinear-v39x.xz > /tmp/ll39 && chmod +x /tmp/ll39
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv | tee $OUT/op.txt
LOGLINEAR_EXPERIMENT_LEVEL_PLANES=1 OUT=/tmp/t1 timeout 150 scripts/gpu-test.sh \
  tensor_core_kernels_match fused_takes_half_precision \
  > $OUT/tests-planes.txt 2>&1
echo "tests (planes) rc=$? ($SECONDS s)" | tee $OUT/tests.txt
grep -E "^test |test result|panicked|FAILED" $OUT/tests-planes.txt | head -20 | tee -a $OUT/tests.txt
bench() { # label, t list, env...
  local label=$1 ts=$2; shift 2
  local left=$(( LIMIT - SECONDS - 5 )); (( left > 150 )) && left=150
  (( left > 50 )) || return
  echo "== $label T=$ts ($SECONDS s)" >> $OUT/op.txt
  env "$@" LOGLINEAR_KERNEL_CACHE=/tmp/cache timeout $left /tmp/ll39 bench op \
    --device cuda --dtype bf16 --runs 3 --forms fused --t $ts >> $OUT/op.txt 2>&1
  echo "bench $label rc=$? ($SECONDS s)"
}
bench v37 2048,8192 X=1
bench planes 2048,8192 LOGLINEAR_EXPERIMENT_LEVEL_PLANES=1
bench planes-32k 32768 LOGLINEAR_EXPERIMENT_LEVEL_PLANES=1
bench v37-32k 32768 X=1
bench v37-again 2048 X=1
grep -E "^==|^\| fused|correctness|rror" $OUT/op.txt
echo "done ($SECONDS s)"
