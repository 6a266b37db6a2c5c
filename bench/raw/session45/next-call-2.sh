#!/usr/bin/env bash
# For the next GPU session (written in session 45), right after next-call.sh on the same machine
# and binaries. WIN: the switches that won at T = 2048 (e.g. "LOGLINEAR_EXPERIMENT_SCORE_REGS=1
# LOGLINEAR_EXPERIMENT_FRAG_LEVELS=1"); EXTRA: rows next-call.sh had no time for, as
# "label:VAR=1 label:VAR=1" (T = 2048, run first). With LOGLINEAR_EXPERIMENT_FWD_PT in WIN the
# suite's `tensor_core_plans_at_the_anchors` fails by design (it pins the planner's tiles).
# Order: `bench op` at T = 8192 for v43 and v43 + WIN, then
# the whole CUDA kernel suite with WIN on (what adoption commits is that arithmetic without its
# switches; ≈ 256 s on an H100), then v43 + WIN at T = 32,768 × 4 as time allows.
# LIMIT: seconds.
set -u
export CUDA_PATH=/usr/local/cuda
export LD_LIBRARY_PATH=$CUDA_PATH/lib64:${LD_LIBRARY_PATH:-}
SECONDS=0
LIMIT=${LIMIT:-540}
WIN=${WIN:-Z=1}
[ -x /tmp/ll ] || { xz -dc bin-gpu/loglinear.xz > /tmp/ll && chmod +x /tmp/ll; }
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv | tee $OUT/summary.txt
for row in ${EXTRA:-}; do
  scripts/bench-row.sh "${row%%:*}" /tmp/ll 2048 $(( LIMIT - SECONDS - 5 )) "${row#*:}"
done
scripts/bench-row.sh v43-8k /tmp/ll 8192 $(( LIMIT - SECONDS - 5 )) Z=1
scripts/bench-row.sh win-8k /tmp/ll 8192 $(( LIMIT - SECONDS - 5 )) $WIN
left=$(( LIMIT - SECONDS - 20 )); (( left > 300 )) && left=300
env $WIN OUT=/tmp/t-suite timeout $left scripts/gpu-test.sh --nocapture > /tmp/suite.txt 2>&1
echo "suite ($WIN) rc=$? ($SECONDS s, limit $left s)" | tee -a $OUT/summary.txt
xz -T0 -c /tmp/suite.txt > $OUT/suite.txt.xz
grep -E "\.\.\. ok|FAILED|panicked|test result" /tmp/suite.txt | head -60 | tee -a $OUT/summary.txt
scripts/bench-row.sh win-32k /tmp/ll 32768 $(( LIMIT - SECONDS - 5 )) $WIN
grep -E "^==|^\| fused|correctness|rror" $OUT/op.txt | tee -a $OUT/summary.txt
echo "done ($SECONDS s)" | tee -a $OUT/summary.txt
