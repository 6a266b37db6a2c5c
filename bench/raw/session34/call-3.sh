#!/usr/bin/env bash
# Session 34, call 3 (little device time left): v22 (built from one commit) — the tensor-core and
# mixed-walk kernel tests on CUDA, then `bench op` (checked against the f64 parallel form first)
# at the four anchors. bin-gpu/: loglinear.xz (v22), tests/kernels.xz (v22).
set -u
export CUDA_PATH=/usr/local/cuda
export LD_LIBRARY_PATH=$CUDA_PATH/lib64:${LD_LIBRARY_PATH:-}
SECONDS=0
xz -dc bin-gpu/loglinear.xz > /tmp/ll-v22 && chmod +x /tmp/ll-v22
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv | tee $OUT/op.txt
OUT=$OUT/t1 timeout 75 scripts/gpu-test.sh tensor_core_kernels fused_passes_walk > $OUT/tests.txt 2>&1
echo "tests rc=$? ($SECONDS s)"
grep -E "^test |test result|panicked|max_rel" $OUT/tests.txt | head -10
timeout 110 /tmp/ll-v22 bench op --device cuda --dtype bf16 --runs 5 --forms fused \
  --t 2048,8192,32768,131072 >> $OUT/op.txt 2>&1
echo "bench rc=$? ($SECONDS s)"
grep -E "^\| fused|correctness|rror|NVIDIA" $OUT/op.txt
