#!/usr/bin/env bash
# Session 31, call 4: T = 32,768 with B = 4 (192 rows of B·H, 1.45 rows per multiprocessor) is the
# slowest anchor per token (v17: 110 ms forward+backward on the H100 against 58 at T = 8192); the
# segment plan leaves it in one launch (rows ≥ multiprocessors). Are aligned segments faster
# there? v17, one process, the forms side by side.
set -u
export CUDA_PATH=/usr/local/cuda
export LD_LIBRARY_PATH=$CUDA_PATH/lib64:${LD_LIBRARY_PATH:-}
SECONDS=0
xz -dc bin-gpu/loglinear.xz > /tmp/ll-v17 && chmod +x /tmp/ll-v17
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv | tee $OUT/op.txt
LOGLINEAR_KERNEL_CACHE=/tmp/cache-v17 timeout 300 /tmp/ll-v17 bench op --device cuda --dtype bf16 \
  --runs 5 --forms fused,segmented:16384,segmented:8192,segmented:4096 --t 32768 >> $OUT/op.txt 2>&1
echo "rc=$? ($SECONDS s)"
grep -E "^\| |correctness|rror|NVIDIA" $OUT/op.txt
echo "done ($SECONDS s)"
