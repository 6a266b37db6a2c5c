#!/usr/bin/env bash
# Session 35, call 5 (for the next GPU session): where v24's forward+backward goes where it walks
# segments — every kernel of `bench op --runs 1` at B = 1, T = 131,072 (both passes in segments
# of 8,192) and T = 32,768 × 4 (forward whole, backward in segments), timed by ncu (serialized)
# and summed per kernel name by scripts/ncu-kernel-sums.py (the check's small launches and the
# warm-up included: compare kernels, not totals). bin-gpu/: loglinear.xz (v24 at HEAD).
set -u
export CUDA_PATH=/usr/local/cuda
export LD_LIBRARY_PATH=$CUDA_PATH/lib64:${LD_LIBRARY_PATH:-}
SECONDS=0
LIMIT=${LIMIT:-400}
xz -dc bin-gpu/loglinear.xz > /tmp/ll && chmod +x /tmp/ll
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv | tee $OUT/ncu.txt
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
for t in 131072 32768; do
  left=$(( LIMIT - SECONDS - 10 )); (( left < 60 )) && break; (( left > 170 )) && left=170
  LOGLINEAR_KERNEL_CACHE=/tmp/cache timeout $left $ncu --metrics gpu__time_duration.sum --csv \
    --print-units base /tmp/ll bench op --device cuda --dtype bf16 --runs 1 --forms fused \
    --t $t > /tmp/ncu-$t.csv 2> $OUT/ncu-$t.err
  echo "ncu T=$t rc=$? ($SECONDS s)" | tee -a $OUT/ncu.txt
  xz -T0 -c /tmp/ncu-$t.csv > $OUT/ncu-$t.csv.xz
  python3 scripts/ncu-kernel-sums.py /tmp/ncu-$t.csv | tee -a $OUT/ncu.txt
done
echo "done ($SECONDS s)"
