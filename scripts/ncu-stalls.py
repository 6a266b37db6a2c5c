#!/usr/bin/env python3
"""Where a profiled kernel's warps wait: a summary of an Nsight Compute report.

Runs on the GPU machine (ncu is there, not here). For each kernel of the report it prints
  * the warp stall reasons (cycles per issued instruction, largest first), from the raw page;
  * the hottest SASS instructions by stall samples (from `--set full`'s source counters), and
    the samples summed by opcode, so that barrier waits (BAR), shared-memory traffic (LDS/STS,
    LDSM), global loads (LDG), tensor-core work (HMMA) and the rest can be told apart.

Usage: scripts/ncu-stalls.py REPORT.ncu-rep [TOP]   (ncu on PATH or in /usr/local/cuda/bin)
"""

import collections
import csv
import io
import shutil
import subprocess
import sys


def ncu_binary():
    for candidate in (shutil.which("ncu"), "/usr/local/cuda/bin/ncu"):
        if candidate:
            return candidate
    sys.exit("ncu not found")


def ncu_csv(report, *args):
    """Rows of an `ncu --import REPORT --csv` page (the leading ==PROF== lines dropped)."""
    text = subprocess.run(
        [ncu_binary(), "--import", report, "--csv", *args],
        check=True, capture_output=True, text=True,
    ).stdout
    lines = [line for line in text.splitlines() if line and not line.startswith("==")]
    return list(csv.reader(io.StringIO("\n".join(lines))))


def number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def stall_reasons(report):
    rows = ncu_csv(report, "--page", "raw")
    if len(rows) < 3:
        print("raw page: no kernels")
        return
    header, rows = rows[0], rows[2:]  # the second row holds the units
    name_col = header.index("Kernel Name") if "Kernel Name" in header else None
    # e.g. smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio: cycles a warp spends
    # in this state per instruction issued; they add up to "Warp Cycles Per Issued Instruction".
    prefix, suffix = "smsp__average_warps_issue_stalled_", "_per_issue_active.ratio"
    columns = [
        (i, name[len(prefix):-len(suffix)])
        for i, name in enumerate(header)
        if name.startswith(prefix) and name.endswith(suffix)
    ]
    if not columns:
        print(f"raw page: no {prefix}*{suffix} metrics (take the report with --set full)")
        return
    for row in rows:
        name = row[name_col][:60] if name_col is not None else "kernel"
        values = sorted(
            ((number(row[i]) or 0.0, reason) for i, reason in columns), reverse=True
        )
        total = sum(v for v, _ in values)
        print(f"\n## {name}: stall cycles per issued instruction, total {total:.2f}")
        for value, reason in values:
            if value >= 0.05:
                print(f"  {reason:<24} {value:6.2f}  ({100 * value / max(total, 1e-9):4.1f} %)")


def hot_instructions(report, top):
    rows = ncu_csv(report, "--page", "source", "--print-source", "sass")
    tables, current = [], None
    for row in rows:
        if "Source" in row and any("Sampling" in cell for cell in row):
            current = {"header": row, "rows": []}
            tables.append(current)
        elif current is not None and len(row) == len(current["header"]):
            current["rows"].append(row)
    if not tables:
        print("source page: no SASS table (was the report taken with --set full?)")
        return
    for n, table in enumerate(tables):
        header = table["header"]
        source = header.index("Source")
        sampled = [i for i, name in enumerate(header) if "Sampling (All" in name]
        if not sampled:
            sampled = [i for i, name in enumerate(header) if "Sampling" in name][:1]
        samples_col = sampled[0]
        executed = next((i for i, name in enumerate(header) if name == "Instructions Executed"), None)
        rows = [(number(r[samples_col]) or 0.0, r) for r in table["rows"]]
        total = sum(s for s, _ in rows) or 1.0
        by_opcode = collections.Counter()
        executed_by_opcode = collections.Counter()
        for samples, row in rows:
            words = row[source].split()
            if words and words[0].startswith("@"):  # predicate
                words = words[1:]
            opcode = (words[0] if words else "?").split(".")[0]
            by_opcode[opcode] += samples
            if executed is not None:
                executed_by_opcode[opcode] += number(row[executed]) or 0.0
        print(f"\n## kernel {n}: {len(rows)} SASS instructions, {total:.0f} stall samples")
        print("  samples by opcode:")
        for opcode, samples in by_opcode.most_common(16):
            print(f"    {opcode:<10} {100 * samples / total:5.1f} %")
        if executed_by_opcode:
            issued = sum(executed_by_opcode.values()) or 1.0
            print(f"  warp instructions executed: {issued:.4g}; by opcode:")
            for opcode, count in executed_by_opcode.most_common(20):
                print(f"    {opcode:<10} {100 * count / issued:5.1f} %  {count:.4g}")
        print(f"  hottest {top} instructions (% of samples, executed, SASS):")
        for samples, row in sorted(rows, key=lambda x: -x[0])[:top]:
            count = row[executed] if executed is not None else ""
            print(f"    {100 * samples / total:5.2f} %  {count:>12}  {row[source].strip()[:90]}")


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    report = sys.argv[1]
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 30
    stall_reasons(report)
    try:
        hot_instructions(report, top)
    except subprocess.CalledProcessError as error:
        print(f"source page failed: {error.stderr[-500:]}")


if __name__ == "__main__":
    main()
