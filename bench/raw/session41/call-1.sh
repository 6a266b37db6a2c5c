#!/usr/bin/env bash
# For the next GPU session (written in session 40), call 1 of 2 (then `next-call-2.sh`): v37x's
# three backward switches on v35, each alone and all together, against v35 (switches unset). `bench op`'s own check (o and every
# gradient against f64 at two shapes, tolerance 3e-2) gates each variant's timings; the kernel
# tests with the switches follow if time remains.
# bin-gpu/: loglinear-v37x.xz and tests/kernels.xz, built from `77921f7` +
# bench/raw/session40/v37x-experiment.diff (`scripts/build-gpu.sh --tests` in a worktree; the
# compile check and the ptxas report run at its end — set the switches to check a variant).
# Switches (unset: v35's kernels):
#   LOGLINEAR_EXPERIMENT_DL_STAGED=1          causal backward: dλ rows in shared memory, written
#                                             once per chunk, coalesced
#   LOGLINEAR_EXPERIMENT_DGAMMA_PREFETCH=1    anticausal backward: the causal dΓ of a chunk's rows
#                                             loaded with its inputs (v33x's)
#   LOGLINEAR_EXPERIMENT_ROW_VECTOR_STORES=1  causal backward: four dq values a store (v33x's)
#   LOGLINEAR_EXPERIMENT_FORWARD_PT=16|32|64  the tensor-core forward's value tile (planner only;
#                                             `next-call-2.sh`)
# At most eight files come back from $OUT. LIMIT: seconds.
set -u
export CUDA_PATH=/usr/local/cuda
export LD_LIBRARY_PATH=$CUDA_PATH/lib64:${LD_LIBRARY_PATH:-}
SECONDS=0
LIMIT=${LIMIT:-560}
xz -dc bin-gpu/loglinear-v37x.xz > /tmp/ll && chmod +x /tmp/ll
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv | tee $OUT/op.txt
bench() { # label, t list, env...
  local label=$1 ts=$2; shift 2
  local left=$(( LIMIT - SECONDS - 5 )); (( left > 150 )) && left=150
  (( left > 50 )) || return
  echo "== $label T=$ts ($SECONDS s)" >> $OUT/op.txt
  # One kernel cache for all variants: the switches change the kernels' compile-time geometry,
  # so each variant compiles its own, and the unchanged ones are reused.
  env "$@" LOGLINEAR_KERNEL_CACHE=/tmp/cache timeout $left /tmp/ll bench op \
    --device cuda --dtype bf16 --runs 3 --forms fused --t $ts >> $OUT/op.txt 2>&1
  echo "bench $label rc=$? ($SECONDS s)"
}
bench v35 2048,8192 X=1
bench all-three 2048,8192 LOGLINEAR_EXPERIMENT_DL_STAGED=1 LOGLINEAR_EXPERIMENT_DGAMMA_PREFETCH=1 \
  LOGLINEAR_EXPERIMENT_ROW_VECTOR_STORES=1
bench dl-staged 2048 LOGLINEAR_EXPERIMENT_DL_STAGED=1
bench dgamma-prefetch 2048 LOGLINEAR_EXPERIMENT_DGAMMA_PREFETCH=1
bench row-vector-stores 2048 LOGLINEAR_EXPERIMENT_ROW_VECTOR_STORES=1
bench v35-again 2048 X=1
grep -E "^==|^\| fused|correctness|rror" $OUT/op.txt
# The tensor-core and half-precision kernel tests with all three switches.
left=$(( LIMIT - SECONDS - 5 ))
if (( left > 60 )); then
  LOGLINEAR_EXPERIMENT_DL_STAGED=1 LOGLINEAR_EXPERIMENT_DGAMMA_PREFETCH=1 \
    LOGLINEAR_EXPERIMENT_ROW_VECTOR_STORES=1 OUT=/tmp/t1 timeout $left scripts/gpu-test.sh \
    tensor_core_kernels_match fused_takes_half_precision > $OUT/tests-all.txt 2>&1
  echo "tests (all three) rc=$? ($SECONDS s)" | tee -a $OUT/tests.txt
  grep -E "^test |test result|panicked|FAILED" $OUT/tests-all.txt | head -20 | tee -a $OUT/tests.txt
fi
echo "done ($SECONDS s)"
