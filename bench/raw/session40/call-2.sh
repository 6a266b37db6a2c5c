#!/usr/bin/env bash
# Session 40, call 2: v36 (v35 + the causal backward's dq in accumulator registers, dλ's row sums
# from the fragments) — its tensor-core kernel tests, then `bench op` v36 against v35 in the same
# call, then the long anchors with v36.
# bin-gpu/: loglinear-v36.xz (this session's build), loglinear-v35.xz (session 39's build of
# `f2809a6`), tests/kernels.xz (v36's). LIMIT: seconds.
set -u
export CUDA_PATH=/usr/local/cuda
export LD_LIBRARY_PATH=$CUDA_PATH/lib64:${LD_LIBRARY_PATH:-}
SECONDS=0
LIMIT=${LIMIT:-430}
for v in v36 v35; do xz -dc bin-gpu/loglinear-$v.xz > /tmp/ll-$v && chmod +x /tmp/ll-$v; done
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv | tee $OUT/op.txt
# The kernels v36 changes: tensor-core forward (mma_into) and causal backward; walks in segments
# and half-precision inputs take them too.
OUT=/tmp/t1 timeout 200 scripts/gpu-test.sh tensor_core_kernels_match fused_takes_half_precision \
    planned_segments mamba2 fused_over_segments > $OUT/tests-all.txt 2>&1
echo "tests (v36) rc=$? ($SECONDS s)" | tee -a $OUT/tests.txt
grep -E "^test |test result|panicked|FAILED" $OUT/tests-all.txt | head -20 | tee -a $OUT/tests.txt
bench() { # label, binary, t list
  local label=$1 bin=$2 ts=$3
  local left=$(( LIMIT - SECONDS - 5 )); (( left > 115 )) && left=115
  (( left > 45 )) || return
  echo "== $label T=$ts ($SECONDS s)" >> $OUT/op.txt
  LOGLINEAR_KERNEL_CACHE=/tmp/cache-$bin timeout $left /tmp/ll-$bin bench op \
    --device cuda --dtype bf16 --runs 3 --forms fused --t $ts >> $OUT/op.txt 2>&1
  echo "bench $label rc=$? ($SECONDS s)"
}
bench v36 v36 2048,8192
bench v35 v35 2048,8192
bench v36-long v36 32768,131072
grep -E "^==|^\| fused|correctness|rror" $OUT/op.txt
echo "done ($SECONDS s)"
