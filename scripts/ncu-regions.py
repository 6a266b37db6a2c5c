#!/usr/bin/env python3
"""Stall samples of a kernel by region between barriers, from an Nsight Compute SASS page.

Input: the CSV written by `ncu --import R.ncu-rep --csv --page source --print-source sass`
(xz-compressed or plain). A region runs from one `BAR.SYNC` to the next (the barrier itself
closes it; its wait is attributed by ncu to the instruction after it, the first of the next
region). For each region: its first and last SASS line, its share of all stall samples, the warp
instructions it executed, its three largest stall reasons (share of all samples) and the count
of its telling instructions in the SASS listing (`HMMA` tensor-core products, `LDG`/`STG` global
loads and stores, `LDS`/`STS`/`LDSM` shared, `MUFU` transcendentals, `SHFL` shuffles, `F2FP`
conversions to bf16, `CCTL` cache control such as `discard`), which name the region. The regions
of a chunk walk read in program order: loads, each product and its epilogue, the level reads,
the state write.

Usage: scripts/ncu-regions.py SASS.csv[.xz]   (a report of several kernels: each in turn)
"""
import collections
import csv
import lzma
import sys


def main(path):
    opener = lzma.open if path.endswith(".xz") else open
    with opener(path, "rt") as f:
        rows = list(csv.reader(f))
    # Each kernel of the report: a line that names it, one of column names, then its SASS.
    starts = [i for i, r in enumerate(rows) if r and r[0] == "Kernel Name"] or [0]
    for first, end in zip(starts, starts[1:] + [len(rows)]):
        if len(starts) > 1:
            print(f"== {rows[first][1]}")
        regions(rows[first + 1], rows[first + 2:end])


def regions(header, data):
    col = {name: i for i, name in enumerate(header)}
    samples = "Warp Stall Sampling (All Samples)"
    reasons = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    total = sum(int(r[col[samples]] or 0) for r in data) or 1
    start, share, executed, by_reason = 0, 0, 0, collections.Counter()
    opcodes = collections.Counter()
    for k, r in enumerate(data):
        share += int(r[col[samples]] or 0)
        executed += int(r[col["Instructions Executed"]] or 0)
        for h in reasons:
            by_reason[h[len("stall_"):]] += int(r[col[h]] or 0)
        opcodes[opcode(r[col["Source"]])] += 1
        if "BAR.SYNC" in r[col["Source"]] or k == len(data) - 1:
            top = [(name, round(100 * v / total, 2)) for name, v in by_reason.most_common(3)]
            kinds = " ".join(f"{op}:{opcodes[op]}" for op in TELLING if opcodes[op])
            print(f"{start:5d}-{k:5d} {100 * share / total:6.2f} %  "
                  f"inst {executed / 1e6:8.1f} M  {top}  {kinds}")
            start, share, executed = k + 1, 0, 0
            by_reason.clear()
            opcodes.clear()


# Instruction kinds that name a region (see the module's doc).
TELLING = ["HMMA", "LDSM", "LDG", "STG", "LDS", "STS", "MUFU", "SHFL", "F2FP", "CCTL"]


def opcode(source):
    """`HMMA` of `@P0 HMMA.16816.F32.BF16 R4, ...`: the mnemonic without predicate or suffixes."""
    words = source.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].split(".")[0] if words else ""


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
