#!/usr/bin/env bash
# Session 38, call 4: v32 = v30 + the causal backward's row-owner level epilogues (v31y's
# `bwd` variant without switches; the forward unchanged) — the commit's own CUDA build.
#  1. The tensor-core, Mamba-2, segment, planned-segment, mixed-walk and half-precision kernel
#     tests with v32's test binary.
#  2. `bench op` at T = 2048, 8192: v32, then v30 (v31y's binary with its switches unset: v30's
#     kernels), then v32 again if time is left.
#  3. The rest of the kernel suite if time is left.
# bin-gpu/: loglinear-v32.xz, loglinear-v31y.xz, tests/kernels.xz (v32). At most eight files
# under $OUT. LIMIT: seconds.
set -u
export CUDA_PATH=/usr/local/cuda
export LD_LIBRARY_PATH=$CUDA_PATH/lib64:${LD_LIBRARY_PATH:-}
SECONDS=0
LIMIT=${LIMIT:-350}
xz -dc bin-gpu/loglinear-v32.xz > /tmp/ll-v32 && chmod +x /tmp/ll-v32
xz -dc bin-gpu/loglinear-v31y.xz > /tmp/ll-v30 && chmod +x /tmp/ll-v30
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv | tee $OUT/op.txt
OUT=/tmp/t1 timeout 130 scripts/gpu-test.sh tensor_core_kernels mamba2 fused_over_segments \
  fused_passes_walk fused_walks_long fused_takes_half > $OUT/tests.txt 2>&1
echo "tests rc=$? ($SECONDS s)"
grep -E "^test |test result|panicked" $OUT/tests.txt | head -20
bench() { # label, binary
  local left=$(( LIMIT - SECONDS - 5 )); (( left > 110 )) && left=110
  (( left > 40 )) || return
  echo "== $1 ($SECONDS s)" >> $OUT/op.txt
  LOGLINEAR_KERNEL_CACHE=/tmp/cache-$2 timeout $left /tmp/ll-$2 bench op --device cuda \
    --dtype bf16 --runs 3 --forms fused --t 2048,8192 >> $OUT/op.txt 2>&1
  echo "bench $1 rc=$? ($SECONDS s)"
}
if grep -q "tensor_core_kernels_match_reference_in_bf16 ... ok" $OUT/tests.txt; then
  bench v32 v32
  bench v30 v30
  bench v32-again v32
fi
grep -E "^==|^\| fused|correctness|rror" $OUT/op.txt
if (( SECONDS < LIMIT - 140 )); then
  OUT=/tmp/t2 timeout $(( LIMIT - SECONDS - 5 )) scripts/gpu-test.sh --skip tensor_core_kernels \
    --skip mamba2 --skip fused_over_segments --skip fused_passes_walk --skip fused_walks_long \
    --skip fused_takes_half > $OUT/tests-rest.txt 2>&1
  echo "rest of the suite rc=$? ($SECONDS s)"
  grep -E "test result|panicked|FAILED" $OUT/tests-rest.txt | head
fi
echo "done ($SECONDS s)"
