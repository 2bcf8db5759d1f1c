"""Where a kernel's warps wait, instruction by instruction: Nsight Compute's source page (SASS, with the warp-state
sampling of its SourceCounters section) as CSV, summarized: the instructions holding most stall samples, each with its
share and its top stall reasons where the CSV has per-reason columns.

On the GPU machine (bench/gpu_session.sh sourcencu does this):
  ncu -k regex:wgmma --launch-skip 1 --launch-count 1 --section SourceCounters -o rep python3 bench/profile_kernel.py ...
  ncu -i rep.ncu-rep --page source --csv --print-source sass > rep.csv
  python3 bench/ncu_source.py rep.csv [--top 30]
"""
from __future__ import annotations

import argparse
import csv
import io
import sys

ALL_SAMPLES = "Warp Stall Sampling (All Samples)"
NOT_ISSUED = "Warp Stall Sampling (Not-issued Samples)"


def number(text: str) -> float:
    try:
        return float(text.replace(",", "")) if text.strip() else 0.0
    except ValueError:
        return 0.0


def rows_of(text: str) -> tuple[list[str], list[dict]]:
    """The CSV's header and rows, from its first line that names the samples' column (ncu prints lines before it)."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if ALL_SAMPLES in line), None)
    if start is None:
        raise SystemExit(f"no '{ALL_SAMPLES}' column: was the SourceCounters section collected? first lines:\n"
                         + "\n".join(lines[:5]))
    reader = csv.DictReader(io.StringIO("\n".join(lines[start:])))
    return reader.fieldnames or [], list(reader)


def reason_columns(header: list[str]) -> list[str]:
    """Per-reason sample columns where ncu gives them (their names vary by version: stall_*, smsp__pcsamp_*)."""
    return [h for h in header if h not in (ALL_SAMPLES, NOT_ISSUED) and ("stall" in h.lower() or "pcsamp" in h.lower())]


def summary(header: list[str], rows: list[dict], top: int) -> str:
    total = sum(number(r[ALL_SAMPLES]) for r in rows) or 1.0
    reasons = reason_columns(header)
    source = next((h for h in ("Source", "SASS") if h in header), header[1] if len(header) > 1 else header[0])
    lines = [f"{len(rows)} instructions, {total:.0f} samples; per-reason columns: {len(reasons)}"]
    ranked = sorted(rows, key=lambda r: -number(r[ALL_SAMPLES]))[:top]
    for r in ranked:
        share = number(r[ALL_SAMPLES]) / total
        why = sorted(((number(r[c]), c) for c in reasons), reverse=True)[:3]
        why_text = ", ".join(f"{c.split('_', 1)[-1] if c.startswith('stall') else c} {v:.0f}" for v, c in why if v > 0)
        lines.append(f"{share:6.1%} {r.get('Address', ''):>6} {r[source].strip()[:90]:90} {why_text}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv")
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    with open(args.csv, errors="replace") as f:
        header, rows = rows_of(f.read())
    print(summary(header, rows, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
