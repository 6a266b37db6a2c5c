#!/usr/bin/env bash
# Runs on the GPU machine: the kernel tests (crates/loglinear/tests/kernels.rs) built for CUDA by
# `scripts/build-gpu.sh --tests` and carried in bin-gpu/tests/: every fused kernel, the bf16
# tensor-core path included (T = 1, 70, 200, 4096 and 32,768), against the f64 reference, all
# gradients. Each test prints its random seed on failure; `LOGLINEAR_TEST_SEED=N` replays it.
# Usage: scripts/gpu-test.sh [TEST-FILTER...]   (any test whose name holds one of them; output
#                                                also in $OUT/gpu-test.txt)
set -uo pipefail
export CUDA_PATH=${CUDA_PATH:-/usr/local/cuda}
export LD_LIBRARY_PATH=$CUDA_PATH/lib64:${LD_LIBRARY_PATH:-}
out=${OUT:-/tmp/out}
mkdir -p "$out" /tmp/gpu-tests
shopt -s nullglob
binaries=(bin-gpu/tests/*.xz)
if (( ${#binaries[@]} == 0 )); then
    echo "no test binaries in bin-gpu/tests/: build them with scripts/build-gpu.sh --tests" >&2
    exit 2
fi
status=0
for packed in "${binaries[@]}"; do
    name=$(basename "$packed" .xz)
    exe=/tmp/gpu-tests/$name
    xz -dc "$packed" > "$exe" && chmod +x "$exe"
    echo "=== $name ($(date +%T)) ==="
    # One test at a time: they share the GPU, and a failure's output stays readable.
    "$exe" --test-threads=1 "$@" 2>&1 | tee -a "$out/gpu-test.txt" || status=1
done
exit $status
