#!/usr/bin/env bash
# Session 44 call 1: run as written in session 43 (LIMIT=560), on an H100.
# For the next GPU session (written in session 43, whose call 4 with the first two switches found
# no device time left to start a machine). Build first: `git apply
# bench/raw/session43/v41-experiment.diff` in a worktree at session 43's HEAD, then
# `scripts/build-gpu.sh --tests` there, and carry its `bin-gpu/loglinear.xz` and
# `bin-gpu/tests/kernels.xz`. Three switches on v40:
#   LOGLINEAR_EXPERIMENT_ANTI_HELD=shared  (v41y) the anticausal backward's level 0 (an odd
#       chunk's update, read by the next chunk walking backwards) kept in a 34 KB shared buffer of
#       its own, each unit reading back what it wrote, instead of global memory (v41x kept it in
#       registers: ptxas spilled 16 bytes at T = 2048 and call 2 measured +2 % there, −1.9 % at
#       8192). `=1` is v41x.
#   LOGLINEAR_EXPERIMENT_UNSPLIT=1  (v41z) the anticausal updates' operand λ e^γ ⊙ dO rounded
#       once to bf16 (one product) instead of split hi + lo (two): call 3's profile put the update
#       products at 12.1 % and the operand's construction (with dΓ) at 13.6 % of the samples.
#   LOGLINEAR_EXPERIMENT_VEC_OPERANDS=1  (v42x) every tensor-core kernel builds its elementwise
#       product operands (weights, kd ⊙ V, the updates' operand) four values a trip: one 8-byte
#       read, paired conversions and one vector store per part, bitwise the same values.
# Unset: v40's kernels. Order: tensor-core and half-precision tests with all three switches, then
# `bench op` (its check gates each) at T = 2048: v40, each switch alone, all three, v40 again;
# then all three and v40 at 8192 (≈ 90 + 6 × 46 + 2 × 55 s).
# LIMIT: seconds.
set -u
export CUDA_PATH=/usr/local/cuda
export LD_LIBRARY_PATH=$CUDA_PATH/lib64:${LD_LIBRARY_PATH:-}
SECONDS=0
LIMIT=${LIMIT:-560}
xz -dc bin-gpu/loglinear.xz > /tmp/ll && chmod +x /tmp/ll
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv | tee $OUT/summary.txt
Y=LOGLINEAR_EXPERIMENT_ANTI_HELD=shared
Z=LOGLINEAR_EXPERIMENT_UNSPLIT=1
V=LOGLINEAR_EXPERIMENT_VEC_OPERANDS=1
# --nocapture: the tests print every output's and gradient's error (v41z's rounding against the
# baseline that next-call-2.sh's suite prints with the switches unset).
env $Y $Z $V OUT=/tmp/t-tests timeout 130 scripts/gpu-test.sh \
  tensor_core_kernels_match fused_takes_half_precision --nocapture > $OUT/tests.txt 2>&1
echo "tests (v41y + v41z + v42x) rc=$? ($SECONDS s)" | tee -a $OUT/summary.txt
grep -E "^test |test result|panicked|FAILED" $OUT/tests.txt | head -30 | tee -a $OUT/summary.txt
if ! grep -q "test result: ok" $OUT/tests.txt; then
  # Which switch: the unsplit operand is the one that changes values; the others are bitwise v40's.
  env $Y $V OUT=/tmp/t-tests2 timeout 130 scripts/gpu-test.sh \
    tensor_core_kernels_match fused_takes_half_precision > $OUT/tests-no-unsplit.txt 2>&1
  echo "tests (v41y + v42x) rc=$? ($SECONDS s)" | tee -a $OUT/summary.txt
  grep -E "^test |test result|panicked" $OUT/tests-no-unsplit.txt | head -20 | tee -a $OUT/summary.txt
fi
bench() { # label, t list, env...
  local label=$1 ts=$2; shift 2
  local left=$(( LIMIT - SECONDS - 5 )); (( left > 90 )) && left=90
  (( left > 40 )) || return
  echo "== $label T=$ts ($SECONDS s)" >> $OUT/op.txt
  env "$@" LOGLINEAR_KERNEL_CACHE=/tmp/cache timeout $left /tmp/ll bench op \
    --device cuda --dtype bf16 --runs 3 --forms fused --t $ts >> $OUT/op.txt 2>&1
  echo "bench $label rc=$? ($SECONDS s)" | tee -a $OUT/summary.txt
}
bench v40 2048 X=1
bench v41y 2048 $Y
bench v41z 2048 $Z
bench v42x 2048 $V
bench all 2048 $Y $Z $V
bench v40-again 2048 X=1
bench all-8k 8192 $Y $Z $V
bench v40-8k 8192 X=1
grep -E "^==|^\| fused|correctness|rror" $OUT/op.txt | tee -a $OUT/summary.txt
echo "done ($SECONDS s)" | tee -a $OUT/summary.txt
