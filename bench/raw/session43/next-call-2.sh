#!/usr/bin/env bash
# For the next GPU session (written in session 43), after next-call.sh, on the same binaries with
# every switch unset (v40's kernels as committed): the whole CUDA kernel suite, which has not run
# on v40 (`--nocapture`: the tensor-core tests print each output's and gradient's error, the
# baseline for v41z's rounding), then Nsight Compute of the tensor-core forward and the causal
# backward at T = 2048 × 64 (grid 3,072; neither profiled since session 38). At most eight files
# come back.
# LIMIT: seconds.
set -u
export CUDA_PATH=/usr/local/cuda
export LD_LIBRARY_PATH=$CUDA_PATH/lib64:${LD_LIBRARY_PATH:-}
SECONDS=0
LIMIT=${LIMIT:-560}
[ -x /tmp/ll ] || { xz -dc bin-gpu/loglinear.xz > /tmp/ll && chmod +x /tmp/ll; }
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv | tee $OUT/summary.txt
OUT=/tmp/t-suite timeout 230 scripts/gpu-test.sh --nocapture > /tmp/suite.txt 2>&1
echo "suite rc=$? ($SECONDS s)" | tee -a $OUT/summary.txt
cp /tmp/suite.txt $OUT/suite.txt
grep -E "^test |test result|panicked|FAILED" /tmp/suite.txt | head -60 | tee -a $OUT/summary.txt
go() { (( SECONDS < LIMIT - ${1:-60} )); }
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
profile() { # kernel regex, file label, env (VAR=value)
  local kernel=$1 label=$2 skip e=${3:-X=1}
  timeout 90 env $e $ncu --clock-control none --metrics launch__grid_size -k regex:$kernel \
    --launch-count 12 --csv /tmp/ll bench op --device cuda --dtype bf16 --runs 1 --forms fused \
    --t 2048 > /tmp/ncu-launches-$label.csv 2>/dev/null
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
  echo "$label ($e): profiling launch $skip ($SECONDS s)" | tee -a $OUT/summary.txt
  (( skip >= 0 )) || return
  timeout $(( LIMIT - SECONDS - 15 )) env $e $ncu --clock-control none --set full \
    --metrics dram__bytes_read.sum,dram__bytes_write.sum -k regex:$kernel \
    --launch-skip $skip --launch-count 1 -f -o /tmp/$label /tmp/ll bench op --device cuda \
    --dtype bf16 --runs 1 --forms fused --t 2048 > /tmp/ncu-run-$label.txt 2>&1
  echo "ncu $label rc=$? ($SECONDS s)" | tee -a $OUT/summary.txt
  $ncu --import /tmp/$label.ncu-rep --page details > $OUT/ncu-details-$label.txt 2>&1
  $ncu --import /tmp/$label.ncu-rep --csv --page source --print-source sass 2>/dev/null \
    | xz -T0 > /tmp/ncu-sass-$label.csv.xz
  python3 scripts/ncu-regions.py /tmp/ncu-sass-$label.csv.xz > $OUT/ncu-regions-$label.txt 2>&1
  grep -E "Duration|DRAM Throughput|Registers Per|Achieved Occ|L2 Hit|dram__bytes" \
    $OUT/ncu-details-$label.txt | tee -a $OUT/summary.txt
}
go 150 && profile "^causal_tc_kernel" forward
go 150 && profile "^causal_backward_tc_kernel" causal-bwd
echo "done ($SECONDS s)" | tee -a $OUT/summary.txt
