#!/usr/bin/env bash
# Session 41, call 4 (same machine as call 3; the command as it ran, one line there): the whole
# CUDA kernel suite with v37 (v38x's binary and tests, switches unset), then v37 against
# WEIGHT_BLOCKS at T = 2048, alternating, one process each.
export CUDA_PATH=/usr/local/cuda LD_LIBRARY_PATH=/usr/local/cuda/lib64; SECONDS=0; OUT0=$OUT
OUT=/tmp/t2 timeout 250 scripts/gpu-test.sh > $OUT0/suite.txt 2>&1
echo "suite rc=$? ($SECONDS s)"; grep -E "test result|FAILED|panicked" $OUT0/suite.txt | head
for v in X=1 LOGLINEAR_EXPERIMENT_WEIGHT_BLOCKS=1 X=1 LOGLINEAR_EXPERIMENT_WEIGHT_BLOCKS=1; do
  (( SECONDS < 330 )) || break
  echo "== $v ($SECONDS s)" >> $OUT0/op.txt
  # /tmp/ll: call 3's decompressed bin-gpu/loglinear-v38x.xz, still on the machine.
  env $v LOGLINEAR_KERNEL_CACHE=/tmp/cache timeout 60 /tmp/ll bench op --device cuda \
    --dtype bf16 --runs 3 --forms fused --t 2048 >> $OUT0/op.txt 2>&1
done
grep -E "^==|^\| fused" $OUT0/op.txt; echo "done $SECONDS"
