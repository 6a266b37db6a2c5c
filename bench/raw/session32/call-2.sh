#!/usr/bin/env bash
# Session 32, call 2 (call 1 again after the fix of `across_states_kernel`, whose
# comparison of two booleans CUDA's code generator refused): "v19" = v17 + sequences walked in segments by the kernels themselves (the
# levels across segments written before the launch, segments.rs) + v18's vector stores, against
# v17. Experiment binary (not committed as is): LOGLINEAR_EXPERIMENT_SCALAR_STORES=1 turns v18's
# vector stores off, LOGLINEAR_EXPERIMENT_PT=N caps the value tile (the planner's narrowing).
# bin-gpu/: loglinear-v17.xz, loglinear.xz (v19), tests/kernels.xz (v19).
set -u
export CUDA_PATH=/usr/local/cuda
export LD_LIBRARY_PATH=$CUDA_PATH/lib64:${LD_LIBRARY_PATH:-}
SECONDS=0
xz -dc bin-gpu/loglinear-v17.xz > /tmp/ll-v17 && chmod +x /tmp/ll-v17
xz -dc bin-gpu/loglinear.xz > /tmp/ll-v19 && chmod +x /tmp/ll-v19
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv | tee $OUT/op.txt
# Correctness first: the segment walks (f32 scalar kernels and bf16 tensor-core ones), the
# planned walk of Form::Fused (the tensor-core cases with v18's stores passed in call 1).
OUT=$OUT/t1 timeout 300 scripts/gpu-test.sh fused_over_segments fused_walks \
  > $OUT/tests.txt 2>&1
rc=$?; echo "tests rc=$rc ($SECONDS s)"; grep -E "^test |test result|panicked|max_rel" $OUT/tests.txt | head -40
bench() { # version, T, runs, forms, [env...]
  local v=$1 t=$2 runs=$3 forms=$4; shift 4
  echo "== $v T=$t forms=$forms $* ($SECONDS s)" >> $OUT/op.txt
  env "$@" LOGLINEAR_KERNEL_CACHE=/tmp/cache-$v timeout 170 /tmp/ll-$v bench op --device cuda \
    --dtype bf16 --runs $runs --forms $forms --t $t >> $OUT/op.txt 2>&1
  echo "$v T=$t $forms $* rc=$? ($SECONDS s)"
}
# T = 32,768 × 4: the plan walks segments of 8,192 (768 cubes); segmented:32768 is one walk.
bench v19 32768 5 fused,segmented:32768,segmented:4096
bench v17 32768 5 fused
# B = 1, T = 131,072: segments of 8,192 (planned) and 4,096; one walk.
bench v19 131072 3 fused,segmented:4096,segmented:131072
bench v17 131072 3 fused
# v18's stores at the full-card shapes (no segments planned there), as time allows.
bench v19 8192 7 fused; bench v17 8192 7 fused
bench v19 2048 7 fused; bench v17 2048 7 fused
(( SECONDS < 480 )) && bench v19 8192 7 fused LOGLINEAR_EXPERIMENT_SCALAR_STORES=1
grep -E "^==|^\| (fused|segmented)|correctness|check|rror|NVIDIA" $OUT/op.txt
echo "done ($SECONDS s)"
