#!/usr/bin/env bash
# Builds the release `loglinear` binary with the CUDA backend into bin-gpu/.
#
# CUDA kernels are compiled at run time by NVRTC (cudarc loads libcuda and libnvrtc with dlopen),
# so no nvcc or CUDA toolkit is needed here. cubecl-cuda 0.11.3 depends on cubecl-llvm, whose
# build script downloads LLVM; machines without internet access build with the patch in
# scripts/patches/ (see shared/gpu-build/README.md of the project notes), applied to a copy of the
# crate in .gpu-build/ and used through a --config patch so that CPU builds never see it.
# Cargo.lock is restored afterwards: the patch is a build-time detail, not a dependency change.
#
# Usage: scripts/build-gpu.sh [--no-patch] [--tests]
#   --no-patch: online machines, upstream crate (then without the `cublas` feature: its matrix
#               products need the patch).
#   Patched builds have the `cublas` feature: matrix products on cuBLAS.
#   --tests: also the kernel test binaries (crates/loglinear/tests/kernels.rs) built for CUDA,
#            compressed into bin-gpu/tests/ for scripts/gpu-test.sh on the GPU machine (the GPU
#            machine has no Rust toolchain). They are built with the binary's profile and
#            features, so they reuse its compiled dependencies. Patched builds then compile the
#            tensor-core kernels to CUDA C++ for an sm_90 card here, CubeCL's IR verifier included
#            (`tensor_core_kernels_compile_for_sm90_without_a_device`, no GPU needed), and fail if
#            one does not compile: a kernel the verifier rejects is found before a device call.
#            Experiment switches read from the environment (LOGLINEAR_EXPERIMENT_*) apply to the
#            check as to a launch: set them to check a variant. Then scripts/ptxas-report.sh
#            prints each kernel's registers and spills for sm_90a (LOGLINEAR_PTXAS_REPORT=0
#            skips it).
set -euo pipefail
cd "$(dirname "$0")/.."
crate=cubecl-cuda-0.11.3
work=.gpu-build
out=bin-gpu
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target-gpu}"

patched=1 tests=0
for a in "$@"; do
    case "$a" in
    --no-patch) patched=0 ;;
    --tests) tests=1 ;;
    *) echo "unknown option $a (expected --no-patch, --tests)" >&2; exit 2 ;;
    esac
done
# cuBLAS matrix products need the patched cubecl-cuda (it exposes a buffer's CUDA stream).
features=cuda
(( patched )) && features=cuda,cublas
args=(build --profile gpu-release -p loglinear-cli --features $features)
config=()
if (( patched )); then
    cargo fetch --locked
    src=$(find "${CARGO_HOME:-$HOME/.cargo}/registry/src" -maxdepth 2 -type d -name "$crate" | head -n 1)
    [[ -n "$src" ]] || { echo "error: $crate not found in the cargo registry after cargo fetch" >&2; exit 1; }
    mkdir -p "$work"
    # Re-create the patched copy only when the patch changed: fresh file times would make cargo
    # rebuild cubecl-cuda and everything above it (minutes) on every run.
    stamp="$work/$crate.patch.sha256"
    want=$(sha256sum scripts/patches/cubecl-cuda-0.11.3-offline.diff | cut -d' ' -f1)
    if [[ ! -d "$work/$crate" || "$(cat "$stamp" 2>/dev/null)" != "$want" ]]; then
        rm -rf "${work:?}/$crate"
        cp -r "$src" "$work/"
        (cd "$work/$crate" && patch -s -p1 < ../../scripts/patches/cubecl-cuda-0.11.3-offline.diff)
        echo "$want" > "$stamp"
    fi
    cp Cargo.lock "$work/Cargo.lock.orig"
    trap 'cp "$work/Cargo.lock.orig" Cargo.lock' EXIT
    config=(--config "patch.crates-io.cubecl-cuda.path=\"$work/$crate\"")
fi
cargo "${args[@]}" "${config[@]}"
mkdir -p "$out"
cp "$CARGO_TARGET_DIR/gpu-release/loglinear" "$out/loglinear"
# The GPU machine receives at most 64 MiB: carry the compressed copy (about 17 MiB).
xz -T0 -6 -c "$out/loglinear" > "$out/loglinear.xz"
if (( tests )); then
    # Both packages selected so that their features unify exactly as in the binary's build.
    rm -rf "$out/tests" && mkdir -p "$out/tests"
    cargo test --profile gpu-release -p loglinear-cli -p loglinear --features "$(sed "s/[^,]*/loglinear-cli\/&/g" <<< "$features")" \
        --no-run --test kernels --message-format=json "${config[@]}" |
        grep -o '"executable":"[^"]*"' | cut -d'"' -f4 | while read -r exe; do
            name=$(basename "$exe" | sed 's/-[0-9a-f]*$//')
            xz -T0 -6 -c "$exe" > "$out/tests/$name.xz"
        done
    ls -la "$out/tests"
    if (( patched )); then
        check=$(mktemp)
        xz -dc "$out/tests/kernels.xz" > "$check" && chmod +x "$check"
        "$check" --exact tensor_core_kernels_compile_for_sm90_without_a_device ||
            { rm -f "$check"; echo "error: a tensor-core kernel does not compile for sm_90" >&2; exit 1; }
        rm -f "$check"
        # Registers and spills of each tensor-core kernel (NVRTC and ptxas from NVIDIA's PyPI
        # wheels; LOGLINEAR_PTXAS_REPORT=0 skips it). A report that cannot be made only warns.
        if [[ "${LOGLINEAR_PTXAS_REPORT:-1}" != 0 ]]; then
            scripts/ptxas-report.sh "$out/tests/kernels.xz" ||
                echo "warning: no ptxas report (scripts/ptxas-report.sh failed)" >&2
        fi
    fi
fi
ls -la "$out"
echo "built $out/loglinear; run it on the GPU machine with CUDA_PATH=/usr/local/cuda and"
echo "LD_LIBRARY_PATH=/usr/local/cuda/lib64 (NVRTC needs the CUDA headers and libnvrtc)"
