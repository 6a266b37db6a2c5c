#!/usr/bin/env bash
# Session 31, call 1: v16 (the forward's output and the backward's gradients written by the
# kernels in the input dtype, dΓ summed per token by the two backward kernels) — first the
# tensor-core kernel tests on CUDA with v16, then v16 against v15 on the same card at the four
# anchors, each row its own process. bin-gpu/: loglinear-v15.xz, loglinear.xz (v16),
# tests/kernels.xz (v16).
set -u
export CUDA_PATH=/usr/local/cuda
export LD_LIBRARY_PATH=$CUDA_PATH/lib64:${LD_LIBRARY_PATH:-}
SECONDS=0
xz -dc bin-gpu/loglinear-v15.xz > /tmp/ll-v15 && chmod +x /tmp/ll-v15
xz -dc bin-gpu/loglinear.xz > /tmp/ll-v16 && chmod +x /tmp/ll-v16
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv | tee $OUT/op.txt
OUT=$OUT/tests timeout 240 scripts/gpu-test.sh tensor_core fused_takes_half vector_helpers > $OUT/tests-tc.txt 2>&1
echo "tc tests rc=$? ($SECONDS s)"; grep -E "^test |test result" $OUT/tests-tc.txt
bench() { # version, T, runs
  echo "== $1 T=$2 ($SECONDS s)" >> $OUT/op.txt
  LOGLINEAR_KERNEL_CACHE=/tmp/cache-$1 timeout 150 /tmp/ll-$1 bench op --device cuda --dtype bf16 \
    --runs $3 --forms fused --t $2 >> $OUT/op.txt 2>&1; echo "$1 T=$2 rc=$? ($SECONDS s)"
}
for t in 8192 2048 131072 32768; do
  (( SECONDS > 430 )) && { echo "T=$t skipped: time"; continue; }
  bench v16 $t 7; bench v15 $t 7
done
grep -E "^==|^\| fused|correctness|rror|NVIDIA" $OUT/op.txt
echo "done ($SECONDS s)"
