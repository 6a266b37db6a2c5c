#!/usr/bin/env bash
# Session 35, call 5 (for the next GPU session): where v24's forward+backward goes where it walks
# segments — every kernel of `bench op --runs 1` at B = 1, T = 131,072 (both passes in segments
# of 8,192) and T = 32,768 × 4 (forward whole, backward in segments), timed by ncu (serialized)
# and summed per kernel name (the check's small launches and the warm-up included: compare
# kernels, not totals). bin-gpu/: loglinear.xz (v24 at HEAD).
set -u
export CUDA_PATH=/usr/local/cuda
export LD_LIBRARY_PATH=$CUDA_PATH/lib64:${LD_LIBRARY_PATH:-}
SECONDS=0
LIMIT=${LIMIT:-400}
xz -dc bin-gpu/loglinear.xz > /tmp/ll-best && chmod +x /tmp/ll-best
best=best
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv | tee $OUT/ncu.txt
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
for t in 131072 32768; do
  left=$(( LIMIT - SECONDS - 10 )); (( left < 60 )) && break; (( left > 150 )) && left=150
  LOGLINEAR_KERNEL_CACHE=/tmp/cache-$best timeout $left $ncu --metrics gpu__time_duration.sum --csv \
    --print-units base /tmp/ll-$best bench op --device cuda --dtype bf16 --runs 1 --forms fused \
    --t $t > /tmp/ncu-$t.csv 2> $OUT/ncu-$t.err
  echo "ncu $best T=$t rc=$? ($SECONDS s)" | tee -a $OUT/ncu.txt
  xz -T0 -c /tmp/ncu-$t.csv > $OUT/ncu-$t.csv.xz
  python3 - /tmp/ncu-$t.csv <<'PY' | tee -a $OUT/ncu.txt
import collections, csv, re, sys
rows = list(csv.reader(open(sys.argv[1])))
rows = rows[next(i for i, r in enumerate(rows) if "Kernel Name" in r):]
head = rows[0]
name, metric, value = head.index("Kernel Name"), head.index("Metric Name"), head.index("Metric Value")
total, count = collections.Counter(), collections.Counter()
for r in rows[1:]:
    if len(r) == len(head) and r[metric] == "gpu__time_duration.sum":
        k = re.sub(r"_[0-9a-f]{8}$", "", r[name])
        total[k] += float(r[value].replace(",", "")) / 1e6  # ns -> ms
        count[k] += 1
print(f"{'kernel':60s} {'launches':>8s} {'ms':>10s}")
for k, ms in total.most_common(15):
    print(f"{k[:60]:60s} {count[k]:8d} {ms:10.2f}")
print(f"{'all':60s} {sum(count.values()):8d} {sum(total.values()):10.2f}")
PY
done
echo "done ($SECONDS s)"
