#!/usr/bin/env bash
# Session 35, call 1. v22 as committed at HEAD (9dd2d88: v22 of ba68446 with the state helpers
# sharing one load, 010c9ea) — its first run on a GPU. Correctness first (the kernel tests on
# CUDA that cover the tensor-core kernels, the walks, the mixed-walk test, the helper probe),
# then `bench op` (every form checked against the f64 parallel form before timing) at the four
# anchors, then Nsight Compute (`--set full`) of one forward launch at T = 8192 × 16 — the
# forward has never been profiled, and it is the furthest from its target (10 ms vs 5.9) — and,
# time allowing, v17 at the anchors (no H200 figures after v16).
# bin-gpu/: loglinear.xz (v22 at HEAD), tests/kernels.xz (same build), loglinear-v17.xz.
set -u
export CUDA_PATH=/usr/local/cuda
export LD_LIBRARY_PATH=$CUDA_PATH/lib64:${LD_LIBRARY_PATH:-}
SECONDS=0
LIMIT=${LIMIT:-570}
xz -dc bin-gpu/loglinear.xz > /tmp/ll-v22 && chmod +x /tmp/ll-v22
xz -dc bin-gpu/loglinear-v17.xz > /tmp/ll-v17 && chmod +x /tmp/ll-v17
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv | tee $OUT/op.txt
OUT=$OUT/t1 timeout 200 scripts/gpu-test.sh tensor_core_kernels fused_passes_walk mamba2 \
  fused_over_segments fused_walks fused_takes_half vector_helpers > $OUT/tests.txt 2>&1
echo "tests rc=$? ($SECONDS s)"
grep -E "^test |test result|panicked|max_rel|off by" $OUT/tests.txt | head -20
bench() { # version, runs, T list
  local v=$1 runs=$2 t=$3
  local left=$(( LIMIT - SECONDS - 5 )); (( left > 220 )) && left=220
  echo "== $v T=$t ($SECONDS s)" >> $OUT/op.txt
  LOGLINEAR_KERNEL_CACHE=/tmp/cache-$v timeout $left /tmp/ll-$v bench op --device cuda \
    --dtype bf16 --runs $runs --forms fused --t $t >> $OUT/op.txt 2>&1
  echo "$v T=$t rc=$? ($SECONDS s)"
}
go() { (( SECONDS < LIMIT - ${1:-90} )); }
go && bench v22 5 2048,8192,32768,131072
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
if go 150; then
  LOGLINEAR_KERNEL_CACHE=/tmp/cache-v22 timeout 140 $ncu --clock-control none --set full \
    -k regex:causal_tc_kernel --launch-skip 3 --launch-count 1 -f -o /tmp/fwd \
    /tmp/ll-v22 bench op --device cuda --dtype bf16 --runs 1 --forms fused --t 8192 \
    > $OUT/ncu-run.txt 2>&1; echo "ncu rc=$? ($SECONDS s)"
  if [[ -f /tmp/fwd.ncu-rep ]]; then
    $ncu --import /tmp/fwd.ncu-rep --page details > $OUT/ncu-details.txt 2>&1
    python3 scripts/ncu-stalls.py /tmp/fwd.ncu-rep 60 > $OUT/ncu-stalls.txt 2>&1
    $ncu --import /tmp/fwd.ncu-rep --csv --page source --print-source sass 2>/dev/null | xz -T0 > $OUT/ncu-sass.csv.xz
    grep -E "causal_tc|Grid Size|Duration|Registers Per|Warp Cycles Per Issued|Executed Ipc A|Achieved Occ|Memory Throughput|DRAM Throughput|L2 Hit" $OUT/ncu-details.txt
    head -30 $OUT/ncu-stalls.txt
  fi
fi
go 120 && bench v17 5 2048,8192
go 120 && bench v17 3 32768,131072
grep -E "^==|^\| fused|correctness|rror|NVIDIA" $OUT/op.txt
echo "done ($SECONDS s)"
