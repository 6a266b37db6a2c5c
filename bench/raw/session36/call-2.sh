#!/usr/bin/env bash
# Session 36, call 2 (run inline on the warm machine after call 1; kept here as run): Nsight
# Compute `--set full` of one v24 forward at T = 8192 — with `--launch-skip 3` this caught the
# check's B = 2, T = 300, H = 132 launch (grid 264), not the benchmark's, so its profile is of a
# small shape (call 3 repeats it with `--launch-skip 4`) — then session 35's call-5.sh (per-kernel
# ncu sums of v24 at T = 131,072 × 1 and 32,768 × 4) into c5/. bin-gpu/loglinear.xz = v24.
export CUDA_PATH=/usr/local/cuda LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH
xz -dc bin-gpu/loglinear.xz > /tmp/ll && chmod +x /tmp/ll
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu); SECONDS=0
timeout 150 $ncu --clock-control none --set full -k regex:causal_tc_kernel --launch-skip 3 \
  --launch-count 1 -f -o /tmp/fwd /tmp/ll bench op --device cuda --dtype bf16 --runs 1 \
  --forms fused --t 8192 > $OUT/ncu-run.txt 2>&1; echo "ncu rc=$? $SECONDS s"
$ncu --import /tmp/fwd.ncu-rep --page details > $OUT/ncu-details-v24.txt 2>&1
python3 scripts/ncu-stalls.py /tmp/fwd.ncu-rep 60 > $OUT/ncu-stalls-v24.txt 2>&1
$ncu --import /tmp/fwd.ncu-rep --csv --page source --print-source sass 2>/dev/null \
  | xz -T0 > $OUT/ncu-sass-v24.csv.xz
mkdir -p $OUT/c5; OUT=$OUT/c5 LIMIT=$((560-SECONDS)) bash bench/raw/session35/call-5.sh 2>&1 | tail -40
