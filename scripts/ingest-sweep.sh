#!/usr/bin/env bash
# Copies the runs of a sweep brought back from the GPU machine (the NAME-metrics.tgz that
# `scripts/gpu-run.sh resume:CONFIG` writes) into a results folder and summarises them.
#
# Per run it keeps what `loglinear summarize` reads and what a reader checks: config.toml,
# point.toml, run.json, summary.json (finished runs), train.log and metrics.jsonl as
# metrics.jsonl.gz (the JSON lines compress ≈ 10×); model files never come back in the metrics
# archive. Paths of the GPU machine are removed from the text files. A run already in DEST is
# replaced by the newer copy: the archive holds each run's whole history (resumed runs append).
# Usage: scripts/ingest-sweep.sh NAME-metrics.tgz DEST [BIN [SUMMARIZE-OPTION...]]
#        BIN: a loglinear binary for `summarize` (default, or given as "": the release build of this
#        checkout, built if missing); the options after it go to `summarize` (e.g. --by-steps 5000).
set -euo pipefail
usage="usage: scripts/ingest-sweep.sh NAME-metrics.tgz DEST [BIN [SUMMARIZE-OPTION...]]"
archive=${1:?$usage}
dest=${2:?$usage}
bin=${3:-}
shift $(( $# < 3 ? $# : 3 ))
name=$(basename "$archive" -metrics.tgz)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
tar xzf "$archive" -C "$tmp"
[[ -d $tmp/$name ]] || { echo "error: $archive holds no folder $name/ (expected NAME-metrics.tgz of gpu-run.sh)" >&2; exit 1; }
mkdir -p "$dest"
runs=0
for run in "$tmp/$name"/*/; do
    run=${run%/}
    [[ -f $run/config.toml ]] || continue
    target="$dest/$(basename "$run")"
    rm -rf "$target" && mkdir -p "$target"
    for f in config.toml point.toml run.json summary.json train.log; do
        if [[ -f $run/$f ]]; then cp "$run/$f" "$target/"; fi
    done
    if [[ -f $run/metrics.jsonl ]]; then gzip -9 -c "$run/metrics.jsonl" > "$target/metrics.jsonl.gz"; fi
    runs=$((runs + 1))
done
if [[ -f $tmp/$name/sweep.json ]]; then cp "$tmp/$name/sweep.json" "$dest/"; fi
# gpu-run.sh trains its sweeps in the GPU machine's /tmp/sweeps/NAME (a run signalled mid-way
# logs its checkpoint folder there): such paths become paths relative to the sweep.
{ grep -rl "/tmp/sweeps/" "$dest" --include='*.toml' --include='*.json' --include='*.log' || true; } |
    while read -r f; do sed -i -e "s|/tmp/sweeps/$name/||g" -e "s|/tmp/sweeps/||g" "$f"; done
echo "$runs runs of $name copied into $dest"
if [[ -z $bin ]]; then
    bin=target/release/loglinear
    [[ -x $bin ]] || cargo build --release -p loglinear-cli
fi
"$bin" summarize "$@" "$dest"
