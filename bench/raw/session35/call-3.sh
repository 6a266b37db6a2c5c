#!/usr/bin/env bash
# Session 35, call 3 (replaces calls 1 and 2 when device time is short). "v24" = v22 (HEAD) +
# v23 (bench/raw/session34/v23-segment-states-tc.diff: the states across segments on tensor
# cores) + every λ and g load of a chunk issued before its first store (`load_decays`: the loop
# of load-then-store trips waited on global memory once per trip). Correctness first with v24's
# kernel tests on CUDA (tensor-core kernels, segments, walks, mixed walks, Mamba-2, half
# precision, the helper probe: they cover HEAD's kernels as well), then `bench op` (checked
# against the f64 parallel form) at the four anchors, v24 then v22 (HEAD) — at T = 2048 and
# 8192 only the load change differs (no segments there) — then, time allowing, Nsight Compute
# (`--set full`) of one v24 forward at T = 8192 × 16 (the forward has never been profiled).
# bin-gpu/: loglinear.xz (v22 at HEAD), loglinear-v24.xz, tests/kernels.xz (v24).
set -u
export CUDA_PATH=/usr/local/cuda
export LD_LIBRARY_PATH=$CUDA_PATH/lib64:${LD_LIBRARY_PATH:-}
SECONDS=0
LIMIT=${LIMIT:-570}
xz -dc bin-gpu/loglinear.xz > /tmp/ll-v22 && chmod +x /tmp/ll-v22
xz -dc bin-gpu/loglinear-v24.xz > /tmp/ll-v24 && chmod +x /tmp/ll-v24
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv | tee $OUT/op.txt
OUT=$OUT/t1 timeout 220 scripts/gpu-test.sh tensor_core_kernels fused_passes_walk mamba2 \
  fused_over_segments fused_walks fused_takes_half vector_helpers > $OUT/tests.txt 2>&1
echo "tests rc=$? ($SECONDS s)"
grep -E "^test |test result|panicked|max_rel|off by" $OUT/tests.txt | head -20
bench() { # version, runs, T list
  local v=$1 runs=$2 t=$3
  local left=$(( LIMIT - SECONDS - 5 )); (( left > 200 )) && left=200
  echo "== $v T=$t ($SECONDS s)" >> $OUT/op.txt
  LOGLINEAR_KERNEL_CACHE=/tmp/cache-$v timeout $left /tmp/ll-$v bench op --device cuda \
    --dtype bf16 --runs $runs --forms fused --t $t >> $OUT/op.txt 2>&1
  echo "$v T=$t rc=$? ($SECONDS s)"
}
go() { (( SECONDS < LIMIT - ${1:-90} )); }
go && bench v24 5 2048,8192
go && bench v22 5 2048,8192
go && bench v24 3 32768,131072
go && bench v22 3 32768,131072
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
if go 130; then
  LOGLINEAR_KERNEL_CACHE=/tmp/cache-v24 timeout $(( LIMIT - SECONDS - 15 )) $ncu --clock-control none \
    --set full -k regex:causal_tc_kernel --launch-skip 3 --launch-count 1 -f -o /tmp/fwd \
    /tmp/ll-v24 bench op --device cuda --dtype bf16 --runs 1 --forms fused --t 8192 \
    > $OUT/ncu-run.txt 2>&1; echo "ncu rc=$? ($SECONDS s)"
  if [[ -f /tmp/fwd.ncu-rep ]]; then
    $ncu --import /tmp/fwd.ncu-rep --page details > $OUT/ncu-details.txt 2>&1
    python3 scripts/ncu-stalls.py /tmp/fwd.ncu-rep 60 > $OUT/ncu-stalls.txt 2>&1
    $ncu --import /tmp/fwd.ncu-rep --csv --page source --print-source sass 2>/dev/null | xz -T0 > $OUT/ncu-sass.csv.xz
    grep -E "causal_tc|Grid Size|Duration|Registers Per|Warp Cycles Per Issued|Executed Ipc A|Achieved Occ|Memory Throughput|DRAM Throughput|L2 Hit" $OUT/ncu-details.txt
    head -30 $OUT/ncu-stalls.txt
  fi
fi
grep -E "^==|^\| fused|correctness|rror|NVIDIA" $OUT/op.txt
echo "done ($SECONDS s)"
