#!/usr/bin/env bash
# Session 35, call 2. "v23" = v22 (HEAD) + bench/raw/session34/v23-segment-states-tc.diff: the
# states across segments (one key state per segment, one query state per segment and level) as
# tensor-core products (`segment_states_tc_kernel`) instead of scalar f32 code. Only the walks in
# segments change: T = 32,768 × 4 (backward in segments of 8,192) and B = 1, T = 131,072 (both
# passes). Correctness first: the segment and walk tests on CUDA with v23's test binary (bf16
# segments on tensor cores), then `bench op` (checked against the f64 parallel form) v23 against
# v22, then every kernel of one forward+backward timed by ncu and summed per kernel (the v23
# binary if its tests passed, else v22): what the segment states cost against the walks.
# bin-gpu/: loglinear.xz (v22), loglinear-v23.xz, tests/kernels.xz (v23).
set -u
export CUDA_PATH=/usr/local/cuda
export LD_LIBRARY_PATH=$CUDA_PATH/lib64:${LD_LIBRARY_PATH:-}
SECONDS=0
LIMIT=${LIMIT:-570}
xz -dc bin-gpu/loglinear.xz > /tmp/ll-v22 && chmod +x /tmp/ll-v22
xz -dc bin-gpu/loglinear-v23.xz > /tmp/ll-v23 && chmod +x /tmp/ll-v23
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv | tee $OUT/op.txt
OUT=$OUT/t1 timeout 150 scripts/gpu-test.sh fused_over_segments fused_walks fused_passes_walk \
  > $OUT/tests.txt 2>&1
echo "tests rc=$? ($SECONDS s)"
grep -E "^test |test result|panicked|max_rel" $OUT/tests.txt | head -10
best=v23
grep -q "test result: ok" $OUT/tests.txt || best=v22
for v in v23 v22; do
  echo "== $v ($SECONDS s)" >> $OUT/op.txt
  LOGLINEAR_KERNEL_CACHE=/tmp/cache-$v timeout 150 /tmp/ll-$v bench op --device cuda --dtype bf16 \
    --runs 5 --forms fused --t 32768,131072 >> $OUT/op.txt 2>&1
  echo "$v rc=$? ($SECONDS s)"
done
grep -E "^==|^\| fused|correctness|rror|NVIDIA" $OUT/op.txt
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
