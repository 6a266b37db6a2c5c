#!/usr/bin/env bash
# Session 37, call 3: "v29" = session 36's v27 changes 1 and 2 (a chunk of the tensor-core
# kernels ends with a cube barrier, not `sync_storage`; dead level states dropped from L2 by
# `discard.global.L2`) without change 3 (the triangle-run weights with `ex2.approx`, which lost
# 2 ms of the forward in call 1), plus session 36's v28 (per-row level weights in the level
# epilogues of the forward and causal backward). Built as "v29x" = v29 + one experiment switch,
# LOGLINEAR_EXPERIMENT_WEIGHTS (bench/raw/session37/v29x-weights-experiment.diff): unset = v29;
# `approx` = every weight element with `ex2.approx`; `runs` = only the triangle's 32-column runs
# with `ex2.approx`, in a loop that is not unrolled (call 1's v27x unrolled it: to tell which part
# lost).
# CUDA kernel tests first (v29x's test binary, switch unset); then `bench op` for v29 and v24
# (baseline, same machine) at T = 2048, 8192, then v29x with each switch; the forward's Nsight
# Compute profile at T = 2048 (DRAM bytes after the discards; stall regions by
# scripts/ncu-regions.py); v29 at 32768, 131072 if time is left.
# bin-gpu/: loglinear.xz (v24), loglinear-v29x.xz, tests/kernels.xz (v29x).
set -u
export CUDA_PATH=/usr/local/cuda
export LD_LIBRARY_PATH=$CUDA_PATH/lib64:${LD_LIBRARY_PATH:-}
SECONDS=0
LIMIT=${LIMIT:-560}
xz -dc bin-gpu/loglinear.xz > /tmp/ll-v24 && chmod +x /tmp/ll-v24
xz -dc bin-gpu/loglinear-v29x.xz > /tmp/ll-v29 && chmod +x /tmp/ll-v29
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv | tee $OUT/op.txt
OUT=$OUT/t1 timeout 150 scripts/gpu-test.sh tensor_core_kernels mamba2 fused_over_segments \
  fused_passes_walk > $OUT/tests.txt 2>&1
echo "tests rc=$? ($SECONDS s)"
grep -E "^test |test result|panicked|max_rel|off by" $OUT/tests.txt | head -20
bench() { # label, binary, runs, T list, env...
  local label=$1 bin=$2 runs=$3 t=$4; shift 4
  local left=$(( LIMIT - SECONDS - 5 )); (( left > 150 )) && left=150
  echo "== $label T=$t ($SECONDS s)" >> $OUT/op.txt
  env "$@" LOGLINEAR_KERNEL_CACHE=/tmp/cache-$bin timeout $left /tmp/ll-$bin bench op \
    --device cuda --dtype bf16 --runs $runs --forms fused --t $t >> $OUT/op.txt 2>&1
  echo "$label T=$t rc=$? ($SECONDS s)"
}
go() { (( SECONDS < LIMIT - ${1:-60} )); }
if grep -q "tensor_core_kernels_match_reference_in_bf16 ... ok" $OUT/tests.txt; then
  go && bench v29 v29 3 2048,8192 X=1
  go && bench v24 v24 3 2048,8192 X=1
  go && bench v29-approx v29 3 2048,8192 LOGLINEAR_EXPERIMENT_WEIGHTS=approx
  go && bench v29-runs v29 3 2048,8192 LOGLINEAR_EXPERIMENT_WEIGHTS=runs
  ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
  if go 70; then
    timeout $(( LIMIT - SECONDS - 10 )) $ncu --clock-control none --set full \
      --metrics dram__bytes_read.sum,dram__bytes_write.sum -k regex:causal_tc_kernel --launch-skip 4 --launch-count 1 -f -o /tmp/fwd-2048 \
      /tmp/ll-v29 bench op --device cuda --dtype bf16 --runs 1 --forms fused --t 2048 \
      > $OUT/ncu-run-2048.txt 2>&1
    echo "ncu 2048 rc=$? ($SECONDS s)"
    $ncu --import /tmp/fwd-2048.ncu-rep --page details > $OUT/ncu-details-2048.txt 2>&1
    $ncu --import /tmp/fwd-2048.ncu-rep --csv --page source --print-source sass 2>/dev/null \
      | xz -T0 > $OUT/ncu-sass-2048.csv.xz
    python3 scripts/ncu-regions.py $OUT/ncu-sass-2048.csv.xz > $OUT/ncu-regions-2048.txt 2>&1
    grep -E "Duration|DRAM Throughput|Registers Per|Achieved Occ|dram__bytes" $OUT/ncu-details-2048.txt
  fi
  go 100 && bench v29 v29 3 32768,131072 X=1
fi
grep -E "^==|^\| fused|correctness|rror|NVIDIA" $OUT/op.txt
echo "done ($SECONDS s)"
