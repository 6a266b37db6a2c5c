#!/usr/bin/env bash
# Session 27, call B (binary of the committed v12 kernels): anchors, the CUDA kernel tests, the LM step.
set -u
export CUDA_PATH=/usr/local/cuda
export LD_LIBRARY_PATH=$CUDA_PATH/lib64:${LD_LIBRARY_PATH:-}
export LOGLINEAR_KERNEL_CACHE=/tmp/loglinear-kernel-cache
xz -dc bin-gpu/loglinear.xz > /tmp/loglinear && chmod +x /tmp/loglinear
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv > $OUT/op-v12.txt
SECONDS=0
timeout 150 /tmp/loglinear bench op --device cuda --dtype bf16 --runs 10 --forms fused \
  --t 2048,8192,32768,131072 >> $OUT/op-v12.txt 2>&1; echo "op rc=$? ($SECONDS s)"
timeout 260 scripts/gpu-test.sh > /dev/null 2>&1; echo "gpu-test rc=$? ($SECONDS s)"
MODES=linear STEP_TIMEOUT=140 timeout 150 scripts/gpu-run.sh train-step:8192:4 > $OUT/train-step.log 2>&1
echo "train-step rc=$? ($SECONDS s)"
