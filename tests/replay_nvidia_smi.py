#!/usr/bin/env python3
"""A test STAND-IN for nvidia-smi that replays a real GPU host's captures (tests/fixtures/nvidia/<run>/):
`--query-gpu=<fields> --format=csv[,noheader][,nounits]` answers from the run's `query-gpu-header.csv` (the
columns asked for, in the order asked, as the real tool prints them); `--query-compute-apps=...` from
`query-compute-apps.csv` (no process when the run has none). The folder is DFLASH_REPLAY_CAPTURES. Used to run
playbooks/gpu_host_check.yml on localhost as if on that host; never installed anywhere."""

from __future__ import annotations

import csv
import os
import re
import sys
from pathlib import Path

UNIT = re.compile(r"\s*\[[^\]]*\]$")  # the header's " [MiB]"


def table(path: Path) -> tuple[list[str], list[list[str]]]:
    """A capture with a header: field names (units stripped) and rows (values as printed, units kept)."""
    rows = [[cell.strip() for cell in row] for row in csv.reader(path.read_text().splitlines()) if row]
    return [UNIT.sub("", name) for name in rows[0]], rows[1:]


def answer(captures: Path, kind: str, fields: list[str], header: bool, units: bool) -> int:
    source = captures / ("query-gpu-header.csv" if kind == "gpu" else "query-compute-apps.csv")
    if not source.is_file():
        return 0  # no capture of this kind: nothing runs (the real tool prints nothing)
    names, rows = table(source)
    missing = [f for f in fields if f not in names]
    if missing:
        print(f'Field "{missing[0]}" is not a valid field to query.', file=sys.stdout)
        return 2
    header_line = source.read_text().splitlines()[0].split(", ")
    if header:
        print(", ".join(header_line[names.index(f)] for f in fields))
    for row in rows:
        cells = [row[names.index(f)] for f in fields]
        print(", ".join(cells if units else [re.sub(r" (MiB|W|%)$", "", c) for c in cells]))
    return 0


def main(argv: list[str]) -> int:
    captures = Path(os.environ["DFLASH_REPLAY_CAPTURES"])
    query = next((a for a in argv if a.startswith(("--query-gpu=", "--query-compute-apps="))), None)
    fmt = next((a.split("=", 1)[1] for a in argv if a.startswith("--format=")), "csv").split(",")
    if query is None:
        print("replay_nvidia_smi: only --query-gpu and --query-compute-apps are replayed", file=sys.stderr)
        return 2
    kind = "gpu" if query.startswith("--query-gpu=") else "apps"
    return answer(captures, kind, query.split("=", 1)[1].split(","), "noheader" not in fmt, "nounits" not in fmt)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
