#!/usr/bin/env bash
# For the next GPU session (written in session 44). Carry bin-gpu/ with
#   bin-gpu/loglinear.xz, bin-gpu/tests/kernels.xz  v43 + the v45 switches: `git apply
#       bench/raw/session44/v45-experiment.diff` in a worktree at session 44's HEAD, then
#       `scripts/build-gpu.sh --tests` there (switches unset: v43's kernels);
#   bin-gpu/v40/loglinear.xz  v40: `scripts/build-gpu.sh` in a worktree at 28d8a52 (session 43's
#       HEAD), its bin-gpu/loglinear.xz copied here (session 43's experiment binary, 28d8a52 +
#       v41-experiment.diff, is v40 with its switches unset and serves as well).
# Two switches, both in the tensor-core backward, v43's arithmetic in another order of access:
#   LOGLINEAR_EXPERIMENT_ANTI_VEC=1  (v45x) the anticausal kernel's dv and dk accumulators in
#       blocks of four consecutive values a unit: 16-byte reads of the staged products, one
#       four-value store of dv and of dk per block (session 43's profile: dv/dk stores 5.2 %,
#       their epilogue with the later levels' reads 10.7 % of the samples).
#   LOGLINEAR_EXPERIMENT_Q_BLOCKS=1  (v45y) the causal kernel's row epilogue reads its q values
#       four at a time (one 8-byte read) for dλ's row sums, at every level read.
# Order: the tensor-core and half-precision kernel tests with both switches; `bench op` at
# T = 2048: v43, v45x, v45y, both, v43 again; at 8192: v40, v43, both (session 44 measured v43
# and v40 in different calls only: 34.73 against 35.80–36.06 ms at 2048, 42.62 against 42.60 at
# 8192). ≈ 90 + 5 × 50 + 3 × 55 s.
# LIMIT: seconds.
set -u
export CUDA_PATH=/usr/local/cuda
export LD_LIBRARY_PATH=$CUDA_PATH/lib64:${LD_LIBRARY_PATH:-}
SECONDS=0
LIMIT=${LIMIT:-540}
xz -dc bin-gpu/loglinear.xz > /tmp/ll && chmod +x /tmp/ll
xz -dc bin-gpu/v40/loglinear.xz > /tmp/ll40 && chmod +x /tmp/ll40
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv | tee $OUT/summary.txt
X=LOGLINEAR_EXPERIMENT_ANTI_VEC=1
Y=LOGLINEAR_EXPERIMENT_Q_BLOCKS=1
env $X $Y OUT=/tmp/t-tests timeout 130 scripts/gpu-test.sh \
  tensor_core_kernels_match fused_takes_half_precision --nocapture > $OUT/tests.txt 2>&1
echo "tests (v45x + v45y) rc=$? ($SECONDS s)" | tee -a $OUT/summary.txt
grep -E "^test |test result|panicked|FAILED" $OUT/tests.txt | head -30 | tee -a $OUT/summary.txt
bench() { # label, binary, t, env...
  local label=$1 bin=$2 t=$3; shift 3
  scripts/bench-row.sh "$label" "$bin" "$t" $(( LIMIT - SECONDS - 5 )) "$@"
}
bench v43 /tmp/ll 2048 Z=1
bench v45x /tmp/ll 2048 $X
bench v45y /tmp/ll 2048 $Y
bench both /tmp/ll 2048 $X $Y
bench v43-again /tmp/ll 2048 Z=1
bench v40-8k /tmp/ll40 8192 Z=1
bench v43-8k /tmp/ll 8192 Z=1
bench both-8k /tmp/ll 8192 $X $Y
grep -E "^==|^\| fused|correctness|rror" $OUT/op.txt | tee -a $OUT/summary.txt
echo "done ($SECONDS s)" | tee -a $OUT/summary.txt
