#!/usr/bin/env bash
# Session 36, call 1: session 35 call-4.sh as run (LIMIT=540): v25 against v24.
# Session 35, call 4 (for the next GPU session): "v25" = v24 (HEAD) +
# bench/raw/session35/v25-forward-async-copies.diff — the forward takes the chunk's key state
# before its level reads (the level it writes starts from that state, so `kb` and `vb` are free
# early) and copies the next chunk's k and value tile into them with `cp.async` (CubeCL's
# `copy_async` committed to a shared `Barrier`) while the level reads run; Mamba-2's one state is
# no longer read twice a chunk. Only the tensor-core forward changes. Correctness first (v25's
# kernel tests on CUDA: a wrong copy, a missed wait or a bad zero fill shows as a mismatch
# against f64, or as NaN from the poisoned tails), then `bench op` at the four anchors v25 then
# v24, then Nsight Compute of one forward at T = 8192 × 16 of each (`--set full`).
# bin-gpu/: loglinear.xz (v24 at HEAD), loglinear-v25.xz, tests/kernels.xz (v25).
set -u
export CUDA_PATH=/usr/local/cuda
export LD_LIBRARY_PATH=$CUDA_PATH/lib64:${LD_LIBRARY_PATH:-}
SECONDS=0
LIMIT=${LIMIT:-570}
xz -dc bin-gpu/loglinear.xz > /tmp/ll-v24 && chmod +x /tmp/ll-v24
xz -dc bin-gpu/loglinear-v25.xz > /tmp/ll-v25 && chmod +x /tmp/ll-v25
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv | tee $OUT/op.txt
OUT=$OUT/t1 timeout 200 scripts/gpu-test.sh tensor_core_kernels mamba2 fused_over_segments \
  fused_walks fused_passes_walk fused_takes_half > $OUT/tests.txt 2>&1
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
if grep -q "tensor_core_kernels_match_reference_in_bf16 ... ok" $OUT/tests.txt; then
  go && bench v25 5 2048,8192
  go && bench v24 5 2048,8192
  go && bench v25 3 32768,131072
  go && bench v24 3 32768,131072
fi
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
for v in v25 v24; do
  go 120 || break
  LOGLINEAR_KERNEL_CACHE=/tmp/cache-$v timeout 110 $ncu --clock-control none --set full \
    -k regex:causal_tc_kernel --launch-skip 3 --launch-count 1 -f -o /tmp/fwd-$v \
    /tmp/ll-$v bench op --device cuda --dtype bf16 --runs 1 --forms fused --t 8192 \
    > $OUT/ncu-run-$v.txt 2>&1; echo "ncu $v rc=$? ($SECONDS s)"
  if [[ -f /tmp/fwd-$v.ncu-rep ]]; then
    $ncu --import /tmp/fwd-$v.ncu-rep --page details > $OUT/ncu-details-$v.txt 2>&1
    python3 scripts/ncu-stalls.py /tmp/fwd-$v.ncu-rep 60 > $OUT/ncu-stalls-$v.txt 2>&1
    $ncu --import /tmp/fwd-$v.ncu-rep --csv --page source --print-source sass 2>/dev/null | xz -T0 > $OUT/ncu-sass-$v.csv.xz
    grep -E "Grid Size|Duration|Registers Per|Warp Cycles Per Issued|Executed Ipc A|Achieved Occ|DRAM Throughput|L2 Hit" $OUT/ncu-details-$v.txt
    head -20 $OUT/ncu-stalls-$v.txt
  fi
done
grep -E "^==|^\| fused|correctness|rror|NVIDIA" $OUT/op.txt
echo "done ($SECONDS s)"
