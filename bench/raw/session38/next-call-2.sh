#!/usr/bin/env bash
# For the next GPU session (written in session 38), call 2 of 2, after next-call-1.sh on the same
# warm machine (same bin-gpu/):
#  1. The whole CUDA kernel suite with v33x's test binary, switches unset (= v32).
#  2. Nsight Compute of the two backward kernels at T = 2048 × 64 (session 38 profiled v30's; v32
#     changes the causal one's level epilogues, 26.9 % of its stall samples in v30). PROFILE_ENV
#     selects a variant (e.g. PROFILE_ENV=LOGLINEAR_EXPERIMENT_ROW_VECTOR_STORES=1 if call 1
#     found it faster). The benchmark's launch (grid 3,072) is found first by a cheap
#     `launch__grid_size` pass, then profiled with `--set full`; stall regions by
#     scripts/ncu-regions.py.
#  3. The long anchors for the variant.
# Seven files under $OUT (eight come back at most).
# LIMIT: seconds.
set -u
export CUDA_PATH=/usr/local/cuda
export LD_LIBRARY_PATH=$CUDA_PATH/lib64:${LD_LIBRARY_PATH:-}
SECONDS=0
LIMIT=${LIMIT:-560}
PROFILE_ENV=${PROFILE_ENV:-X=1}
[ -x /tmp/ll-v32 ] || { xz -dc bin-gpu/loglinear-v33x.xz > /tmp/ll-v32 && chmod +x /tmp/ll-v32; }
OUT=/tmp/t1 timeout 280 scripts/gpu-test.sh > $OUT/tests-all.txt 2>&1
echo "all tests rc=$? ($SECONDS s)"
grep -E "test result|panicked|FAILED" $OUT/tests-all.txt | head -20
go() { (( SECONDS < LIMIT - ${1:-60} )); }
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
profile() { # kernel regex, file label
  local kernel=$1 label=$2 skip
  # Launch indices and grid sizes of the kernel over the check and the first timed passes.
  env $PROFILE_ENV timeout 90 $ncu --clock-control none --metrics launch__grid_size \
    -k regex:$kernel --launch-count 12 --csv /tmp/ll-v32 bench op --device cuda --dtype bf16 \
    --runs 1 --forms fused --t 2048 > /tmp/ncu-launches-$label.csv 2>/dev/null
  skip=$(python3 - "/tmp/ncu-launches-$label.csv" <<'PY'
import csv, sys
# The program's own output comes first; the CSV starts at the row that names the columns.
rows = list(csv.reader(open(sys.argv[1])))
first = next(i for i, r in enumerate(rows) if "Kernel Name" in r and "Metric Value" in r)
head, data = rows[first], rows[first + 1:]
value = head.index("Metric Value")
grids = [int(float(r[value].replace(",", ""))) for r in data if len(r) == len(head)]
print(next((i for i, g in enumerate(grids) if g == 3072), -1))
PY
)
  echo "$label: launches' grids in /tmp/ncu-launches-$label.csv; profiling launch $skip ($SECONDS s)"
  (( skip >= 0 )) || return
  env $PROFILE_ENV timeout $(( LIMIT - SECONDS - 15 )) $ncu --clock-control none --set full \
    --metrics dram__bytes_read.sum,dram__bytes_write.sum -k regex:$kernel \
    --launch-skip $skip --launch-count 1 -f -o /tmp/$label /tmp/ll-v32 bench op --device cuda \
    --dtype bf16 --runs 1 --forms fused --t 2048 > /tmp/ncu-run-$label.txt 2>&1
  echo "ncu $label rc=$? ($SECONDS s)"
  $ncu --import /tmp/$label.ncu-rep --page details > $OUT/ncu-details-$label.txt 2>&1
  $ncu --import /tmp/$label.ncu-rep --csv --page source --print-source sass 2>/dev/null \
    | xz -T0 > /tmp/ncu-sass-$label.csv.xz
  python3 scripts/ncu-regions.py /tmp/ncu-sass-$label.csv.xz > $OUT/ncu-regions-$label.txt 2>&1
  # The causal backward's SASS for reading its regions again (eight files come back at most).
  [ "$label" = causal-bwd ] && cp /tmp/ncu-sass-$label.csv.xz $OUT/
  grep -E "Duration|DRAM Throughput|Registers Per|Achieved Occ|dram__bytes" \
    $OUT/ncu-details-$label.txt
}
go 150 && profile "^causal_backward_tc_kernel" causal-bwd
go 150 && profile anticausal_backward_tc_kernel anticausal-bwd
if go 100; then
  echo "== $PROFILE_ENV T=32768,131072 ($SECONDS s)" >> $OUT/op.txt
  env $PROFILE_ENV LOGLINEAR_KERNEL_CACHE=/tmp/cache-v32 timeout $(( LIMIT - SECONDS - 5 )) \
    /tmp/ll-v32 bench op --device cuda --dtype bf16 --runs 3 --forms fused \
    --t 32768,131072 >> $OUT/op.txt 2>&1
  echo "long anchors rc=$? ($SECONDS s)"
  grep -E "^==|^\| fused|correctness" $OUT/op.txt
fi
echo "done ($SECONDS s)"
