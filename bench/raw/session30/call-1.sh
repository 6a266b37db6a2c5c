#!/usr/bin/env bash
# Session 30, call 1: time v15 (v14 + backward glue: no sum over a value-tile dimension of one,
# dg's reverse cumsum in two levels) against v14 on the same card, then every kernel of one v15
# forward+backward at T = 8192 by ncu (where the remaining time goes). bin-gpu/: loglinear-v14.xz,
# loglinear.xz (v15). The kernel test binary is not carried: it predates v14.
set -u
export CUDA_PATH=/usr/local/cuda
export LD_LIBRARY_PATH=$CUDA_PATH/lib64:${LD_LIBRARY_PATH:-}
SECONDS=0
xz -dc bin-gpu/loglinear-v14.xz > /tmp/ll-v14 && chmod +x /tmp/ll-v14
xz -dc bin-gpu/loglinear.xz > /tmp/ll-v15 && chmod +x /tmp/ll-v15
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv | tee $OUT/op.txt
bench() { # version, T, runs
  echo "== $1 T=$2 ($SECONDS s)" >> $OUT/op.txt
  LOGLINEAR_KERNEL_CACHE=/tmp/cache-$1 timeout 150 /tmp/ll-$1 bench op --device cuda --dtype bf16 \
    --runs $3 --forms fused --t $2 >> $OUT/op.txt 2>&1; echo "$1 T=$2 rc=$? ($SECONDS s)"
}
bench v15 8192 7; bench v14 8192 7; bench v15 8192 7
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
LOGLINEAR_KERNEL_CACHE=/tmp/cache-v15 timeout 150 $ncu --metrics gpu__time_duration.sum --csv \
  /tmp/ll-v15 bench op --device cuda --dtype bf16 --runs 1 --forms fused --t 8192 \
  > /tmp/ncu-all.csv 2> $OUT/ncu-all.err; echo "ncu all (v15) rc=$? ($SECONDS s)"
xz -T0 -c /tmp/ncu-all.csv > $OUT/ncu-all.csv.xz
for t in 131072 2048 32768; do
  (( SECONDS > 430 )) && { echo "T=$t skipped: time"; continue; }
  bench v15 $t 5; bench v14 $t 5
done
grep -E "^==|^\| fused|correctness|rror|NVIDIA" $OUT/op.txt
echo "done ($SECONDS s)"
