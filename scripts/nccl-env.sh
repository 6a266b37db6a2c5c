#!/usr/bin/env bash
# Source on a GPU machine before data-parallel training (`train --device cuda:0,cuda:1`):
#   source scripts/nccl-env.sh
# cubecl-cuda's collectives load NCCL through cudarc, which looks for libnccl.so (and a few
# versioned names, but not NCCL's own soname libnccl.so.2). This finds a libnccl.so.2 — under
# $NCCL_HOME, beside PyTorch (the nvidia-nccl wheel), or in the system's library folders —,
# links it as libnccl.so in a folder of its own and puts that folder on LD_LIBRARY_PATH.
# Without NCCL, `loglinear train` with several CUDA devices stops before training and says so.
_nccl_find() {
    local c
    for c in ${NCCL_HOME:+"$NCCL_HOME"/lib/libnccl.so.2 "$NCCL_HOME"/lib64/libnccl.so.2}; do
        [[ -f $c ]] && { echo "$c"; return; }
    done
    c=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib", "libnccl.so.2"))' 2>/dev/null)
    [[ -n $c && -f $c ]] && { echo "$c"; return; }
    c=$(ldconfig -p 2>/dev/null | awk '/libnccl\.so\.2 /{print $NF; exit}')
    [[ -n $c && -f $c ]] && { echo "$c"; return; }
    find /usr /opt -name 'libnccl.so.2' 2>/dev/null | head -n 1
}
_nccl_lib=$(_nccl_find)
if [[ -z $_nccl_lib ]]; then
    echo "nccl-env.sh: no libnccl.so.2 found (set NCCL_HOME, or install NCCL / the nvidia-nccl wheel)" >&2
else
    _nccl_dir=${TMPDIR:-/tmp}/loglinear-nccl
    mkdir -p "$_nccl_dir"
    ln -sf "$_nccl_lib" "$_nccl_dir/libnccl.so"
    export LD_LIBRARY_PATH="$_nccl_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    echo "nccl-env.sh: $_nccl_lib as $_nccl_dir/libnccl.so"
fi
unset -f _nccl_find
unset _nccl_lib _nccl_dir
