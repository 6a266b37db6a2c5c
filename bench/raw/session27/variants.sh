#!/usr/bin/env bash
# Session 26: variants of the tensor-core kernels (LOGLINEAR_EXPERIMENT bits, read at launch):
# 1 backward level prefetch in the loop, 2 also the first level at the chunk's top, 4 backward
# cubes of 1024 units, 8 forward prefetch. Each variant in its own process: bench op's
# correctness check (bf16 against the f64 parallel form), then T = 8192, B = 16.
# Usage: VARIANTS="0 3 ..." bench/raw/session26/variants.sh
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export LOGLINEAR_KERNEL_CACHE=/tmp/loglinear-kernel-cache
out=${OUT:-/tmp}
[[ -x /tmp/loglinear ]] || { xz -dc bin-gpu/loglinear.xz > /tmp/loglinear && chmod +x /tmp/loglinear; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv | tee -a $out/variants.txt
for x in ${VARIANTS:-0 3 4 7 11}; do
  SECONDS=0
  LOGLINEAR_EXPERIMENT=$x timeout ${VTIMEOUT:-120} /tmp/loglinear bench op --device cuda --dtype bf16 --runs ${RUNS:-7} \
    --forms fused --t ${TS:-8192} > /tmp/variant-$x.txt 2>&1
  r=$(grep -E 'correctness|^\| fused|rror|panic' /tmp/variant-$x.txt | tr '\n' ' ')
  echo "variant $x: $r (${SECONDS} s)" | tee -a $out/variants.txt
done
tar czf $out/variants-raw.tgz -C /tmp $(cd /tmp && ls variant-*.txt)
