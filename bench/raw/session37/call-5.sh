#!/usr/bin/env bash
# Session 37, call 5 (run inline on the same warm machine; kept here as run): v29x's kernel
# tests on CUDA with LOGLINEAR_EXPERIMENT_WEIGHTS=approx (the arithmetic adopted as v30).
export CUDA_PATH=/usr/local/cuda LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH; LOGLINEAR_EXPERIMENT_WEIGHTS=approx OUT=$OUT/t1 timeout 190 scripts/gpu-test.sh tensor_core_kernels mamba2 fused_over_segments fused_passes_walk fused_walks_long fused_takes_half > $OUT/tests-approx.txt 2>&1; echo "rc=$?"; grep -E "^test |test result|panicked" $OUT/tests-approx.txt | head
