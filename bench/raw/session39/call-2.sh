#!/usr/bin/env bash
# Session 39, call 2, on call 1's warm machine (same bin-gpu/: loglinear-v34x.xz, tests/kernels.xz):
#  1. The whole CUDA kernel suite with WIN_ENV (call 1's winning switches, e.g.
#     "LOGLINEAR_EXPERIMENT_FORWARD_REGISTERS=1"; X=1 for none).
#  2. v33x's switches (session 38, never run): the tensor-core test with the forward's rows and
#     vector stores, and with the anticausal backward's dΓ prefetch; `bench op` at T = 2048,
#     8192 for each that passes, on top of WIN_ENV, and WIN_ENV alone.
#  3. The long anchors (T = 32,768 × 4, 131,072 × 1) with WIN_ENV.
# LIMIT: seconds.
set -u
export CUDA_PATH=/usr/local/cuda
export LD_LIBRARY_PATH=$CUDA_PATH/lib64:${LD_LIBRARY_PATH:-}
SECONDS=0
LIMIT=${LIMIT:-560}
WIN_ENV=${WIN_ENV:-X=1}
[ -x /tmp/ll ] || { xz -dc bin-gpu/loglinear-v34x.xz > /tmp/ll && chmod +x /tmp/ll; }
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv | tee $OUT/op.txt
echo "WIN_ENV=$WIN_ENV" | tee -a $OUT/op.txt
env $WIN_ENV OUT=/tmp/t1 timeout 240 scripts/gpu-test.sh > $OUT/tests-all.txt 2>&1
echo "all tests ($WIN_ENV) rc=$? ($SECONDS s)" | tee -a $OUT/tests.txt
grep -E "test result|panicked|FAILED|verification" $OUT/tests-all.txt | head -20 | tee -a $OUT/tests.txt
mkdir -p /tmp/t
tc_test() { # label, env...
  local label=$1; shift
  env $WIN_ENV "$@" OUT=/tmp/t/$label timeout 80 scripts/gpu-test.sh tensor_core_kernels \
    > /tmp/t/$label.txt 2>&1
  local rc=$?
  echo "tests $label rc=$rc ($SECONDS s)" | tee -a $OUT/tests.txt
  grep -E "^test |verification|Expected operand|panicked" /tmp/t/$label.txt | sort -u | head -8 \
    | tee -a $OUT/tests.txt
  return $rc
}
variants=()
tc_test fwd-vec LOGLINEAR_EXPERIMENT_ROW_FORWARD=1 LOGLINEAR_EXPERIMENT_ROW_VECTOR_STORES=1 \
  && variants+=(fwd-vec)
tc_test dgamma LOGLINEAR_EXPERIMENT_DGAMMA_PREFETCH=1 && variants+=(dgamma)
bench() { # label, t list, env...
  local label=$1 ts=$2; shift 2
  local left=$(( LIMIT - SECONDS - 5 )); (( left > 100 )) && left=100
  (( left > 45 )) || return
  echo "== $label T=$ts ($SECONDS s)" >> $OUT/op.txt
  env $WIN_ENV "$@" LOGLINEAR_KERNEL_CACHE=/tmp/cache timeout $left /tmp/ll bench op \
    --device cuda --dtype bf16 --runs 3 --forms fused --t $ts >> $OUT/op.txt 2>&1
  echo "bench $label rc=$? ($SECONDS s)"
}
bench win 2048,8192 X=1
for v in "${variants[@]}"; do
  case $v in
    fwd-vec) bench win+fwd-vec 2048,8192 LOGLINEAR_EXPERIMENT_ROW_FORWARD=1 \
               LOGLINEAR_EXPERIMENT_ROW_VECTOR_STORES=1 ;;
    dgamma) bench win+dgamma 2048,8192 LOGLINEAR_EXPERIMENT_DGAMMA_PREFETCH=1 ;;
  esac
done
bench win-long 32768,131072 X=1
grep -E "^==|^\| fused|correctness|rror" $OUT/op.txt
echo "done ($SECONDS s)"
