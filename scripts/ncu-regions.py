#!/usr/bin/env python3
"""Stall samples of a kernel by region between barriers, from an Nsight Compute SASS page.

Input: the CSV written by `ncu --import R.ncu-rep --csv --page source --print-source sass`
(xz-compressed or plain). A region runs from one `BAR.SYNC` to the next (the barrier itself
closes it; its wait is attributed by ncu to the instruction after it, the first of the next
region). For each region: its first and last SASS line, its share of all stall samples, the warp
instructions it executed and its three largest stall reasons (share of all samples). The
regions of a chunk walk read in program order: loads, each product and its epilogue, the level
reads, the state write.

Usage: scripts/ncu-regions.py SASS.csv[.xz]
"""
import collections
import csv
import lzma
import sys


def main(path):
    opener = lzma.open if path.endswith(".xz") else open
    with opener(path, "rt") as f:
        rows = list(csv.reader(f))
    # Line 0 names the kernel; line 1 holds the column names.
    header, data = rows[1], rows[2:]
    col = {name: i for i, name in enumerate(header)}
    samples = "Warp Stall Sampling (All Samples)"
    reasons = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    total = sum(int(r[col[samples]] or 0) for r in data) or 1
    start, share, executed, by_reason = 0, 0, 0, collections.Counter()
    for k, r in enumerate(data):
        share += int(r[col[samples]] or 0)
        executed += int(r[col["Instructions Executed"]] or 0)
        for h in reasons:
            by_reason[h[len("stall_"):]] += int(r[col[h]] or 0)
        if "BAR.SYNC" in r[col["Source"]] or k == len(data) - 1:
            top = [(name, round(100 * v / total, 2)) for name, v in by_reason.most_common(3)]
            print(f"{start:5d}-{k:5d} {100 * share / total:6.2f} %  "
                  f"inst {executed / 1e6:8.1f} M  {top}")
            start, share, executed = k + 1, 0, 0
            by_reason.clear()


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
