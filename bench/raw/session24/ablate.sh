#!/usr/bin/env bash
# Session 24: variants of the tensor-core kernels (LOGLINEAR_ABLATE bits; experiment build) at
# T = 8192, B = 16: optimisations (checked first by bench op's correctness check) and ablations
# (parts of the backward skipped; no check).
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export LOGLINEAR_KERNEL_CACHE=/tmp/loglinear-kernel-cache
xz -dc bin-gpu/loglinear.xz > /tmp/loglinear && chmod +x /tmp/loglinear
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv
opt() {
  SECONDS=0
  r=$(LOGLINEAR_ABLATE=$1 timeout 120 /tmp/loglinear bench op --device cuda --dtype bf16 --runs 7 --forms fused --t ${TS:-8192} 2>&1 | grep -E 'correctness|^\| fused|rror')
  echo "variant $1: $(echo "$r" | tr '\n' ' ') (${SECONDS} s)" | tee -a ${OUT:-/tmp}/ablate.txt
}
abl() {
  SECONDS=0
  r=$(LOGLINEAR_SKIP_CHECK=1 LOGLINEAR_ABLATE=$1 timeout 90 /tmp/loglinear bench op --device cuda --dtype bf16 --runs 7 --forms fused --t ${TS:-8192} 2>&1 | grep -E '^\| fused|rror')
  echo "ablate $1: $(echo "$r" | tr '\n' ' ') (${SECONDS} s)" | tee -a ${OUT:-/tmp}/ablate.txt
}
opt 393216
for a in ${ABLS:-0 131072 262144 1 256 512 4 65536 16 2048}; do abl $a; done
