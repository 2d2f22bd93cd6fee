"""playbooks/align_driver.yml against the lab on a matched host: ct200 (595.71.05 on both sides) is only probed.
The incident (ct129: kernel module 580.126.09, user space 580.159.03) is listed by align_driver.yml --check and
aligned once, by the whole deploy with its no-op re-run and --check, with the Proxmox guard on, in
test_proxmox_lab.py (the snapshot before the transaction, then the rollback).

    .venv/bin/pytest -m lab tests/lab/test_driver_lab.py      # as root, lab up
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, LabHandle

pytestmark = pytest.mark.lab

BIN = Path(sys.executable).parent


def ansible_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0",
               PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}")
    return env


def align(*args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run playbooks/align_driver.yml against the lab inventory; returns the process and its duration."""
    started = time.monotonic()
    proc = subprocess.run([str(BIN / "ansible-playbook"), "playbooks/align_driver.yml", "-i", "inventory/lab",
                           *args], cwd=REPO, env=ansible_env(), capture_output=True, text=True)
    return proc, time.monotonic() - started


def test_matched_host_plans_no_package_change(lab: LabHandle) -> None:
    # ct200 (595.71.05 on both sides) is only probed: --check, and the plan must say aligned.
    proc, _ = align("-l", "pro6000", "--check")
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert "ct200: aligned: user space equals the kernel module (595.71.05)" in proc.stdout
    assert "would change" not in proc.stdout

