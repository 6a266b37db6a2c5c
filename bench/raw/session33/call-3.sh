#!/usr/bin/env bash
# Session 33, call 3: call 2 cut to what a short call can hold (little device time was left
# after the failed starts): v21's tensor-core kernel test on CUDA (forward and backward against
# the f64 reference, at the anchors' tile too), then v21 against v17 at T = 8192 (`bench op`
# checks first), then the other new tests as time allows. bin-gpu/ as for call 2.
set -u
export CUDA_PATH=/usr/local/cuda
export LD_LIBRARY_PATH=$CUDA_PATH/lib64:${LD_LIBRARY_PATH:-}
SECONDS=0
LIMIT=${LIMIT:-240}
xz -dc bin-gpu/loglinear-v17.xz > /tmp/ll-v17 && chmod +x /tmp/ll-v17
xz -dc bin-gpu/loglinear.xz > /tmp/ll-v21 && chmod +x /tmp/ll-v21
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv | tee $OUT/op.txt
OUT=$OUT/t1 timeout 90 scripts/gpu-test.sh tensor_core_kernels > $OUT/tests.txt 2>&1
echo "tensor-core test rc=$? ($SECONDS s)"
grep -E "^test |test result|panicked|max_rel|off by" $OUT/tests.txt | head -20
bench() { # version, T, runs, forms, [env...]
  local v=$1 t=$2 runs=$3 forms=$4; shift 4
  local left=$(( LIMIT - SECONDS - 5 )); (( left > 70 )) && left=70
  echo "== $v T=$t $forms $* ($SECONDS s)" >> $OUT/op.txt
  env "$@" LOGLINEAR_KERNEL_CACHE=/tmp/cache-$v timeout $left /tmp/ll-$v bench op --device cuda \
    --dtype bf16 --runs $runs --forms $forms --t $t >> $OUT/op.txt 2>&1
  echo "$v T=$t $forms $* rc=$? ($SECONDS s)"
}
go() { (( SECONDS < LIMIT - 40 )); }
go && bench v21 8192 5 fused
go && bench v17 8192 5 fused
go && OUT=$OUT/t2 timeout $(( LIMIT - SECONDS - 5 )) scripts/gpu-test.sh mamba2 fused_over_segments \
  fused_walks > $OUT/tests2.txt 2>&1
grep -E "^test |test result|panicked|max_rel|off by" $OUT/tests2.txt 2>/dev/null | head -20
grep -E "^==|^\| (fused|segmented)|correctness|check|rror|NVIDIA" $OUT/op.txt
echo "done ($SECONDS s)"
