#!/usr/bin/env bash
# For the next GPU session (written in session 44), after next-call.sh on the same machine and
# binaries: v40 against v43 at T = 2048 in one call, then Nsight Compute of the causal backward
# (`causal_backward_tc_kernel`, T = 2048 × 64; not profiled since session 38), on v43 (switches
# unset) and, if a switch won in next-call.sh, with it (SWITCH=VAR=1). ≈ 2 × 50 + 2 × 120 s.
# LIMIT: seconds.
set -u
export CUDA_PATH=/usr/local/cuda
export LD_LIBRARY_PATH=$CUDA_PATH/lib64:${LD_LIBRARY_PATH:-}
SECONDS=0
LIMIT=${LIMIT:-400}
[ -x /tmp/ll ] || { xz -dc bin-gpu/loglinear.xz > /tmp/ll && chmod +x /tmp/ll; }
[ -x /tmp/ll40 ] || { xz -dc bin-gpu/v40/loglinear.xz > /tmp/ll40 && chmod +x /tmp/ll40; }
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv | tee $OUT/summary.txt
scripts/bench-row.sh v40 /tmp/ll40 2048 $(( LIMIT - SECONDS - 5 ))
scripts/bench-row.sh v43 /tmp/ll 2048 $(( LIMIT - SECONDS - 5 ))
grep -E "^==|^\| fused|correctness|rror" $OUT/op.txt | tee -a $OUT/summary.txt
(( SECONDS < LIMIT - 130 )) && scripts/ncu-profile.sh "^causal_backward_tc_kernel" causal-bwd \
  $(( LIMIT - SECONDS - 15 ))
[ -n "${SWITCH:-}" ] && (( SECONDS < LIMIT - 130 )) && scripts/ncu-profile.sh \
  "^causal_backward_tc_kernel" causal-bwd-switch $(( LIMIT - SECONDS - 15 )) "$SWITCH"
echo "done ($SECONDS s)" | tee -a $OUT/summary.txt
