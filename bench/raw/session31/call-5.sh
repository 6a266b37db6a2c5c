#!/usr/bin/env bash
# Session 31, call 5: Nsight Compute (`--set full`) of v17's two backward kernels at T = 8192,
# B = 16 (the warm-up launches after the check's): where the backward waits now that the glue is
# gone and the redundant barriers are dropped — for the next kernel step.
set -u
export CUDA_PATH=/usr/local/cuda
export LD_LIBRARY_PATH=$CUDA_PATH/lib64:${LD_LIBRARY_PATH:-}
SECONDS=0
xz -dc bin-gpu/loglinear.xz > /tmp/ll-v17 && chmod +x /tmp/ll-v17
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv | tee $OUT/ncu-run.txt
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
LOGLINEAR_KERNEL_CACHE=/tmp/cache-v17 timeout 170 $ncu --clock-control none --set full \
  -k regex:backward_tc --launch-skip 2 --launch-count 2 -f -o /tmp/bwd \
  /tmp/ll-v17 bench op --device cuda --dtype bf16 --runs 1 --forms fused --t 8192 \
  >> $OUT/ncu-run.txt 2>&1; echo "ncu rc=$? ($SECONDS s)"
if [[ -f /tmp/bwd.ncu-rep ]]; then
  $ncu --import /tmp/bwd.ncu-rep --page details > $OUT/ncu-details.txt 2>&1
  python3 scripts/ncu-stalls.py /tmp/bwd.ncu-rep 60 > $OUT/ncu-stalls.txt 2>&1
  $ncu --import /tmp/bwd.ncu-rep --csv --page source --print-source sass 2>/dev/null | xz -T0 > $OUT/ncu-sass.csv.xz
  grep -E "backward_tc|Duration|Registers Per|Warp Cycles Per Issued|Executed Ipc A" $OUT/ncu-details.txt
  head -40 $OUT/ncu-stalls.txt
fi
echo "done ($SECONDS s)"
