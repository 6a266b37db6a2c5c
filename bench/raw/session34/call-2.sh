#!/usr/bin/env bash
# Session 34, call 2. "v22" = the committed kernels (v17) + v18's vector stores + v21's
# anticausal level sum (the staged forward kept: v20's register forward lost in call 1), and the
# walk planned per pass (`ops::planned_walk`: the forward keeps one walk down to one row per
# multiprocessor, the backward to two). Correctness first (the kernel tests on CUDA that cover
# the tensor-core kernels, the walks and the new mixed-walk test), then `bench op` (checks every
# form against the f64 parallel form before timing) at the four anchors, v22 then v17.
# bin-gpu/: loglinear-v17.xz, loglinear.xz (v22), tests/kernels.xz (v22), built at one commit.
set -u
export CUDA_PATH=/usr/local/cuda
export LD_LIBRARY_PATH=$CUDA_PATH/lib64:${LD_LIBRARY_PATH:-}
SECONDS=0
LIMIT=${LIMIT:-560}
xz -dc bin-gpu/loglinear-v17.xz > /tmp/ll-v17 && chmod +x /tmp/ll-v17
xz -dc bin-gpu/loglinear.xz > /tmp/ll-v22 && chmod +x /tmp/ll-v22
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv | tee $OUT/op.txt
OUT=$OUT/t1 timeout 200 scripts/gpu-test.sh tensor_core_kernels fused_passes_walk mamba2 \
  fused_over_segments fused_walks fused_takes_half > $OUT/tests.txt 2>&1
echo "tests rc=$? ($SECONDS s)"
grep -E "^test |test result|panicked|max_rel|off by" $OUT/tests.txt | head -20
go() { (( SECONDS < LIMIT - 90 )); }
bench() { # version, runs, [env...]
  local v=$1 runs=$2; shift 2
  local left=$(( LIMIT - SECONDS - 5 )); (( left > 200 )) && left=200
  echo "== $v $* ($SECONDS s)" >> $OUT/op.txt
  env "$@" LOGLINEAR_KERNEL_CACHE=/tmp/cache-$v timeout $left /tmp/ll-$v bench op --device cuda \
    --dtype bf16 --runs $runs --forms fused --t 2048,8192,32768,131072 >> $OUT/op.txt 2>&1
  echo "$v rc=$? ($SECONDS s)"
}
go && bench v22 7
go && bench v17 7
grep -E "^==|^\| fused|correctness|rror|NVIDIA" $OUT/op.txt
echo "done ($SECONDS s)"
