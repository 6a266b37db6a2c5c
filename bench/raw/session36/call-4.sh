#!/usr/bin/env bash
# Session 36, call 4: "v27x" = HEAD + bench/raw/session36/v27-experiment.diff, three changes to
# the tensor-core kernels (forward and both backward kernels), each but the first with an
# experiment switch:
#  1. a chunk ends with a cube barrier instead of `sync_storage` (CUDA's `__syncthreads` already
#     orders a cube's global writes for its own later reads; the device-scope fence was 3 % of
#     the forward's stall samples);
#  2. dead level states are dropped from L2 with `discard.global.L2` (the levels a chunk retires,
#     every level when the walk ends) so that L2 does not write them back to DRAM
#     (LOGLINEAR_EXPERIMENT_NO_DISCARD=1: off);
#  3. the in-chunk weights are computed only on the 32-column runs that meet the triangle the
#     products read (96 of 128 runs at C = 64), one plane per run, with `ex2.approx` for the
#     decays (LOGLINEAR_EXPERIMENT_FULL_WEIGHTS=1: every element with `exp`, as v24).
# Correctness first (v27x's kernel tests on CUDA; if the tensor-core test fails, again with each
# switch to tell which change), then `bench op` at T = 2048 and 8192: v27x, v24, v27x without 3,
# v27x without 2 and 3; then the long anchors for v27x and v24.
# bin-gpu/: loglinear.xz (v24), loglinear-v27x.xz, tests/kernels.xz (v27x).
set -u
export CUDA_PATH=/usr/local/cuda
export LD_LIBRARY_PATH=$CUDA_PATH/lib64:${LD_LIBRARY_PATH:-}
SECONDS=0
LIMIT=${LIMIT:-430}
xz -dc bin-gpu/loglinear.xz > /tmp/ll-v24 && chmod +x /tmp/ll-v24
xz -dc bin-gpu/loglinear-v27x.xz > /tmp/ll-v27x && chmod +x /tmp/ll-v27x
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv | tee $OUT/op.txt
OUT=$OUT/t1 timeout 150 scripts/gpu-test.sh tensor_core_kernels mamba2 fused_over_segments \
  fused_passes_walk > $OUT/tests.txt 2>&1
echo "tests rc=$? ($SECONDS s)"
grep -E "^test |test result|panicked|max_rel|off by" $OUT/tests.txt | head -20
ok=1
if ! grep -q "tensor_core_kernels_match_reference_in_bf16 ... ok" $OUT/tests.txt; then
  ok=0
  for sw in LOGLINEAR_EXPERIMENT_FULL_WEIGHTS LOGLINEAR_EXPERIMENT_NO_DISCARD; do
    env $sw=1 OUT=$OUT/t-$sw timeout 60 scripts/gpu-test.sh tensor_core_kernels \
      > $OUT/tests-$sw.txt 2>&1
    echo "tensor-core test with $sw=1: rc=$? ($SECONDS s)"
  done
fi
bench() { # label, binary, runs, T list, env...
  local label=$1 bin=$2 runs=$3 t=$4; shift 4
  local left=$(( LIMIT - SECONDS - 5 )); (( left > 150 )) && left=150
  echo "== $label T=$t ($SECONDS s)" >> $OUT/op.txt
  env "$@" LOGLINEAR_KERNEL_CACHE=/tmp/cache-$bin timeout $left /tmp/ll-$bin bench op \
    --device cuda --dtype bf16 --runs $runs --forms fused --t $t >> $OUT/op.txt 2>&1
  echo "$label T=$t rc=$? ($SECONDS s)"
}
go() { (( SECONDS < LIMIT - ${1:-60} )); }
if (( ok )); then
  go && bench v27x v27x 5 2048,8192 X=1
  go && bench v24 v24 5 2048,8192 X=1
  go && bench v27x-full-weights v27x 5 2048,8192 LOGLINEAR_EXPERIMENT_FULL_WEIGHTS=1
  go && bench v27x v27x 3 32768,131072 X=1
  go && bench v24 v24 3 32768,131072 X=1
  go && bench v27x-barrier-only v27x 5 2048,8192 LOGLINEAR_EXPERIMENT_FULL_WEIGHTS=1 \
    LOGLINEAR_EXPERIMENT_NO_DISCARD=1
fi
grep -E "^==|^\| fused|correctness|rror|NVIDIA" $OUT/op.txt
echo "done ($SECONDS s)"
