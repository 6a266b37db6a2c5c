#!/usr/bin/env bash
# Session 44 call 3: v43 (v40 + v42x's vector operands in the two tensor-core backward kernels
# only; the forward keeps v40's element loops, which call 1 measured faster) and one switch,
# LOGLINEAR_EXPERIMENT_PREFETCH=1 (v44x: every tensor-core kernel asks L2 for the next chunk's
# input rows, `prefetch.global.L2`, once its own loads have landed). Unset, the binary is v43.
# Carries bin-gpu/loglinear.xz, bin-gpu/tests/kernels.xz (v43 + switch) and
# bin-gpu/v40/loglinear.xz (session 43's experiment binary: switches unset, v40's kernels).
# Order: `bench op` (its f64 check gates each) at T = 2048: v43, v44x; then the whole CUDA kernel
# suite on v43; then v43 and v44x at 8192, v40 at 2048, as far as LIMIT allows.
# LIMIT: seconds.
set -u
export CUDA_PATH=/usr/local/cuda
export LD_LIBRARY_PATH=$CUDA_PATH/lib64:${LD_LIBRARY_PATH:-}
SECONDS=0
LIMIT=${LIMIT:-540}
xz -dc bin-gpu/loglinear.xz > /tmp/ll && chmod +x /tmp/ll
xz -dc bin-gpu/v40/loglinear.xz > /tmp/ll40 && chmod +x /tmp/ll40
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv | tee $OUT/summary.txt
P=LOGLINEAR_EXPERIMENT_PREFETCH=1
bench() { # label, binary, t, env...
  local label=$1 bin=$2 t=$3; shift 3
  local left=$(( LIMIT - SECONDS - 5 )); (( left > 90 )) && left=90
  (( left > 45 )) || return
  echo "== $label T=$t ($SECONDS s)" >> $OUT/op.txt
  env "$@" LOGLINEAR_KERNEL_CACHE=/tmp/cache timeout $left $bin bench op \
    --device cuda --dtype bf16 --runs 3 --forms fused --t $t >> $OUT/op.txt 2>&1
  echo "bench $label rc=$? ($SECONDS s)" | tee -a $OUT/summary.txt
}
bench v43 /tmp/ll 2048 X=1
bench v44x /tmp/ll 2048 $P
left=$(( LIMIT - SECONDS - 60 )); (( left > 330 )) && left=330
OUT=/tmp/t-suite timeout $left scripts/gpu-test.sh --nocapture > /tmp/suite.txt 2>&1
echo "suite (v43) rc=$? ($SECONDS s, limit $left s)" | tee -a $OUT/summary.txt
xz -T0 -c /tmp/suite.txt > $OUT/suite.txt.xz
grep -E "\.\.\. ok|FAILED|panicked|test result" /tmp/suite.txt | head -60 | tee -a $OUT/summary.txt
bench v43-8k /tmp/ll 8192 X=1
bench v44x-8k /tmp/ll 8192 $P
bench v40 /tmp/ll40 2048 X=1
grep -E "^==|^\| fused|correctness|rror" $OUT/op.txt | tee -a $OUT/summary.txt
echo "done ($SECONDS s)" | tee -a $OUT/summary.txt
