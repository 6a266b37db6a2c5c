#!/usr/bin/env bash
# Session 39, call 1: v32 (the committed kernels) on CUDA for the first time, and the switches of
# v34x = v32 + `bench/raw/session38/v33x-experiment.diff` + `bench/raw/session39/v34x-experiment.diff`
# (unset, its kernels are v32's):
#   LOGLINEAR_EXPERIMENT_FORWARD_REGISTERS=1  the forward keeps its output tiles in the tensor
#                                             cores' accumulators across S̃V and the level
#                                             products, staged once per chunk
#   LOGLINEAR_EXPERIMENT_FORWARD_CHUNK_128=1   the forward in chunks of 128 tokens, 512 units a
#                                             cube, where one walk covers each sequence
#   (v33x's three switches were left for a call 2, which did not run: no device time was left.)
#  1. Kernel tests: v32 (tensor-core, Mamba-2, half precision); each switch with the
#     tensor-core and Mamba-2 tests (both reach the changed forward).
#  2. `bench op` at T = 2048, 8192: v32, each variant that passed (and both switches together
#     if both passed), v32 again.
# bin-gpu/: loglinear-v34x.xz, tests/kernels.xz (v34x). LIMIT: seconds.
set -u
export CUDA_PATH=/usr/local/cuda
export LD_LIBRARY_PATH=$CUDA_PATH/lib64:${LD_LIBRARY_PATH:-}
SECONDS=0
LIMIT=${LIMIT:-560}
xz -dc bin-gpu/loglinear-v34x.xz > /tmp/ll && chmod +x /tmp/ll
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv | tee $OUT/op.txt
mkdir -p /tmp/t
tc_test() { # label, timeout, filters..., then -- env...
  local label=$1 limit=$2; shift 2
  local filters=(); while [ "$1" != -- ]; do filters+=("$1"); shift; done; shift
  env "$@" OUT=/tmp/t/$label timeout $limit scripts/gpu-test.sh "${filters[@]}" \
    > /tmp/t/$label.txt 2>&1
  local rc=$?
  echo "tests $label rc=$rc ($SECONDS s)" | tee -a $OUT/tests.txt
  grep -E "^test |test result|verification|Expected operand|panicked|error" /tmp/t/$label.txt \
    | sort -u | head -12 | tee -a $OUT/tests.txt
  return $rc
}
tc_test v32 100 tensor_core_kernels mamba2 fused_takes_half -- X=1 \
  || echo "v32 FAILED" | tee -a $OUT/tests.txt
variants=()
tc_test regs 80 tensor_core_kernels mamba2 -- LOGLINEAR_EXPERIMENT_FORWARD_REGISTERS=1 \
  && variants+=(regs)
tc_test c128 80 tensor_core_kernels mamba2 -- LOGLINEAR_EXPERIMENT_FORWARD_CHUNK_128=1 \
  && variants+=(c128)
[ "${variants[*]}" = "regs c128" ] && variants+=(c128-regs)
bench() { # label, env...
  local label=$1; shift
  local left=$(( LIMIT - SECONDS - 5 )); (( left > 100 )) && left=100
  (( left > 45 )) || return
  echo "== $label ($SECONDS s)" >> $OUT/op.txt
  env "$@" LOGLINEAR_KERNEL_CACHE=/tmp/cache timeout $left /tmp/ll bench op \
    --device cuda --dtype bf16 --runs 3 --forms fused --t 2048,8192 >> $OUT/op.txt 2>&1
  echo "bench $label rc=$? ($SECONDS s)"
}
bench v32 X=1
for v in "${variants[@]}"; do
  case $v in
    regs) bench v34x-regs LOGLINEAR_EXPERIMENT_FORWARD_REGISTERS=1 ;;
    c128) bench v34x-c128 LOGLINEAR_EXPERIMENT_FORWARD_CHUNK_128=1 ;;
    c128-regs) bench v34x-c128-regs LOGLINEAR_EXPERIMENT_FORWARD_CHUNK_128=1 \
                 LOGLINEAR_EXPERIMENT_FORWARD_REGISTERS=1 ;;
  esac
done
bench v32-again X=1
grep -E "^==|^\| fused|correctness|rror" $OUT/op.txt
echo "done ($SECONDS s)"
