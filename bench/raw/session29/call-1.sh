#!/usr/bin/env bash
# Session 29, call 1: v13 (session 28's instruction cuts: bitlen as clz, the chunk cumsum as a
# plane scan, the in-chunk dλ sums as one butterfly per row) against v12 on the same card.
# bin-gpu/: loglinear-v12.xz (built from a099fe9), loglinear.xz and tests/kernels.xz (v13).
# Each binary keeps its own kernel cache.
set -u
export CUDA_PATH=/usr/local/cuda
export LD_LIBRARY_PATH=$CUDA_PATH/lib64:${LD_LIBRARY_PATH:-}
SECONDS=0
xz -dc bin-gpu/loglinear-v12.xz > /tmp/ll-v12 && chmod +x /tmp/ll-v12
xz -dc bin-gpu/loglinear.xz > /tmp/ll-v13 && chmod +x /tmp/ll-v13
xz -dc bin-gpu/tests/kernels.xz > /tmp/kt && chmod +x /tmp/kt
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv | tee $OUT/op.txt
bench() { # version, T list, runs
  echo "== $1 T=$2 ($SECONDS s)" >> $OUT/op.txt
  LOGLINEAR_KERNEL_CACHE=/tmp/cache-$1 timeout 170 /tmp/ll-$1 bench op --device cuda --dtype bf16 \
    --runs $3 --forms fused --t $2 >> $OUT/op.txt 2>&1; echo "$1 T=$2 rc=$? ($SECONDS s)"
}
# 1. v13's tensor-core kernels against the f64 reference (the butterfly and the scan run only here).
timeout 150 /tmp/kt --test-threads=1 tensor_core_kernels fused_takes_half vector_helpers \
  > $OUT/tests-v13.txt 2>&1; echo "tc tests rc=$? ($SECONDS s)"
grep -E "^test |^test result|panicked|seed" $OUT/tests-v13.txt | head -20
# 2. T = 8192 side by side, twice each in alternation (process-to-process spread).
bench v12 8192 10; bench v13 8192 10; bench v12 8192 10; bench v13 8192 10
grep -E "^==|^\| fused|correctness" $OUT/op.txt
# 3. Where v13's backward waits.
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
LOGLINEAR_KERNEL_CACHE=/tmp/cache-v13 timeout 200 $ncu --clock-control none --set full \
  -k regex:backward_tc --launch-skip 2 --launch-count 2 -f -o /tmp/bwd \
  /tmp/ll-v13 bench op --device cuda --dtype bf16 --runs 1 --forms fused --t 8192 \
  > $OUT/ncu-run.txt 2>&1; echo "ncu rc=$? ($SECONDS s)"
if [[ -f /tmp/bwd.ncu-rep ]]; then
  $ncu --import /tmp/bwd.ncu-rep --page details > $OUT/ncu-details.txt 2>&1
  python3 scripts/ncu-stalls.py /tmp/bwd.ncu-rep 60 > $OUT/ncu-stalls.txt 2>&1
  $ncu --import /tmp/bwd.ncu-rep --csv --page source --print-source sass 2>/dev/null | xz -T0 > $OUT/ncu-sass.csv.xz
  cp /tmp/bwd.ncu-rep $OUT/
  grep -E "backward_tc|Duration|Registers Per|Warp Cycles Per Issued|Executed Ipc A" $OUT/ncu-details.txt
  head -40 $OUT/ncu-stalls.txt
fi
# 4. The other anchors, as time allows.
for t in 2048 32768 131072; do
  (( SECONDS > 480 )) && { echo "anchors T=$t skipped: time"; continue; }
  bench v13 $t 5; bench v12 $t 5
done
grep -E "^==|^\| fused" $OUT/op.txt
echo "done ($SECONDS s)"
