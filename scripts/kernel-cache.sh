#!/usr/bin/env bash
# Puts the H200 kernel cache kept in git history into bin-gpu/kernel-cache.tar.xz, where
# scripts/gpu-run.sh looks for it when `carry` names it (a fresh GPU machine then starts with
# the compiled kernels and autotune results instead of compiling for ≈ 30 s).
#
# Why in history and not in the tree: everything tracked travels with every device call, and
# the 10 MB archive crowded out what a call must carry (the binary, a sweep's resume state)
# under the 64 MiB limit. The tag `kernel-cache-h200` names the commit that holds it (see
# bench/cache/README.md; a clone without tags finds it at commit b955e4a).
# Usage: scripts/kernel-cache.sh [REV]   (default: the tag, else that commit)
set -euo pipefail
cd "$(dirname "$0")/.."
rev=${1:-kernel-cache-h200}
git rev-parse -q --verify "$rev^{commit}" > /dev/null || rev=b955e4a
mkdir -p bin-gpu
git show "$rev:bench/cache/h200.tar.xz" > bin-gpu/kernel-cache.tar.xz
ls -la bin-gpu/kernel-cache.tar.xz
