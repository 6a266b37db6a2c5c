#!/usr/bin/env bash
# Session 36, call 5: call-4.sh cut to what a short call holds (the session's device time ran
# low after failed starts): v27x's tensor-core and mixed-walk kernel tests on CUDA, then
# `bench op` at T = 2048 and 8192 (3 runs) for v27x and v24, then v27x without change 3.
# bin-gpu/: loglinear.xz (v24), loglinear-v27x.xz, tests/kernels.xz (v27x).
set -u
export CUDA_PATH=/usr/local/cuda
export LD_LIBRARY_PATH=$CUDA_PATH/lib64:${LD_LIBRARY_PATH:-}
SECONDS=0
LIMIT=${LIMIT:-190}
xz -dc bin-gpu/loglinear.xz > /tmp/ll-v24 && chmod +x /tmp/ll-v24
xz -dc bin-gpu/loglinear-v27x.xz > /tmp/ll-v27x && chmod +x /tmp/ll-v27x
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv | tee $OUT/op.txt
OUT=$OUT/t1 timeout 90 scripts/gpu-test.sh tensor_core_kernels fused_passes_walk \
  > $OUT/tests.txt 2>&1
echo "tests rc=$? ($SECONDS s)"
grep -E "^test |test result|panicked|max_rel|off by" $OUT/tests.txt | head -20
bench() { # label, binary, runs, T list, env...
  local label=$1 bin=$2 runs=$3 t=$4; shift 4
  local left=$(( LIMIT - SECONDS - 3 )); (( left > 120 )) && left=120
  echo "== $label T=$t ($SECONDS s)" >> $OUT/op.txt
  env "$@" LOGLINEAR_KERNEL_CACHE=/tmp/cache-$bin timeout $left /tmp/ll-$bin bench op \
    --device cuda --dtype bf16 --runs $runs --forms fused --t $t >> $OUT/op.txt 2>&1
  echo "$label T=$t rc=$? ($SECONDS s)"
}
go() { (( SECONDS < LIMIT - ${1:-40} )); }
if grep -q "tensor_core_kernels_match_reference_in_bf16 ... ok" $OUT/tests.txt; then
  go && bench v27x v27x 3 2048,8192 X=1
  go && bench v24 v24 3 2048,8192 X=1
  go && bench v27x-full-weights v27x 3 2048,8192 LOGLINEAR_EXPERIMENT_FULL_WEIGHTS=1
fi
grep -E "^==|^\| fused|correctness|rror|NVIDIA" $OUT/op.txt
echo "done ($SECONDS s)"
