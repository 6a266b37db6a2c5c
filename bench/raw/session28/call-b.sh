#!/usr/bin/env bash
# Session 28, call B (binary and kernel tests of the committed v12 kernels, built from e9a25d1):
# anchors, the CUDA kernel tests, and where the backward's warps wait (ncu, T = 8192).
set -u
export CUDA_PATH=/usr/local/cuda
export LD_LIBRARY_PATH=$CUDA_PATH/lib64:${LD_LIBRARY_PATH:-}
export LOGLINEAR_KERNEL_CACHE=/tmp/loglinear-kernel-cache
xz -dc bin-gpu/loglinear.xz > /tmp/loglinear && chmod +x /tmp/loglinear
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv > $OUT/op-v12.txt
SECONDS=0
timeout 150 /tmp/loglinear bench op --device cuda --dtype bf16 --runs 10 --forms fused \
  --t 2048,8192,32768,131072 >> $OUT/op-v12.txt 2>&1; echo "op rc=$? ($SECONDS s)"
grep -E "^\| fused|check|error" $OUT/op-v12.txt | head -20
timeout 240 scripts/gpu-test.sh > /dev/null 2>&1; echo "gpu-test rc=$? ($SECONDS s)"
grep -E "^test result|FAILED|panicked" $OUT/gpu-test.txt | head -20
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
left=$(( 570 - SECONDS ))
timeout $left $ncu --clock-control none --set full -k regex:backward_tc --launch-skip 2 --launch-count 2 \
  -f -o /tmp/bwd /tmp/loglinear bench op --device cuda --dtype bf16 --runs 1 --forms fused --t 8192 \
  > $OUT/ncu-run.txt 2>&1; echo "ncu rc=$? ($SECONDS s)"
if [[ -f /tmp/bwd.ncu-rep ]]; then
  $ncu --import /tmp/bwd.ncu-rep --page details > $OUT/ncu-details.txt 2>&1
  python3 scripts/ncu-stalls.py /tmp/bwd.ncu-rep 40 > $OUT/ncu-stalls.txt 2>&1
  cp /tmp/bwd.ncu-rep $OUT/
  grep -E "backward_tc|Duration|Grid Size|Registers|Warp Cycles Per Issued" $OUT/ncu-details.txt
  head -60 $OUT/ncu-stalls.txt
fi
echo "done ($SECONDS s)"
