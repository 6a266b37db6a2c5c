#!/usr/bin/env bash
# Session 34, call 5 (for the next GPU session): "v23" = v22 + `v23-segment-states-tc.diff` (the
# states across segments — one key state per segment, one query state per segment and level —
# as tensor-core products, `segment_states_tc_kernel`, instead of scalar f32 code). Only the
# walks in segments change: T = 32,768 × 4 (backward in segments of 8,192) and B = 1,
# T = 131,072 (both passes). Correctness first: the segment tests on CUDA (bf16 segments on
# tensor cores) with v23's test binary, then `bench op` (checked against the f64 parallel form,
# segments included) v23 against v22.
# bin-gpu/: loglinear.xz (v22), loglinear-v23.xz, tests/kernels.xz (v23).
set -u
export CUDA_PATH=/usr/local/cuda
export LD_LIBRARY_PATH=$CUDA_PATH/lib64:${LD_LIBRARY_PATH:-}
SECONDS=0
xz -dc bin-gpu/loglinear.xz > /tmp/ll-v22 && chmod +x /tmp/ll-v22
xz -dc bin-gpu/loglinear-v23.xz > /tmp/ll-v23 && chmod +x /tmp/ll-v23
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv | tee $OUT/op.txt
OUT=$OUT/t1 timeout 150 scripts/gpu-test.sh fused_over_segments fused_walks fused_passes_walk \
  > $OUT/tests.txt 2>&1
echo "tests rc=$? ($SECONDS s)"
grep -E "^test |test result|panicked|max_rel" $OUT/tests.txt | head -10
for v in v23 v22; do
  echo "== $v ($SECONDS s)" >> $OUT/op.txt
  LOGLINEAR_KERNEL_CACHE=/tmp/cache-$v timeout 150 /tmp/ll-$v bench op --device cuda --dtype bf16 \
    --runs 5 --forms fused --t 32768,131072 >> $OUT/op.txt 2>&1
  echo "$v rc=$? ($SECONDS s)"
done
grep -E "^==|^\| fused|correctness|rror|NVIDIA" $OUT/op.txt
echo "done ($SECONDS s)"
