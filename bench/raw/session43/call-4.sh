#!/usr/bin/env bash
# NOT RUN in session 43: the device refused to start another machine (400 s of budget left,
# too little for a start). Its content is next-call.sh's, for the next session.
# Session 43, call 4: two more switches on v40 (binary `bin-gpu/loglinear.xz`, kernel tests
# `bin-gpu/tests/kernels.xz`, built together; `bench/raw/session43/v41-experiment.diff`), both
# in the anticausal tensor-core backward:
#   LOGLINEAR_EXPERIMENT_ANTI_HELD=shared  (v41y) level 0 (an odd chunk's update, read by the next
#       chunk walking backwards) kept in a 32 KB shared buffer of its own, each unit reading back
#       what it wrote, instead of global memory (v41x kept it in registers: ptxas spilled 16 bytes
#       at T = 2048 and call 2 measured +2 % there, −1.9 % at 8192). `=1` is v41x.
#   LOGLINEAR_EXPERIMENT_UNSPLIT=1  (v41z) the level updates' operand λ e^γ ⊙ dO rounded once to
#       bf16 (one product) instead of split hi + lo (two): call 3's profile put the update
#       products at 12.1 % and the operand's construction (with dΓ) at 13.6 % of the stall samples.
# Unset: v40's kernels. Order: tensor-core and half-precision tests with both switches, then
# `bench op` (its check gates each) at T = 2048: v40, v41y, v41z, both; 8192 as time allows.
# LIMIT: seconds.
set -u
export CUDA_PATH=/usr/local/cuda
export LD_LIBRARY_PATH=$CUDA_PATH/lib64:${LD_LIBRARY_PATH:-}
SECONDS=0
LIMIT=${LIMIT:-330}
xz -dc bin-gpu/loglinear.xz > /tmp/ll && chmod +x /tmp/ll
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv | tee $OUT/summary.txt
Y=LOGLINEAR_EXPERIMENT_ANTI_HELD=shared
Z=LOGLINEAR_EXPERIMENT_UNSPLIT=1
env $Y $Z OUT=/tmp/t-tests timeout 130 scripts/gpu-test.sh \
  tensor_core_kernels_match fused_takes_half_precision > $OUT/tests.txt 2>&1
echo "tests (v41y + v41z) rc=$? ($SECONDS s)" | tee -a $OUT/summary.txt
grep -E "^test |test result|panicked|FAILED|max|worst" $OUT/tests.txt | head -30 | tee -a $OUT/summary.txt
bench() { # label, t list, env...
  local label=$1 ts=$2; shift 2
  local left=$(( LIMIT - SECONDS - 5 )); (( left > 80 )) && left=80
  (( left > 40 )) || return
  echo "== $label T=$ts ($SECONDS s)" >> $OUT/op.txt
  env "$@" LOGLINEAR_KERNEL_CACHE=/tmp/cache timeout $left /tmp/ll bench op \
    --device cuda --dtype bf16 --runs 3 --forms fused --t $ts >> $OUT/op.txt 2>&1
  echo "bench $label rc=$? ($SECONDS s)" | tee -a $OUT/summary.txt
}
bench v40 2048 X=1
bench v41y 2048 $Y
bench v41z 2048 $Z
bench both 2048 $Y $Z
bench both-8k 8192 $Y $Z
bench v40-8k 8192 X=1
grep -E "^==|^\| fused|correctness|rror" $OUT/op.txt | tee -a $OUT/summary.txt
echo "done ($SECONDS s)" | tee -a $OUT/summary.txt
