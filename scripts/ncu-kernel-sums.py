#!/usr/bin/env python3
"""Time per kernel name in an Nsight Compute CSV of `gpu__time_duration.sum`.

Runs on the GPU machine after
  ncu --metrics gpu__time_duration.sum --csv --print-units base PROGRAM ... > FILE.csv
and prints, per kernel name (CubeCL's hash suffix dropped), the number of launches and their
summed duration in ms, largest first, then the total.

Usage: scripts/ncu-kernel-sums.py FILE.csv [TOP]
"""

import collections
import csv
import re
import sys


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 15
    with open(sys.argv[1], newline="") as f:
        rows = list(csv.reader(f))
    start = next((i for i, r in enumerate(rows) if "Kernel Name" in r), None)
    if start is None:
        sys.exit(f"{sys.argv[1]}: no 'Kernel Name' header (did ncu run?)")
    head = rows[start]
    name, metric, value = (head.index(c) for c in ("Kernel Name", "Metric Name", "Metric Value"))
    total, count = collections.Counter(), collections.Counter()
    for r in rows[start + 1 :]:
        if len(r) == len(head) and r[metric] == "gpu__time_duration.sum":
            kernel = re.sub(r"_[0-9a-f]{8}$", "", r[name])
            total[kernel] += float(r[value].replace(",", "")) / 1e6  # ns -> ms
            count[kernel] += 1
    print(f"{'kernel':60s} {'launches':>8s} {'ms':>10s}")
    for kernel, ms in total.most_common(top):
        print(f"{kernel[:60]:60s} {count[kernel]:8d} {ms:10.2f}")
    print(f"{'all':60s} {sum(count.values()):8d} {sum(total.values()):10.2f}")


if __name__ == "__main__":
    main()
