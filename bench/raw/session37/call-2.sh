#!/usr/bin/env bash
# Session 37, call 2: v28p = HEAD + session 36's v27-port.diff + v28-level-weights.diff (the
# level epilogues of the forward and causal backward read one precomputed weight per row).
# v27-port has all three v27 changes without switches, so v28p is compared with v27x at its
# defaults (all three on): the difference is the level-weights change alone. Then v27x without
# the triangle weights (call 1's winner) at the long anchors.
# bin-gpu/: loglinear-v27x.xz, loglinear-v28p.xz, tests/kernels.xz (v28p).
set -u
export CUDA_PATH=/usr/local/cuda
export LD_LIBRARY_PATH=$CUDA_PATH/lib64:${LD_LIBRARY_PATH:-}
SECONDS=0
LIMIT=${LIMIT:-420}
xz -dc bin-gpu/loglinear-v27x.xz > /tmp/ll-v27x && chmod +x /tmp/ll-v27x
xz -dc bin-gpu/loglinear-v28p.xz > /tmp/ll-v28p && chmod +x /tmp/ll-v28p
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv | tee $OUT/op.txt
OUT=$OUT/t1 timeout 100 scripts/gpu-test.sh tensor_core_kernels fused_passes_walk \
  > $OUT/tests.txt 2>&1
echo "tests rc=$? ($SECONDS s)"
grep -E "^test |test result|panicked|max_rel|off by" $OUT/tests.txt | head -20
bench() { # label, binary, runs, T list, env...
  local label=$1 bin=$2 runs=$3 t=$4; shift 4
  local left=$(( LIMIT - SECONDS - 5 )); (( left > 150 )) && left=150
  echo "== $label T=$t ($SECONDS s)" >> $OUT/op.txt
  env "$@" LOGLINEAR_KERNEL_CACHE=/tmp/cache-$bin timeout $left /tmp/ll-$bin bench op \
    --device cuda --dtype bf16 --runs $runs --forms fused --t $t >> $OUT/op.txt 2>&1
  echo "$label T=$t rc=$? ($SECONDS s)"
}
go() { (( SECONDS < LIMIT - ${1:-60} )); }
if grep -q "tensor_core_kernels_match_reference_in_bf16 ... ok" $OUT/tests.txt; then
  go && bench v28p v28p 3 2048,8192 X=1
  go && bench v27x v27x 3 2048,8192 X=1
fi
go && bench v27x-full-weights v27x 3 32768,131072 LOGLINEAR_EXPERIMENT_FULL_WEIGHTS=1
grep -E "^==|^\| fused|correctness|rror|NVIDIA" $OUT/op.txt
echo "done ($SECONDS s)"
