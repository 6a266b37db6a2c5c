#!/usr/bin/env bash
# Session 43, call 2 (call 1, session 42's next-call.sh, never got a machine: four starts failed):
# one binary (`bin-gpu/loglinear.xz`, kernel tests `bin-gpu/tests/kernels.xz`, built together)
# = v40 + the forward's level-0 discards dropped (compact levels never write level 0) + one
# switch:
#   LOGLINEAR_EXPERIMENT_ANTI_HELD=1  (v41x) the anticausal tensor-core backward keeps level 0
#       (an odd chunk's update, read by the next chunk walking backwards, then dead until the
#       next odd chunk) in its level sum's registers instead of writing and reading 32 KB.
# Unset, the kernels are v40's (plus the dropped discards). Order: the tensor-core and
# half-precision kernel tests with the switch; `bench op` (its check gates each variant) v40,
# v41x, v40 again at T = 2048, 8192; v40 at 32,768 and 131,072; Nsight Compute of the
# anticausal and the causal backward at T = 2048, time left. At most eight files come back.
# LIMIT: seconds.
set -u
export CUDA_PATH=/usr/local/cuda
export LD_LIBRARY_PATH=$CUDA_PATH/lib64:${LD_LIBRARY_PATH:-}
SECONDS=0
LIMIT=${LIMIT:-560}
xz -dc bin-gpu/loglinear.xz > /tmp/ll && chmod +x /tmp/ll
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv | tee $OUT/summary.txt
SWITCH=LOGLINEAR_EXPERIMENT_ANTI_HELD=1
env $SWITCH OUT=/tmp/t-tests timeout 130 scripts/gpu-test.sh \
  tensor_core_kernels_match fused_takes_half_precision > $OUT/tests.txt 2>&1
echo "tests (v41x) rc=$? ($SECONDS s)" | tee -a $OUT/summary.txt
grep -E "^test |test result|panicked|FAILED" $OUT/tests.txt | head -20 | tee -a $OUT/summary.txt
bench() { # label, t list, env...
  local label=$1 ts=$2; shift 2
  local left=$(( LIMIT - SECONDS - 5 )); (( left > 150 )) && left=150
  (( left > 40 )) || return
  echo "== $label T=$ts ($SECONDS s)" >> $OUT/op.txt
  env "$@" LOGLINEAR_KERNEL_CACHE=/tmp/cache timeout $left /tmp/ll bench op \
    --device cuda --dtype bf16 --runs 3 --forms fused --t $ts >> $OUT/op.txt 2>&1
  echo "bench $label rc=$? ($SECONDS s)" | tee -a $OUT/summary.txt
}
bench v40 2048,8192 X=1
bench v41x 2048,8192 $SWITCH
bench v40-again 2048 X=1
bench v40-long 32768,131072 X=1
grep -E "^==|^\| fused|correctness|rror" $OUT/op.txt | tee -a $OUT/summary.txt
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
go 150 && profile "^anticausal_backward_tc_kernel" anticausal
go 150 && profile "^causal_backward_tc_kernel" causal-bwd
echo "done ($SECONDS s)" | tee -a $OUT/summary.txt
