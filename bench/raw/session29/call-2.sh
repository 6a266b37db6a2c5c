#!/usr/bin/env bash
# Session 29, call 2: v14 (v13 with tile_matmul on manual m16n8k16 mma: operands by ldmatrix from
# shared memory instead of wmma loads through generic pointers) against v13 on the same card.
# bin-gpu/: loglinear-v13.xz, loglinear.xz and tests/kernels.xz (v14).
set -u
export CUDA_PATH=/usr/local/cuda
export LD_LIBRARY_PATH=$CUDA_PATH/lib64:${LD_LIBRARY_PATH:-}
SECONDS=0
xz -dc bin-gpu/loglinear-v13.xz > /tmp/ll-v13 && chmod +x /tmp/ll-v13
xz -dc bin-gpu/loglinear.xz > /tmp/ll-v14 && chmod +x /tmp/ll-v14
xz -dc bin-gpu/tests/kernels.xz > /tmp/kt && chmod +x /tmp/kt
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv | tee $OUT/op.txt
bench() { # version, T list, runs
  echo "== $1 T=$2 ($SECONDS s)" >> $OUT/op.txt
  LOGLINEAR_KERNEL_CACHE=/tmp/cache-$1 timeout 170 /tmp/ll-$1 bench op --device cuda --dtype bf16 \
    --runs $3 --forms fused --t $2 >> $OUT/op.txt 2>&1; echo "$1 T=$2 rc=$? ($SECONDS s)"
}
# 1. v14's tensor-core kernels against the f64 reference.
timeout 150 /tmp/kt --test-threads=1 tensor_core_kernels fused_takes_half vector_helpers \
  > $OUT/tests-v14.txt 2>&1; rc=$?; echo "tc tests rc=$rc ($SECONDS s)"
grep -E "^test |^test result|panicked|seed|error" $OUT/tests-v14.txt | head -30
# 2. T = 8192 side by side, alternating.
bench v13 8192 10; bench v14 8192 10; bench v13 8192 10; bench v14 8192 10
grep -E "^==|^\| fused|correctness|rror" $OUT/op.txt | head -40
# 3. Every kernel of one forward+backward at T = 8192 (v14), timed by ncu one at a time: where the
#    backward's time outside the two fused kernels goes (casts, sums, dg).
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
ver=v14; (( rc == 0 )) || ver=v13
LOGLINEAR_KERNEL_CACHE=/tmp/cache-$ver timeout 150 $ncu --metrics gpu__time_duration.sum --csv \
  /tmp/ll-$ver bench op --device cuda --dtype bf16 --runs 1 --forms fused --t 8192 \
  > /tmp/ncu-all.csv 2> $OUT/ncu-all.err; echo "ncu all ($ver) rc=$? ($SECONDS s)"
xz -T0 -c /tmp/ncu-all.csv > $OUT/ncu-all.csv.xz
# 4. The other anchors.
for t in 2048 32768 131072; do
  (( SECONDS > 420 )) && { echo "anchors T=$t skipped: time"; continue; }
  bench v14 $t 5; bench v13 $t 5
done
grep -E "^==|^\| fused" $OUT/op.txt
# 5. Every kernel test on CUDA, as time allows.
if (( rc == 0 )); then
  left=$(( 575 - SECONDS ))
  (( left > 60 )) && { timeout $left scripts/gpu-test.sh > /dev/null 2>&1; echo "gpu-test rc=$? ($SECONDS s)"; }
  grep -E "^test result|FAILED|panicked" $OUT/gpu-test.txt | head -20
fi
echo "done ($SECONDS s)"
