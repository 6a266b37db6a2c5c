#!/usr/bin/env bash
# For the next GPU session (written in session 37), call 1 of 2: v30 as committed (`a5d79e7`)
# and the v31x experiment on CUDA for the first time.
# v31x = v30 + `bench/raw/session37/v31x-row-epilogue-experiment.diff`: with
# LOGLINEAR_EXPERIMENT_ROW_EPILOGUE=1 the level epilogues of the forward and the causal backward
# give each unit one row (16-byte shared loads, one row weight, dλ summed over the row's units by
# two or three shuffles) instead of one column; unset, its kernels are v30's (the switch is a
# comptime branch), so the v31x binary serves as v30 (the carry holds three binaries at most).
#  1. The tensor-core, Mamba-2, segment, planned-segment, mixed-walk and half-precision kernel
#     tests with v31x's test binary, switch unset (= v30), then with the switch on (the whole
#     suite, ≈ 250 s, runs in call 2).
#  2. `bench op` at T = 2048, 8192: v30, v24 (baseline, same machine), v31x with the switch.
# Call 2 (`next-call-2.sh`): backward profiles and the long anchors.
# bin-gpu/: loglinear-v31x.xz, loglinear-v24.xz, tests/kernels.xz (v31x). LIMIT: seconds.
set -u
export CUDA_PATH=/usr/local/cuda
export LD_LIBRARY_PATH=$CUDA_PATH/lib64:${LD_LIBRARY_PATH:-}
SECONDS=0
LIMIT=${LIMIT:-540}
xz -dc bin-gpu/loglinear-v31x.xz > /tmp/ll-v30 && chmod +x /tmp/ll-v30
xz -dc bin-gpu/loglinear-v24.xz > /tmp/ll-v24 && chmod +x /tmp/ll-v24
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv | tee $OUT/op.txt
OUT=$OUT/t1 timeout 120 scripts/gpu-test.sh tensor_core_kernels mamba2 fused_over_segments \
  fused_passes_walk fused_walks_long fused_takes_half > $OUT/tests.txt 2>&1
echo "tests rc=$? ($SECONDS s)"
grep -E "^test |test result|panicked|max_rel|off by" $OUT/tests.txt | head -40
LOGLINEAR_EXPERIMENT_ROW_EPILOGUE=1 OUT=$OUT/t2 timeout 120 scripts/gpu-test.sh \
  tensor_core_kernels mamba2 fused_over_segments fused_passes_walk fused_walks_long \
  fused_takes_half > $OUT/tests-row.txt 2>&1
echo "tests with ROW_EPILOGUE=1 rc=$? ($SECONDS s)"
grep -E "^test |test result|panicked" $OUT/tests-row.txt | head -20
bench() { # label, binary, runs, T list, env...
  local label=$1 bin=$2 runs=$3 t=$4; shift 4
  local left=$(( LIMIT - SECONDS - 5 )); (( left > 150 )) && left=150
  echo "== $label T=$t ($SECONDS s)" >> $OUT/op.txt
  env "$@" LOGLINEAR_KERNEL_CACHE=/tmp/cache-$bin timeout $left /tmp/ll-$bin bench op \
    --device cuda --dtype bf16 --runs $runs --forms fused --t $t >> $OUT/op.txt 2>&1
  echo "$label T=$t rc=$? ($SECONDS s)"
}
go() { (( SECONDS < LIMIT - ${1:-60} )); }
if grep -q "tensor_core_kernels_match_reference_in_bf16 ... ok" $OUT/tests.txt; then
  go && bench v30 v30 3 2048,8192 X=1
  go && bench v24 v24 3 2048,8192 X=1
  if grep -q "tensor_core_kernels_match_reference_in_bf16 ... ok" $OUT/tests-row.txt; then
    go && bench v31x-row v30 3 2048,8192 LOGLINEAR_EXPERIMENT_ROW_EPILOGUE=1
  fi
fi
grep -E "^==|^\| fused|correctness|rror|NVIDIA" $OUT/op.txt
echo "done ($SECONDS s)"
