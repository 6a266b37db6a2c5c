#!/usr/bin/env bash
# Session 26, call A: the variant benchmark, then the tensor-core kernel tests under each prefetch variant.
set -u
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export CUDA_PATH=/usr/local/cuda
export LOGLINEAR_KERNEL_CACHE=/tmp/loglinear-kernel-cache
SECONDS=0
VARIANTS="${VARIANTS:-0 3 4 7 11}" bash bench/raw/session26/variants.sh
xz -dc bin-gpu/tests/kernels.xz > /tmp/kt && chmod +x /tmp/kt
for x in ${TEST_VARIANTS:-3 7 11 4}; do
  (( SECONDS > ${TEST_DEADLINE:-480} )) && { echo "tests of variant $x skipped: time" | tee -a $OUT/variants.txt; continue; }
  s0=$SECONDS
  LOGLINEAR_EXPERIMENT=$x timeout 150 /tmp/kt --test-threads=1 tensor_core_kernels fused_takes_half vector_helpers > /tmp/tests-$x.txt 2>&1
  echo "tests of variant $x: rc=$? $(grep -E '^test result' /tmp/tests-$x.txt | tr '\n' ' ') ($((SECONDS-s0)) s)" | tee -a $OUT/variants.txt
done
tar czf $OUT/tests-raw.tgz -C /tmp $(cd /tmp && ls tests-*.txt)
