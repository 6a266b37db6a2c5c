#!/usr/bin/env bash
# Runs on the GPU machine: one `bench op` row of the fused op in bf16 at the anchors' shapes
# (median of 3 runs; its f64 check of every gradient first), appended to $OUT/op.txt under a
# "== LABEL T=…" header, with the exit status and the seconds so far in $OUT/summary.txt. Skipped
# when fewer than 45 seconds are left; at most 90 seconds a row.
#
# Usage: OUT=dir scripts/bench-row.sh LABEL BINARY T SECONDS_LEFT [VAR=value ...]
#   VAR=value: environment for the run (experiment switches); LOGLINEAR_KERNEL_CACHE=/tmp/cache
#   keeps compiled kernels between the rows of one call.
set -u
label=$1 bin=$2 t=$3 left=$4
shift 4
(( left > 90 )) && left=90
(( left > 45 )) || { echo "bench $label skipped (${left} s left)" | tee -a "$OUT/summary.txt"; exit 0; }
echo "== $label T=$t" >> "$OUT/op.txt"
env "$@" LOGLINEAR_KERNEL_CACHE=/tmp/cache timeout "$left" "$bin" bench op \
  --device cuda --dtype bf16 --runs 3 --forms fused --t "$t" >> "$OUT/op.txt" 2>&1
echo "bench $label T=$t rc=$?" | tee -a "$OUT/summary.txt"
