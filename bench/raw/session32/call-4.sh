#!/usr/bin/env bash
# Session 32, call 4: the kernel tests of the segment walk on CUDA (the fixed v19 test binary):
# f32 scalar segments and bf16 tensor-core segments against f64, the planned walk of
# Form::Fused at T = 8192 with one head, the tensor-core cases; then, as time allows, the
# benchmarks of call 3 that it did not reach.
set -u
export CUDA_PATH=/usr/local/cuda
export LD_LIBRARY_PATH=$CUDA_PATH/lib64:${LD_LIBRARY_PATH:-}
SECONDS=0
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv | tee $OUT/op.txt
OUT=$OUT/t1 timeout 420 scripts/gpu-test.sh fused_over_segments fused_walks tensor_core \
  fused_takes_half > $OUT/tests.txt 2>&1
rc=$?; echo "tests rc=$rc ($SECONDS s)"; grep -E "^test |test result|panicked|max_rel" $OUT/tests.txt | head -40
echo "done ($SECONDS s)"
