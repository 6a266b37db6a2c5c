#!/usr/bin/env bash
# Registers, spills and stack of every tensor-core kernel for an sm_90 card (H100, H200), on a
# machine without one: the CUDA C++ that CubeCL writes (the compile check's sources) compiled by
# NVRTC and `ptxas` for `sm_90a`, the architecture cubecl-cuda hands NVRTC there.
#
# Why: the tensor-core backward runs one cube of 512 units per multiprocessor, so each unit has
# 128 registers at most; a kernel change that needs more spills to local memory, which only a
# device call used to show. The GPU machine compiles the same source with NVRTC and the driver's
# ptxas (CUDA 13.0 there, as pinned here), so the counts agree up to the two compilers' versions.
#
# Usage: scripts/ptxas-report.sh [KERNELS_TEST_BINARY]
#   KERNELS_TEST_BINARY: the CUDA build's `kernels` test (default: bin-gpu/tests/kernels.xz, as
#   `scripts/build-gpu.sh --tests` leaves it). Experiment switches (LOGLINEAR_EXPERIMENT_*) in the
#   environment apply, as to the compile check.
# The toolkit: NVIDIA's PyPI wheels of CUDA 13.0 (NVRTC, ptxas, headers), installed once into
# .gpu-build/cuda-tools (git-ignored). Each source goes through NVRTC with cubecl-cuda's options
# (scripts/nvrtc-ptx.py), then ptxas.
set -euo pipefail
cd "$(dirname "$0")/.."
binary=${1:-bin-gpu/tests/kernels.xz}
[[ -f "$binary" ]] || { echo "error: $binary not found (build it: scripts/build-gpu.sh --tests)" >&2; exit 1; }

tools=.gpu-build/cuda-tools
if [[ ! -f "$tools/installed-cuda-13.0" ]]; then
    [[ -x "$tools/bin/python" ]] || python3 -m venv "$tools"
    # Versions matched to each other and to the GPU machine's CUDA 13.0 (NVRTC, its headers,
    # CCCL's `nv/target`, ptxas).
    "$tools/bin/pip" install -q nvidia-cuda-nvrtc==13.0.88 nvidia-cuda-nvcc==13.0.88 \
        nvidia-nvvm==13.0.88 nvidia-cuda-crt==13.0.88 nvidia-cuda-runtime==13.0.96 \
        nvidia-cuda-cccl==13.0.85
    touch "$tools/installed-cuda-13.0"
fi
root=$(cd "$(echo "$tools"/lib/python3*/site-packages/nvidia/cu13)" && pwd)
export LD_LIBRARY_PATH=$root/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [[ "$binary" == *.xz ]]; then
    xz -dc "$binary" > "$work/kernels"
else
    cp "$binary" "$work/kernels"
fi
chmod +x "$work/kernels"
LOGLINEAR_CUDA_SOURCES="$work/src" "$work/kernels" \
    --exact tensor_core_kernels_compile_for_sm90_without_a_device > "$work/check.log" 2>&1 ||
    { cat "$work/check.log" >&2; exit 1; }

spilled=()
printf '%-58s %5s %8s %8s %6s\n' "kernel (N, P, T, rows)" regs "spill st" "spill ld" stack
for src in "$work"/src/*.cu; do
    name=$(basename "$src" .cu)
    # NVRTC with cubecl-cuda's options, then ptxas as the driver would assemble the PTX.
    if ! "$tools/bin/python" scripts/nvrtc-ptx.py "$root/lib/libnvrtc.so.13" "$root/include" \
        "$src" "$work/$name.ptx" > "$work/$name.log" 2>&1 ||
        ! "$root/bin/ptxas" -arch=sm_90a -v -o /dev/null "$work/$name.ptx" >> "$work/$name.log" 2>&1; then
        echo "$name: does not compile" >&2
        tail -20 "$work/$name.log" >&2
        exit 1
    fi
    regs=$(grep -o 'Used [0-9]* registers' "$work/$name.log" | head -1 | awk '{print $2}')
    spills=$(grep -o '[0-9]* bytes spill stores, [0-9]* bytes spill loads' "$work/$name.log" | head -1)
    stack=$(grep -o '[0-9]* bytes stack frame' "$work/$name.log" | head -1 | awk '{print $1}')
    stores=$(awk '{print $1}' <<< "$spills")
    printf '%-58s %5s %8s %8s %6s\n' "$name" "$regs" "$stores" "$(awk '{print $5}' <<< "$spills")" \
        "$stack"
    (( stores == 0 )) || spilled+=("$name")
done
if (( ${#spilled[@]} > 0 )); then
    echo "WARNING: ${#spilled[@]} kernel(s) spill registers to local memory: ${spilled[*]}"
fi
