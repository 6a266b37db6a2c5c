#!/usr/bin/env python3
"""CUDA C++ to PTX with NVRTC, as cubecl-cuda compiles a kernel on the GPU machine.

Usage: nvrtc-ptx.py LIBNVRTC INCLUDE_DIR SOURCE.cu OUT.ptx
The options are cubecl-cuda 0.11.3's (`compute/context.rs`, `compile_to_ptx`) for an sm_90 card:
`--gpu-architecture=sm_90a`, the toolkit's include path (and CCCL's), `-lineinfo`. Used by
scripts/ptxas-report.sh; needs no GPU.
"""
import ctypes
import os
import sys


def main():
    lib, include, source, out = sys.argv[1:5]
    nvrtc = ctypes.CDLL(lib)
    with open(source, "rb") as f:
        text = f.read()
    prog = ctypes.c_void_p()
    check(nvrtc, nvrtc.nvrtcCreateProgram(ctypes.byref(prog), text, b"kernel.cu", 0, None, None))
    options = [b"--gpu-architecture=sm_90a", f"--include-path={include}".encode(), b"-lineinfo"]
    cccl = os.path.join(include, "cccl")
    if os.path.isdir(cccl):
        options.append(f"--include-path={cccl}".encode())
    array = (ctypes.c_char_p * len(options))(*options)
    status = nvrtc.nvrtcCompileProgram(prog, len(options), array)
    if status != 0:
        size = ctypes.c_size_t()
        nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        nvrtc.nvrtcGetProgramLog(prog, log)
        sys.exit(f"{source}: NVRTC failed:\n{log.value.decode(errors='replace')}")
    size = ctypes.c_size_t()
    check(nvrtc, nvrtc.nvrtcGetPTXSize(prog, ctypes.byref(size)))
    ptx = ctypes.create_string_buffer(size.value)
    check(nvrtc, nvrtc.nvrtcGetPTX(prog, ptx))
    with open(out, "wb") as f:
        f.write(ptx.value)


def check(nvrtc, status):
    if status != 0:
        nvrtc.nvrtcGetErrorString.restype = ctypes.c_char_p
        sys.exit(f"NVRTC error {status}: {nvrtc.nvrtcGetErrorString(status).decode()}")


if __name__ == "__main__":
    main()
