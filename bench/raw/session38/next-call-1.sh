#!/usr/bin/env bash
# For the next GPU session (written in session 38), call 1 of 2: v32 (the committed kernels:
# v30 + the causal backward's row-owner level epilogues) on CUDA for the first time, against v30,
# and the v33x experiment.
# v33x = v32 + `bench/raw/session38/v33x-experiment.diff`; unset, its kernels are v32's
# (compile-time branches), so its binaries serve as v32:
#   LOGLINEAR_EXPERIMENT_ROW_FORWARD=1        the forward's level epilogues by rows too (v31y's
#                                             `fwd`, which lost 6–10 % in session 38)
#   LOGLINEAR_EXPERIMENT_ROW_VECTOR_STORES=1  the row epilogues store four outputs (o, dq) in
#                                             one store through a vector view of the output
#   LOGLINEAR_EXPERIMENT_DGAMMA_PREFETCH=1    the anticausal backward loads the causal kernel's
#                                             dΓ of a chunk's rows with the chunk's inputs
# v30 = v31y's binary with its switches unset.
#  1. The tensor-core, Mamba-2, segment, planned-segment, mixed-walk and half-precision kernel
#     tests, switches unset (= v32); then the tensor-core and half-precision tests with the two
#     row switches (and, if they fail, with each alone, to tell which construct fails), and the
#     tensor-core test with the dΓ prefetch.
#  2. `bench op` at T = 2048, 8192: v32, v30, v33x's variants that passed, v32 again.
# bin-gpu/: loglinear-v33x.xz, loglinear-v31y.xz, tests/kernels.xz (v33x). LIMIT: seconds.
# At most eight files come back from $OUT.
set -u
export CUDA_PATH=/usr/local/cuda
export LD_LIBRARY_PATH=$CUDA_PATH/lib64:${LD_LIBRARY_PATH:-}
SECONDS=0
LIMIT=${LIMIT:-560}
xz -dc bin-gpu/loglinear-v33x.xz > /tmp/ll-v32 && chmod +x /tmp/ll-v32
xz -dc bin-gpu/loglinear-v31y.xz > /tmp/ll-v30 && chmod +x /tmp/ll-v30
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv | tee $OUT/op.txt
mkdir -p /tmp/t
tc_test() { # label, timeout, filters..., then -- env...
  local label=$1 limit=$2; shift 2
  local filters=(); while [ "$1" != -- ]; do filters+=("$1"); shift; done; shift
  env "$@" OUT=/tmp/t/$label timeout $limit scripts/gpu-test.sh "${filters[@]}" \
    > /tmp/t/$label.txt 2>&1
  local rc=$?
  echo "tests $label rc=$rc ($SECONDS s)" | tee -a $OUT/tests.txt
  grep -E "^test |test result|verification|Expected operand|panicked" /tmp/t/$label.txt \
    | sort -u | head -12 | tee -a $OUT/tests.txt
  return $rc
}
tc_test v32 150 tensor_core_kernels mamba2 fused_over_segments fused_passes_walk \
  fused_walks_long fused_takes_half -- X=1 || echo "v32 FAILED" | tee -a $OUT/tests.txt
variants=()
if tc_test fwd-vec 100 tensor_core_kernels fused_takes_half -- \
    LOGLINEAR_EXPERIMENT_ROW_FORWARD=1 LOGLINEAR_EXPERIMENT_ROW_VECTOR_STORES=1; then
  variants=(fwd-vec)
else
  # Which switch fails: the vector stores alone (dq in the backward only: the forward's rows
  # are off), then the forward's rows alone (v31y's `fwd`, which passed in session 38).
  tc_test vec 100 tensor_core_kernels -- LOGLINEAR_EXPERIMENT_ROW_VECTOR_STORES=1 \
    && variants+=(vec)
  tc_test fwd 100 tensor_core_kernels -- LOGLINEAR_EXPERIMENT_ROW_FORWARD=1 && variants+=(fwd)
fi
tc_test dgamma 100 tensor_core_kernels -- LOGLINEAR_EXPERIMENT_DGAMMA_PREFETCH=1 \
  && variants+=(dgamma)
# dq's vector stores alone last (the row switches' pair is measured first).
[ "${variants[0]:-}" = fwd-vec ] && variants+=(vec)
bench() { # label, binary, env...
  local label=$1 bin=$2; shift 2
  local left=$(( LIMIT - SECONDS - 5 )); (( left > 110 )) && left=110
  (( left > 45 )) || return
  echo "== $label ($SECONDS s)" >> $OUT/op.txt
  env "$@" LOGLINEAR_KERNEL_CACHE=/tmp/cache-$bin timeout $left /tmp/ll-$bin bench op \
    --device cuda --dtype bf16 --runs 3 --forms fused --t 2048,8192 >> $OUT/op.txt 2>&1
  echo "bench $label rc=$? ($SECONDS s)"
}
bench v32 v32 X=1
bench v30 v30 X=1
for v in "${variants[@]}"; do
  case $v in
    fwd-vec) bench v33x-fwd-vec v32 LOGLINEAR_EXPERIMENT_ROW_FORWARD=1 \
               LOGLINEAR_EXPERIMENT_ROW_VECTOR_STORES=1 ;;
    vec) bench v33x-vec v32 LOGLINEAR_EXPERIMENT_ROW_VECTOR_STORES=1 ;;
    fwd) bench v33x-fwd v32 LOGLINEAR_EXPERIMENT_ROW_FORWARD=1 ;;
    dgamma) bench v33x-dgamma v32 LOGLINEAR_EXPERIMENT_DGAMMA_PREFETCH=1 ;;
  esac
done
bench v32-again v32 X=1
grep -E "^==|^\| fused|correctness|rror" $OUT/op.txt
echo "done ($SECONDS s)"
