"""Measure how long planning one host takes: in-process, through the CLI, and as an Ansible task.

Prints the figures of one run; no limits are asserted (the planner runs in every play, so it must stay cheap).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import yaml

from dflash_infra.planner import plan_dict

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def timed(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, cwd=ROOT, check=True, capture_output=True)
    return time.perf_counter() - start


def main() -> None:
    request = yaml.safe_load((ROOT / "examples" / "pro6000.yml").read_text())
    plan_dict(request, ROOT / "examples")
    runs = 200
    start = time.perf_counter()
    for _ in range(runs):
        plan_dict(request, ROOT / "examples")
    in_process = (time.perf_counter() - start) / runs
    cli = timed([str(BIN / "dflash-infra"), "plan", "examples/pro6000.yml"])
    play = timed([str(BIN / "ansible-playbook"), "playbooks/plan.yml", "-l", "pro6000",
                  "-e", "dflash_plan_offline=true"])
    print(f"plan, in process (mean of {runs}): {in_process * 1000:.2f} ms")
    print(f"dflash-infra plan (process start included): {cli * 1000:.0f} ms")
    print(f"ansible-playbook playbooks/plan.yml offline (ansible start included): {play:.2f} s")


if __name__ == "__main__":
    main()
