#!/usr/bin/env bash
# Puts the resume state of unfinished GPU sweeps, kept in git history, into bin-gpu/parts/,
# where `scripts/gpu-run.sh resume:CONFIG` restores it (carry bin-gpu/parts in the call).
#
# Why in history and not in the tree: everything tracked travels with every device call (64 MiB
# together with what `carry` names), and a sweep's checkpoints (≈ 0.75 MB per unfinished MQAR
# run) would crowd out the binary. A session that stops with sweeps unfinished commits their
# NAME-state-NN.tar parts (or NAME-state-NN.tar.xz: gpu-run.sh takes both, and xz saves ≈ 40 %
# of a tight carry) under bench/resume/ in one commit and deletes them in the next;
# bench/RESULTS.md names the commit.
# Usage: scripts/resume-state.sh REV   (the commit that holds bench/resume/*.tar)
set -euo pipefail
cd "$(dirname "$0")/.."
rev=${1:?usage: scripts/resume-state.sh REV (the commit named in bench/RESULTS.md)}
mkdir -p bin-gpu/parts
found=0
while read -r path; do
    [[ $path == *.tar || $path == *.tar.xz ]] || continue
    git show "$rev:$path" > "bin-gpu/parts/$(basename "$path")"
    found=1
done < <(git ls-tree -r --name-only "$rev" -- bench/resume)
(( found )) || { echo "error: $rev holds no bench/resume/*.tar or *.tar.xz" >&2; exit 1; }
ls -la bin-gpu/parts
