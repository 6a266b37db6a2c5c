#!/usr/bin/env bash
# Session 38, call 3: v31y = v30 + `v31y-row-epilogue-experiment.diff` (on `a5d79e7`). v31x's
# row-owner level epilogues failed CubeCL's IR verifier on CUDA (call 1); v31y writes each of
# their new constructs as the working kernels do (shared memory read four floats at a time
# through the same vector view the stores use, q read element by element, the dλ butterfly's
# masks as `1 << step`), with switches:
#   LOGLINEAR_EXPERIMENT_ROW_EPILOGUE = fwd | bwd | both   which kernels take the row mapping
#   LOGLINEAR_EXPERIMENT_ROW_SCALAR = 1                     the staged product read 1 float at a time
# Unset, the kernels are v30's (compile-time branches).
#  1. The tensor-core test with ROW=both; if it fails, with fwd, bwd and both + SCALAR, to tell
#     which construct fails.
#  2. `bench op` at T = 2048, 8192: v30 (unset) and each variant that passed.
# bin-gpu/: loglinear-v31y.xz, tests/kernels.xz (v31y). At most eight files under $OUT.
set -u
export CUDA_PATH=/usr/local/cuda
export LD_LIBRARY_PATH=$CUDA_PATH/lib64:${LD_LIBRARY_PATH:-}
SECONDS=0
LIMIT=${LIMIT:-540}
xz -dc bin-gpu/loglinear-v31y.xz > /tmp/ll && chmod +x /tmp/ll
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv | tee $OUT/op.txt
mkdir -p /tmp/t
tc_test() { # label, env...
  local label=$1; shift
  env "$@" OUT=/tmp/t/$label timeout 150 scripts/gpu-test.sh tensor_core_kernels mamba2 \
    fused_takes_half fused_walks_long > /tmp/t/$label.txt 2>&1
  local rc=$?
  echo "tests $label rc=$rc ($SECONDS s)" | tee -a $OUT/tests.txt
  grep -E "^test |test result|verification|Expected operand" /tmp/t/$label.txt | sort -u \
    | head -12 | tee -a $OUT/tests.txt
  return $rc
}
passed=()
if tc_test both LOGLINEAR_EXPERIMENT_ROW_EPILOGUE=both; then
  passed+=(both)
else
  for v in fwd bwd; do
    tc_test $v LOGLINEAR_EXPERIMENT_ROW_EPILOGUE=$v && passed+=($v)
  done
  tc_test both-scalar LOGLINEAR_EXPERIMENT_ROW_EPILOGUE=both LOGLINEAR_EXPERIMENT_ROW_SCALAR=1 \
    && passed+=(both-scalar)
fi
echo "passed: ${passed[*]:-none}" | tee -a $OUT/tests.txt
bench() { # label, env...
  local label=$1; shift
  local left=$(( LIMIT - SECONDS - 5 )); (( left > 120 )) && left=120
  (( left > 40 )) || return
  echo "== $label ($SECONDS s)" >> $OUT/op.txt
  env "$@" LOGLINEAR_KERNEL_CACHE=/tmp/cache timeout $left /tmp/ll bench op \
    --device cuda --dtype bf16 --runs 3 --forms fused --t 2048,8192 >> $OUT/op.txt 2>&1
  echo "bench $label rc=$? ($SECONDS s)"
}
bench v30 X=1
for v in "${passed[@]}"; do
  case $v in
    both) bench row-both LOGLINEAR_EXPERIMENT_ROW_EPILOGUE=both
          bench row-bwd LOGLINEAR_EXPERIMENT_ROW_EPILOGUE=bwd
          bench row-fwd LOGLINEAR_EXPERIMENT_ROW_EPILOGUE=fwd
          bench row-both-scalar LOGLINEAR_EXPERIMENT_ROW_EPILOGUE=both LOGLINEAR_EXPERIMENT_ROW_SCALAR=1 ;;
    both-scalar) bench row-both-scalar LOGLINEAR_EXPERIMENT_ROW_EPILOGUE=both LOGLINEAR_EXPERIMENT_ROW_SCALAR=1 ;;
    *) bench row-$v LOGLINEAR_EXPERIMENT_ROW_EPILOGUE=$v ;;
  esac
done
bench v30-again X=1
grep -E "^==|^\| fused|correctness|rror" $OUT/op.txt
echo "done ($SECONDS s)"
