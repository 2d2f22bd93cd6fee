"""playbooks/align_driver.yml against the lab: ct129 boots in the incident state (kernel module 580.126.09,
user space 580.159.03). Only ct129 is changed (`lab reset ct129` rebuilds it); ct200 is only probed.
The real alignment of the incident, by the whole deploy with its no-op re-run and --check, runs once, with the
Proxmox guard on, in test_proxmox_lab.py (the snapshot before the transaction, then the rollback); the role alone
in the molecule scenario nvidia_userspace_incident.

    .venv/bin/pytest -m lab tests/lab/test_driver_lab.py      # as root, lab up
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import LABCTL_PATH, REPO, LabHandle

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


def recap(stdout: str, host: str) -> dict[str, int]:
    match = re.search(rf"^{host}\s+:\s+(.*)$", stdout, re.MULTILINE)
    assert match, f"no PLAY RECAP line for {host}:\n{stdout[-3000:]}"
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", match.group(1))}


def reset_ct129() -> None:
    proc = subprocess.run([sys.executable, str(LABCTL_PATH), "reset", "ct129"], cwd=REPO, text=True,
                          capture_output=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.fixture(scope="module", autouse=True)
def ct129_back_to_the_incident() -> Iterator[None]:
    """Leave ct129 as the lab boots it (the incident state) for whatever runs next."""
    yield
    if os.geteuid() == 0 and LABCTL_PATH.exists():
        reset_ct129()


def dpkg_state(lab: LabHandle) -> str:
    proc = lab.ssh("ct129", "sha256sum /var/lib/dpkg/status; dpkg --get-selections | sha256sum; "
                            "ls -1 /etc/apt/preferences.d /etc/apt/apt.conf.d")
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_check_mode_on_the_incident_lists_the_downgrades_and_changes_nothing(lab: LabHandle) -> None:
    reset_ct129()
    before = dpkg_state(lab)
    proc, seconds = align("-l", "eval", "--check")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr
    assert "would change 13 package(s) in one apt transaction" in proc.stdout
    for name in ("libnvidia-compute-580", "nvidia-utils-580", "nvidia-kernel-common-580"):
        assert re.search(rf"{name} 580\.159\.03-0ubuntu0\.24\.04\.1 -> 580\.126\.09-0ubuntu0\.24\.04\.1\s+"
                         rf"\(downgrade", proc.stdout), name
    assert "nvidia-firmware-580-580.126.09 (not installed) -> 580.126.09-0ubuntu0.24.04.1" in proc.stdout
    assert dpkg_state(lab) == before
    smi = lab.ssh("ct129", "nvidia-smi")
    assert smi.returncode == 18 and "Driver/library version mismatch" in smi.stdout
    print(f"align_driver --check on the incident: {seconds:.1f} s")


def test_matched_host_plans_no_package_change(lab: LabHandle) -> None:
    # ct200 (595.71.05 on both sides) is only probed: --check, and the plan must say aligned.
    proc, _ = align("-l", "pro6000", "--check")
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert "ct200: aligned: user space equals the kernel module (595.71.05)" in proc.stdout
    assert "would change" not in proc.stdout

