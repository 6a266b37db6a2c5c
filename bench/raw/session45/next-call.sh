#!/usr/bin/env bash
# For the next GPU session (written in session 45, which got no machine). Carry bin-gpu/ with
# bin-gpu/loglinear.xz and bin-gpu/tests/kernels.xz built from `v48-experiment.diff` (here) on
# session 45's HEAD: v43 + six switches, each off by default (unset: v43's kernels):
#   LOGLINEAR_EXPERIMENT_ANTI_VEC=1   (v45x) anticausal backward: dv/dk accumulators in blocks of
#       four values a unit, 16-byte reads of the staged products, four-value stores
#   LOGLINEAR_EXPERIMENT_Q_BLOCKS=1   (v45y) causal backward: the row epilogue reads q four at a time
#   LOGLINEAR_EXPERIMENT_SCORE_REGS=1 (v46x) forward: the in-chunk scores weighted in the
#       accumulator registers that computed them, S̃ stored from there (no f32 staging of Q Kᵀ,
#       one barrier and the weight loop over the square fewer)
#   LOGLINEAR_EXPERIMENT_BWD_SCORE_REGS=1 (v46y) both backward kernels: the same for their two
#       in-chunk products (A and B of a tile in one plane's registers, combined there)
#   LOGLINEAR_EXPERIMENT_FRAG_LEVELS=1 (v47x) forward: carry and level planes in the tensor
#       cores' accumulator order; the key state accumulates into the decayed carry (no f32
#       staging of Kᵀ (kd ⊙ V), one barrier fewer a chunk)
#   LOGLINEAR_EXPERIMENT_FWD_PT=32 (not a kernel change) caps the tensor-core forward's value tile
#       at 32 columns in the planner
#   LOGLINEAR_EXPERIMENT_LEVEL_BUFFERS=1 (v48x, only with v46x and v47x) forward: levels read into
#       two shared buffers in turn (the second in the space the key state's staging left), one
#       barrier a level read instead of two
# Order: the tensor-core and half-precision kernel tests with all six (the backward keeps only
# the inputs, so a wrong output `o` points at v46x/v47x/v48x, a wrong gradient alone at the
# backward switches); then `bench op` at T = 2048: v43, v46x, v46x + v47x, v46x + v47x + v48x,
# v46x + v47x with the forward's value tile capped at 32 columns (LOGLINEAR_EXPERIMENT_FWD_PT=32:
# 6,144 cubes of ≈ 72 KB and, with v46x + v47x, few enough registers for three a
# multiprocessor), v46y, all six, v43 again, then v45x and v45y as time allows (≈ 90 + 10 × 50 s:
# the last may not fit; next-call-2.sh can take them). v47x is run only with v46x: alone ptxas
# gives the forward 153 registers at T = 2048 (one cube per multiprocessor), with v46x 128 as
# v43. LIMIT: seconds.
set -u
export CUDA_PATH=/usr/local/cuda
export LD_LIBRARY_PATH=$CUDA_PATH/lib64:${LD_LIBRARY_PATH:-}
SECONDS=0
LIMIT=${LIMIT:-590}
xz -dc bin-gpu/loglinear.xz > /tmp/ll && chmod +x /tmp/ll
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv | tee $OUT/summary.txt
X=LOGLINEAR_EXPERIMENT_ANTI_VEC=1
Y=LOGLINEAR_EXPERIMENT_Q_BLOCKS=1
S=LOGLINEAR_EXPERIMENT_SCORE_REGS=1
B=LOGLINEAR_EXPERIMENT_BWD_SCORE_REGS=1
F=LOGLINEAR_EXPERIMENT_FRAG_LEVELS=1
W=LOGLINEAR_EXPERIMENT_LEVEL_BUFFERS=1
env $X $Y $S $B $F $W OUT=/tmp/t-tests timeout 130 scripts/gpu-test.sh \
  tensor_core_kernels_match fused_takes_half_precision --nocapture > $OUT/tests.txt 2>&1
echo "tests (all six switches) rc=$? ($SECONDS s)" | tee -a $OUT/summary.txt
grep -E "^test |test result|panicked|FAILED" $OUT/tests.txt | head -30 | tee -a $OUT/summary.txt
bench() { # label, t, env...
  local label=$1 t=$2; shift 2
  scripts/bench-row.sh "$label" /tmp/ll "$t" $(( LIMIT - SECONDS - 5 )) "$@"
}
bench v43 2048 Z=1
bench v46x 2048 $S
bench v46x+v47x 2048 $S $F
bench v46x+v47x+v48x 2048 $S $F $W
bench v46x+v47x-pt32 2048 $S $F LOGLINEAR_EXPERIMENT_FWD_PT=32
bench v46y 2048 $B
bench all 2048 $X $Y $S $B $F $W
bench v43-again 2048 Z=1
bench v45x 2048 $X
bench v45y 2048 $Y
grep -E "^==|^\| fused|correctness|rror" $OUT/op.txt | tee -a $OUT/summary.txt
echo "done ($SECONDS s)" | tee -a $OUT/summary.txt
