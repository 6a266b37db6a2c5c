#!/usr/bin/env bash
# Session 31, call 2: v17 = v16 without the barriers that only separated a staging buffer's
# reads from a write that another barrier already orders (after every level read and update of
# the three tensor-core kernels, and after the in-chunk accumulator reads). First its
# tensor-core kernel tests, then v17 against v16 at T = 8192 and 2048, then the whole CUDA kernel
# test suite with v17, then T = 131,072 and 32,768 while time remains.
# bin-gpu/: loglinear-v16.xz, loglinear.xz (v17), tests/kernels.xz (v17).
set -u
export CUDA_PATH=/usr/local/cuda
export LD_LIBRARY_PATH=$CUDA_PATH/lib64:${LD_LIBRARY_PATH:-}
SECONDS=0
xz -dc bin-gpu/loglinear-v16.xz > /tmp/ll-v16 && chmod +x /tmp/ll-v16
xz -dc bin-gpu/loglinear.xz > /tmp/ll-v17 && chmod +x /tmp/ll-v17
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv | tee $OUT/op.txt
OUT=$OUT/tc timeout 200 scripts/gpu-test.sh tensor_core fused_takes_half > $OUT/tests-tc.txt 2>&1
rc=$?; echo "tc tests rc=$rc ($SECONDS s)"; grep -E "^test |test result|panicked" $OUT/tests-tc.txt
bench() { # version, T, runs
  echo "== $1 T=$2 ($SECONDS s)" >> $OUT/op.txt
  LOGLINEAR_KERNEL_CACHE=/tmp/cache-$1 timeout 150 /tmp/ll-$1 bench op --device cuda --dtype bf16 \
    --runs $3 --forms fused --t $2 >> $OUT/op.txt 2>&1; echo "$1 T=$2 rc=$? ($SECONDS s)"
}
bench v17 8192 7; bench v16 8192 7; bench v17 2048 7; bench v16 2048 7
if (( rc == 0 )); then
  # Every kernel test but the tensor-core ones just run.
  OUT=$OUT/all timeout 260 scripts/gpu-test.sh --skip tensor_core --skip fused_takes_half \
    > $OUT/tests-all.txt 2>&1; echo "all tests rc=$? ($SECONDS s)"
  grep -E "^test |test result|panicked" $OUT/tests-all.txt
fi
for t in 131072 32768; do
  (( SECONDS > 470 )) && { echo "T=$t skipped: time"; continue; }
  bench v17 $t 5; bench v16 $t 5
done
grep -E "^==|^\| fused|correctness|rror|NVIDIA" $OUT/op.txt
echo "done ($SECONDS s)"
