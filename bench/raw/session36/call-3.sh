#!/usr/bin/env bash
# Session 36, call 3 (run inline on the same warm machine; kept here as run): the forward's first
# Nsight Compute profiles at the benchmark's shapes — v24's `causal_tc_kernel` at T = 2048 × 64
# and 8192 × 16 (`--launch-skip 4`: past the check's four launches), `--set full`, clocks not
# locked; details, stall summary (scripts/ncu-stalls.py) and the SASS source page.
export CUDA_PATH=/usr/local/cuda LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH
xz -dc bin-gpu/loglinear.xz > /tmp/ll && chmod +x /tmp/ll
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu); SECONDS=0
for t in 2048 8192; do
  timeout 150 $ncu --clock-control none --set full -k regex:causal_tc_kernel --launch-skip 4 \
    --launch-count 1 -f -o /tmp/fwd-$t /tmp/ll bench op --device cuda --dtype bf16 --runs 1 \
    --forms fused --t $t > $OUT/ncu-run-$t.txt 2>&1; echo "ncu $t rc=$? $SECONDS s"
  $ncu --import /tmp/fwd-$t.ncu-rep --page details > $OUT/ncu-details-$t.txt 2>&1
  python3 scripts/ncu-stalls.py /tmp/fwd-$t.ncu-rep 60 > $OUT/ncu-stalls-$t.txt 2>&1
  $ncu --import /tmp/fwd-$t.ncu-rep --csv --page source --print-source sass 2>/dev/null \
    | xz -T0 > $OUT/ncu-sass-$t.csv.xz
done
