#!/usr/bin/env bash
# Session 44 call 2: run as written in session 43 with LIMIT=450, on the same H100 right after call 1.
# For the next GPU session (written in session 43), after next-call.sh, on the same binaries with
# every switch unset (v40's kernels as committed): the whole CUDA kernel suite, which has not run
# on v40 (`--nocapture`: the tensor-core tests print each output's and gradient's error, the
# baseline for v41z's rounding), then Nsight Compute of the tensor-core forward and the causal
# backward at T = 2048 × 64 (grid 3,072; neither profiled since session 38). At most eight files
# come back.
# LIMIT: seconds.
set -u
export CUDA_PATH=/usr/local/cuda
export LD_LIBRARY_PATH=$CUDA_PATH/lib64:${LD_LIBRARY_PATH:-}
SECONDS=0
LIMIT=${LIMIT:-560}
[ -x /tmp/ll ] || { xz -dc bin-gpu/loglinear.xz > /tmp/ll && chmod +x /tmp/ll; }
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv | tee $OUT/summary.txt
OUT=/tmp/t-suite timeout 230 scripts/gpu-test.sh --nocapture > /tmp/suite.txt 2>&1
echo "suite rc=$? ($SECONDS s)" | tee -a $OUT/summary.txt
cp /tmp/suite.txt $OUT/suite.txt
grep -E "^test |test result|panicked|FAILED" /tmp/suite.txt | head -60 | tee -a $OUT/summary.txt
go() { (( SECONDS < LIMIT - ${1:-60} )); }
go 150 && scripts/ncu-profile.sh "^causal_tc_kernel" forward $(( LIMIT - SECONDS - 15 ))
go 150 && scripts/ncu-profile.sh "^causal_backward_tc_kernel" causal-bwd $(( LIMIT - SECONDS - 15 ))
echo "done ($SECONDS s)" | tee -a $OUT/summary.txt
