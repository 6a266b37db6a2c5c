#!/usr/bin/env bash
# For the next GPU session (written in session 44): v40 against v43 in one call, then the causal
# backward's profile on v43. Carry bin-gpu/ with
#   bin-gpu/loglinear.xz      v43 (`scripts/build-gpu.sh` at session 44's HEAD or later kernels),
#   bin-gpu/v40/loglinear.xz  v40: `scripts/build-gpu.sh` in a worktree at 28d8a52 (session 43's
#                             HEAD), its bin-gpu/loglinear.xz copied here (session 43's
#                             experiment binary, built from 28d8a52 + v41-experiment.diff, is v40
#                             with its switches unset and serves as well).
# Session 44 measured v43 and v40 in different calls on different H100s only: 34.73 against
# 35.80–36.06 ms at T = 2048, 42.62 against 42.60 at 8192. Order: v40, v43, v40, v43 at 8192,
# v40, v43 at 2048 (each `bench op`, whose f64 check gates it), then Nsight Compute of
# `causal_backward_tc_kernel` at T = 2048 × 64 (not profiled since session 38; ≈ 120 s).
# LIMIT: seconds (≈ 6 × 50 + 130 s of work).
set -u
export CUDA_PATH=/usr/local/cuda
export LD_LIBRARY_PATH=$CUDA_PATH/lib64:${LD_LIBRARY_PATH:-}
SECONDS=0
LIMIT=${LIMIT:-480}
xz -dc bin-gpu/loglinear.xz > /tmp/ll && chmod +x /tmp/ll
xz -dc bin-gpu/v40/loglinear.xz > /tmp/ll40 && chmod +x /tmp/ll40
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv | tee $OUT/summary.txt
bench() { # label, binary, t
  local label=$1 bin=$2 t=$3
  local left=$(( LIMIT - SECONDS - 5 )); (( left > 90 )) && left=90
  (( left > 45 )) || return
  echo "== $label T=$t ($SECONDS s)" >> $OUT/op.txt
  LOGLINEAR_KERNEL_CACHE=/tmp/cache timeout $left $bin bench op \
    --device cuda --dtype bf16 --runs 3 --forms fused --t $t >> $OUT/op.txt 2>&1
  echo "bench $label rc=$? ($SECONDS s)" | tee -a $OUT/summary.txt
}
bench v40-8k /tmp/ll40 8192
bench v43-8k /tmp/ll 8192
bench v40-8k-again /tmp/ll40 8192
bench v43-8k-again /tmp/ll 8192
bench v40 /tmp/ll40 2048
bench v43 /tmp/ll 2048
grep -E "^==|^\| fused|correctness|rror" $OUT/op.txt | tee -a $OUT/summary.txt
(( SECONDS < LIMIT - 130 )) && scripts/ncu-profile.sh "^causal_backward_tc_kernel" causal-bwd \
  $(( LIMIT - SECONDS - 15 ))
echo "done ($SECONDS s)" | tee -a $OUT/summary.txt
