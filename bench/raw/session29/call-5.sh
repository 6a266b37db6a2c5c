#!/usr/bin/env bash
# Session 29, call 5 (short: the session's device time is nearly spent): v15 (v14 with the
# backward glue fixed: no sum over a value-tile dimension of one, dg's reverse cumsum in two
# levels) against v14, bench op's check (o and all gradients, dg included) then timings.
set -u
export CUDA_PATH=/usr/local/cuda
export LD_LIBRARY_PATH=$CUDA_PATH/lib64:${LD_LIBRARY_PATH:-}
SECONDS=0
xz -dc bin-gpu/loglinear-v14.xz > /tmp/ll-v14 && chmod +x /tmp/ll-v14
xz -dc bin-gpu/loglinear.xz > /tmp/ll-v15 && chmod +x /tmp/ll-v15
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv | tee $OUT/op.txt
bench() { # version, T, runs
  echo "== $1 T=$2 ($SECONDS s)" >> $OUT/op.txt
  LOGLINEAR_KERNEL_CACHE=/tmp/cache-$1 timeout 70 /tmp/ll-$1 bench op --device cuda --dtype bf16 \
    --runs $3 --forms fused --t $2 >> $OUT/op.txt 2>&1; echo "$1 T=$2 rc=$? ($SECONDS s)"
}
bench v15 8192 7; bench v14 8192 7
(( SECONDS < 110 )) && { bench v15 131072 3; bench v14 131072 3; }
grep -E "^==|^\| fused|correctness|rror" $OUT/op.txt
echo "done ($SECONDS s)"
