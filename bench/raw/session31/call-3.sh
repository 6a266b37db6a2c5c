#!/usr/bin/env bash
# Session 31, call 3: v17 against v16 at T = 131,072 and 32,768 (call 2 ran out of time), then
# every kernel of one v17 forward+backward at T = 8192 timed by ncu (where the time goes now).
set -u
export CUDA_PATH=/usr/local/cuda
export LD_LIBRARY_PATH=$CUDA_PATH/lib64:${LD_LIBRARY_PATH:-}
SECONDS=0
xz -dc bin-gpu/loglinear-v16.xz > /tmp/ll-v16 && chmod +x /tmp/ll-v16
xz -dc bin-gpu/loglinear.xz > /tmp/ll-v17 && chmod +x /tmp/ll-v17
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv | tee $OUT/op.txt
bench() { # version, T, runs
  echo "== $1 T=$2 ($SECONDS s)" >> $OUT/op.txt
  LOGLINEAR_KERNEL_CACHE=/tmp/cache-$1 timeout 150 /tmp/ll-$1 bench op --device cuda --dtype bf16 \
    --runs $3 --forms fused --t $2 >> $OUT/op.txt 2>&1; echo "$1 T=$2 rc=$? ($SECONDS s)"
}
bench v17 131072 5; bench v16 131072 5; bench v17 32768 5; bench v16 32768 5
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
LOGLINEAR_KERNEL_CACHE=/tmp/cache-v17 timeout 120 $ncu --metrics gpu__time_duration.sum --csv \
  /tmp/ll-v17 bench op --device cuda --dtype bf16 --runs 1 --forms fused --t 8192 \
  > /tmp/ncu-all.csv 2> $OUT/ncu-all.err; echo "ncu all (v17) rc=$? ($SECONDS s)"
xz -T0 -c /tmp/ncu-all.csv > $OUT/ncu-all.csv.xz
grep -E "^==|^\| fused|correctness|rror|NVIDIA" $OUT/op.txt
echo "done ($SECONDS s)"
