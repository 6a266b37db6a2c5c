#!/usr/bin/env bash
# Session 42, call 2 (same machine as call 1, 106 s of budget left after it): the command as it
# ran — the whole CUDA kernel suite with level 0 held and level planes under a 170 s limit, then
# `bench op` at T = 32,768 × 4 with both. /tmp/ll is call 1's v40x binary.
export CUDA_PATH=/usr/local/cuda LD_LIBRARY_PATH=/usr/local/cuda/lib64; W="LOGLINEAR_EXPERIMENT_LEVEL0_HELD=1 LOGLINEAR_EXPERIMENT_LEVEL_PLANES=1"; SECONDS=0; env $W OUT=/tmp/s timeout 170 scripts/gpu-test.sh > $OUT/suite.txt 2>&1; echo "suite rc=$? ($SECONDS s)"; grep -E "test result|FAILED|panicked" $OUT/suite.txt | head; env $W LOGLINEAR_KERNEL_CACHE=/tmp/cache timeout $((255-SECONDS)) /tmp/ll bench op --device cuda --dtype bf16 --runs 3 --forms fused --t 32768 > $OUT/op32k.txt 2>&1; echo "32k rc=$? ($SECONDS s)"; grep -E "^\| fused|correctness" $OUT/op32k.txt
