#!/usr/bin/env bash
# For the next GPU session (written in session 40), call 2 of 2: the long anchors with v35 (not
# measured since v30), and the forward's value tile at T = 32,768 × 4 (192 rows: the planner takes
# 32 columns, 384 cubes in 1.45 waves of two a multiprocessor; 64 columns are one partial wave of
# 192 cubes, 16 columns 2.9 waves with four times the score work). Same binary as call 1
# (`bin-gpu/loglinear-v37x.xz`, switches unset = v35). LIMIT: seconds.
set -u
export CUDA_PATH=/usr/local/cuda
export LD_LIBRARY_PATH=$CUDA_PATH/lib64:${LD_LIBRARY_PATH:-}
SECONDS=0
LIMIT=${LIMIT:-560}
xz -dc bin-gpu/loglinear-v37x.xz > /tmp/ll && chmod +x /tmp/ll
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv | tee $OUT/op.txt
bench() { # label, t list, env...
  local label=$1 ts=$2; shift 2
  local left=$(( LIMIT - SECONDS - 5 )); (( left > 150 )) && left=150
  (( left > 50 )) || return
  echo "== $label T=$ts ($SECONDS s)" >> $OUT/op.txt
  env "$@" LOGLINEAR_KERNEL_CACHE=/tmp/cache timeout $left /tmp/ll bench op \
    --device cuda --dtype bf16 --runs 3 --forms fused --t $ts >> $OUT/op.txt 2>&1
  echo "bench $label rc=$? ($SECONDS s)"
}
bench v35-long 32768,131072 X=1
bench forward-pt64 32768 LOGLINEAR_EXPERIMENT_FORWARD_PT=64
bench forward-pt16 32768 LOGLINEAR_EXPERIMENT_FORWARD_PT=16
bench v35-32k-again 32768 X=1
grep -E "^==|^\| fused|correctness|rror" $OUT/op.txt
echo "done ($SECONDS s)"
