#!/usr/bin/env bash
# Runs on the GPU machine: Nsight Compute of one tensor-core kernel of `bench op` at T = 2048
# (B = 64, H = 48: the benchmark's launch is the first with a grid of 3,072 cubes, found by a cheap
# `launch__grid_size` pass over the first launches, which include the check's small ones), then
# `--set full` and the DRAM byte counters on that launch. Writes $OUT/ncu-details-LABEL.txt and
# $OUT/ncu-regions-LABEL.txt (stall samples by region, scripts/ncu-regions.py) and appends the
# headline figures to $OUT/summary.txt. Clocks are not locked (`--clock-control none`).
#
# Usage: OUT=dir scripts/ncu-profile.sh KERNEL_REGEX LABEL SECONDS [VAR=value ...]
#   BINARY: the loglinear binary (default /tmp/ll); SECONDS bounds the full profile's run.
set -u
kernel=$1 label=$2 seconds=$3
shift 3
env=("X=1" "$@")
bin=${BINARY:-/tmp/ll}
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
bench=(bench op --device cuda --dtype bf16 --runs 1 --forms fused --t 2048)
timeout 90 env "${env[@]}" "$ncu" --clock-control none --metrics launch__grid_size \
  -k "regex:$kernel" --launch-count 12 --csv "$bin" "${bench[@]}" \
  > "/tmp/ncu-launches-$label.csv" 2>/dev/null
skip=$(python3 - "/tmp/ncu-launches-$label.csv" <<'PY'
import csv, sys
# The program's own output comes first; the CSV starts at the row that names the columns.
rows = list(csv.reader(open(sys.argv[1])))
first = next((i for i, r in enumerate(rows) if "Kernel Name" in r and "Metric Value" in r), None)
if first is None:
    print(-1)
    sys.exit()
head, data = rows[first], rows[first + 1:]
value = head.index("Metric Value")
grids = [int(float(r[value].replace(",", ""))) for r in data if len(r) == len(head)]
print(next((i for i, g in enumerate(grids) if g == 3072), -1))
PY
)
echo "$label (${env[*]}): profiling launch $skip" | tee -a "$OUT/summary.txt"
(( skip >= 0 )) || exit 1
timeout "$seconds" env "${env[@]}" "$ncu" --clock-control none --set full \
  --metrics dram__bytes_read.sum,dram__bytes_write.sum -k "regex:$kernel" \
  --launch-skip "$skip" --launch-count 1 -f -o "/tmp/$label" "$bin" "${bench[@]}" \
  > "/tmp/ncu-run-$label.txt" 2>&1
echo "ncu $label rc=$?" | tee -a "$OUT/summary.txt"
"$ncu" --import "/tmp/$label.ncu-rep" --page details > "$OUT/ncu-details-$label.txt" 2>&1
"$ncu" --import "/tmp/$label.ncu-rep" --csv --page source --print-source sass 2>/dev/null \
  | xz -T0 > "/tmp/ncu-sass-$label.csv.xz"
python3 "$(dirname "$0")/ncu-regions.py" "/tmp/ncu-sass-$label.csv.xz" \
  > "$OUT/ncu-regions-$label.txt" 2>&1
grep -E "Duration|DRAM Throughput|Registers Per|Achieved Occ|L2 Hit|dram__bytes" \
  "$OUT/ncu-details-$label.txt" | tee -a "$OUT/summary.txt"
