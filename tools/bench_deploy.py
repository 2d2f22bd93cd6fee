"""Benchmark of deploy_dflash.yml on the lab (not a test): figures of one run, no limits asserted.

In one run, on the same host (ct200): a full deploy on a freshly reset lab, the no-op re-run, --check on the
converged lab, and a bare fact-gathering play (the floor any play pays: start-up, one SSH connection, one
module); then the ratios no-op / bare and --check / bare, and how many tasks each run went through.
The no-op run, the --check run and the bare play alternate five times; the medians are printed.
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
ENV = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
           PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
BARE_PLAY = """- name: Gather facts only
  hosts: pro6000
  gather_facts: true
  tasks: []
"""
RECAP = re.compile(r"ct200\s*: ok=(\d+)\s+changed=(\d+)\s+unreachable=\d+\s+failed=\d+\s+skipped=(\d+)")


ROUNDS = 5


def timed(argv: list[str]) -> tuple[float, str]:
    """Wall time and stdout of a command that must succeed."""
    start = time.perf_counter()
    proc = subprocess.run(argv, cwd=REPO, env=ENV, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr[-2000:]}")
    return elapsed, proc.stdout


def tasks(out: str) -> str:
    """'N tasks (ok, skipped), changed C' from a play recap."""
    match = RECAP.search(out)
    if not match:
        return "recap not found"
    ok, changed, skipped = (int(g) for g in match.groups())
    return f"{ok + skipped} tasks ({ok} ok, {skipped} skipped), changed={changed}"


def deploy(*extra: str) -> list[str]:
    return [str(BIN / "ansible-playbook"), "deploy_dflash.yml", "-i", "inventory/lab", "-l", "pro6000", *extra]


def main() -> None:
    timed([sys.executable, "lab/labctl.py", "up"])
    timed([sys.executable, "lab/labctl.py", "reset", "ct200", "ct129"])
    full, full_out = timed(deploy())
    with tempfile.NamedTemporaryFile("w", suffix=".yml", dir=REPO / "playbooks", delete=False) as play:
        play.write(BARE_PLAY)
    noops: list[float] = []
    checks: list[float] = []
    bares: list[float] = []
    try:
        # Interleaved, so that a slow spell of the machine weighs on all three alike.
        for _ in range(ROUNDS):
            seconds, noop_out = timed(deploy())
            noops.append(seconds)
            seconds, check_out = timed(deploy("--check", "--diff"))
            checks.append(seconds)
            bares.append(timed([str(BIN / "ansible-playbook"), play.name, "-i", "inventory/lab"])[0])
    finally:
        os.unlink(play.name)
    noop, check, bare = (statistics.median(x) for x in (noops, checks, bares))
    print(f"full deploy on a fresh lab:           {full:6.1f} s  {tasks(full_out)}")
    print(f"no-op re-run (median of {ROUNDS}):           {noop:6.1f} s  {tasks(noop_out)}")
    print(f"--check --diff, converged (median):   {check:6.1f} s  {tasks(check_out)}")
    print(f"bare fact-gathering play (median):    {bare:6.1f} s")
    print(f"ratio no-op / bare:                   {noop / bare:6.2f}")
    print(f"ratio --check / bare:                 {check / bare:6.2f}")


if __name__ == "__main__":
    main()
