#!/usr/bin/env bash
# For the next GPU session (written in session 39): v35 (the committed kernels: v32 + the forward's
# output in accumulator registers) on CUDA as committed, against v32, and v33x's never-run switches.
# bin-gpu/: loglinear-v35.xz (a build of the session's HEAD), loglinear-v34x.xz (v34x: unset = v32;
# LOGLINEAR_EXPERIMENT_FORWARD_REGISTERS=1 = v35's arithmetic; v33x's three switches),
# tests/kernels.xz (v35's). Rebuild v34x if it is gone: `05a21d3` + bench/raw/session38/
# v33x-experiment.diff + bench/raw/session39/v34x-experiment.diff (scripts/build-gpu.sh --tests).
#  1. The whole CUDA kernel suite with v35 (its first run; includes the compile check).
#  2. `bench op` at T = 2048, 8192: v35, v32, v35 again.
#  3. The long anchors with v35.
#  4. v33x's switches on v34x with the registers on (`bench op`, its check gating the timings).
# At most eight files come back from $OUT. LIMIT: seconds.
set -u
export CUDA_PATH=/usr/local/cuda
export LD_LIBRARY_PATH=$CUDA_PATH/lib64:${LD_LIBRARY_PATH:-}
SECONDS=0
LIMIT=${LIMIT:-560}
xz -dc bin-gpu/loglinear-v35.xz > /tmp/ll-v35 && chmod +x /tmp/ll-v35
xz -dc bin-gpu/loglinear-v34x.xz > /tmp/ll-v34x && chmod +x /tmp/ll-v34x
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv | tee $OUT/op.txt
OUT=/tmp/t1 timeout 240 scripts/gpu-test.sh > $OUT/tests-all.txt 2>&1
echo "all tests (v35) rc=$? ($SECONDS s)" | tee -a $OUT/tests.txt
grep -E "test result|panicked|FAILED" $OUT/tests-all.txt | head -20 | tee -a $OUT/tests.txt
bench() { # label, binary, t list, env...
  local label=$1 bin=$2 ts=$3; shift 3
  local left=$(( LIMIT - SECONDS - 5 )); (( left > 110 )) && left=110
  (( left > 45 )) || return
  echo "== $label T=$ts ($SECONDS s)" >> $OUT/op.txt
  env "$@" LOGLINEAR_KERNEL_CACHE=/tmp/cache-$bin timeout $left /tmp/ll-$bin bench op \
    --device cuda --dtype bf16 --runs 3 --forms fused --t $ts >> $OUT/op.txt 2>&1
  echo "bench $label rc=$? ($SECONDS s)"
}
bench v35 v35 2048,8192 X=1
bench v32 v34x 2048,8192 X=1
bench v35-again v35 2048,8192 X=1
bench v35-long v35 32768,131072 X=1
# v33x's switches through v34x's binary (bin-gpu/tests holds v35's test binary, which has no
# switches): `bench op`'s own check (o and every gradient against f64 at two shapes, tolerance
# 3e-2) gates the timings.
for v in ROW_VECTOR_STORES DGAMMA_PREFETCH; do
  bench "v35+$v" v34x 2048,8192 LOGLINEAR_EXPERIMENT_FORWARD_REGISTERS=1 LOGLINEAR_EXPERIMENT_$v=1
done
grep -E "^==|^\| fused|correctness|rror" $OUT/op.txt
echo "done ($SECONDS s)"
