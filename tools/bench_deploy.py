"""Benchmark of deploy_dflash.yml on the lab (not a test): figures of one run, no limits asserted.

Prints the wall time of a full deploy on a freshly reset lab, of a no-op re-run, of a bare fact-gathering play
on the same host, of the --check run on the converged lab, and the ratio no-op / bare.
"""

from __future__ import annotations

import os
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


def timed(argv: list[str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run(argv, cwd=REPO, env=ENV, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr[-2000:]}")
    return elapsed


def deploy(*extra: str) -> list[str]:
    return [str(BIN / "ansible-playbook"), "deploy_dflash.yml", "-i", "inventory/lab", "-l", "pro6000", *extra]


def main() -> None:
    timed([sys.executable, "lab/labctl.py", "up"])
    timed([sys.executable, "lab/labctl.py", "reset", "ct200", "ct129"])
    full = timed(deploy())
    noop = timed(deploy())
    check = timed(deploy("--check", "--diff"))
    with tempfile.NamedTemporaryFile("w", suffix=".yml", dir=REPO / "playbooks", delete=False) as play:
        play.write(BARE_PLAY)
    try:
        bare = timed([str(BIN / "ansible-playbook"), play.name, "-i", "inventory/lab"])
    finally:
        os.unlink(play.name)
    print(f"full deploy on a fresh lab:        {full:6.1f} s")
    print(f"no-op re-run (changed=0):          {noop:6.1f} s")
    print(f"--check --diff on the converged lab: {check:4.1f} s")
    print(f"bare fact-gathering play:          {bare:6.1f} s")
    print(f"ratio no-op / bare:                {noop / bare:6.1f}")


if __name__ == "__main__":
    main()
